"""Running AgentJobs on a real runner program against the real API server.

:class:`ExecutionRig` plays the operator's part with the admin client, exactly in the API's
shapes: it creates the runner's sessions Secret, the Role of ``docs/execution.md`` (through
:class:`RunnerRig`) and its admission policy (bound to the test namespace), and for each job
writes ``status.profile`` (the revision and the EffectiveProfile snapshot from
``decide_profile``) and ``status.assignment`` with ``Routed=True`` -- the routing decision the
runner watches for. The runner is ``python -m helmhive runner run`` with a pod-bound token and
the reference agent as its ACP agent.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from harness import wait_for
from harness.kube import IdentityFactory, Kube
from helmhive.api.common import JobKind
from helmhive.api.job import ProfileBinding
from helmhive.api.profile import ProfileSpec
from helmhive.policy.envelopes import ENVELOPES
from helmhive.policy.profiles.narrowing import decide_profile
from helmhive.policy.sessions.continuity import sessions_secret_name

from .agent_harness import MethodLog
from .execution_rbac import execution_admission_policy
from .program_harness import GROUP, VERSION, RunnerProc, RunnerRig, reference_runner_json

JOBS = "agentjobs"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


@dataclass
class Runner:
    """A started runner program and its reference agent's state."""

    rig: RunnerRig
    proc: RunnerProc
    runner_json: dict[str, Any]

    @property
    def name(self) -> str:
        return self.rig.name

    @property
    def agent_state(self) -> Path:
        return self.rig.agent_state

    def methods(self) -> MethodLog:
        return MethodLog(self.agent_state)

    def prompts(self) -> list[dict[str, Any]]:
        path = self.agent_state / "prompts.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class ExecutionRig:
    kube: Kube
    namespace: str
    identities: IdentityFactory
    root: Path
    runners: list[Runner] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)

    # -- the operator's part ----------------------------------------------------------------
    def install_admission_policy(self) -> str:
        admission = client.AdmissionregistrationV1Api(self.kube.api_client)
        name = f"helmhive-runner-execution-{self.namespace}"[:253]
        policy, binding = execution_admission_policy(name=name, namespace=self.namespace)
        admission.create_validating_admission_policy(policy)
        self.policies.append(name)
        admission.create_validating_admission_policy_binding(binding)
        return name

    def sessions_secret(self, runner: str) -> None:
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=sessions_secret_name(runner), labels={"helmhive.dev/runner": runner}),
            type="Opaque",
        )
        with contextlib.suppress(ApiException):
            self.kube.core.create_namespaced_secret(self.namespace, body)

    def start_runner(
        self,
        *,
        index: int = 0,
        mode: str = "",
        env: dict[str, str] | None = None,
        concurrency: int = 1,
        secret: bool = True,
        runner_env: dict[str, str] | None = None,
        runner_json_extra: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
    ) -> Runner:
        rig = RunnerRig(
            kube=self.kube,
            namespace=self.namespace,
            identities=self.identities,
            root=self.root / f"runner-{index}",
            index=index,
        )
        if secret:
            self.sessions_secret(rig.name)
        runner_json = reference_runner_json(mode=mode, agent_state=rig.agent_state, concurrency=concurrency)
        runner_json["adapter"]["acp"]["env"] += [{"name": k, "value": v} for k, v in (env or {}).items()]
        runner_json["sandbox"] = {"writePaths": [str(rig.agent_state)]}
        runner_json.update(runner_json_extra or {})  # e.g. a pool's compaction settings
        runner_json.update(config or {})  # more pool settings (credentialIsolation, egress...)
        proc = rig.start(runner_json, extra_env=runner_env)
        rig.wait_registered(proc)
        runner = Runner(rig=rig, proc=proc, runner_json=runner_json)
        self.runners.append(runner)
        return runner

    def create_job(
        self,
        name: str,
        *,
        runner: Runner | str,
        kind: JobKind = JobKind.CONNECTION_TEST,
        prompt: str = "Say hello.",
        profile: str = "probe",
        profile_spec: dict[str, Any] | None = None,
        memory_ids: list[str] | None = None,
        timeout: int = 120,
        service: str | None = None,
        workspace: str = "payments",
        spec_extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create a job and route it to ``runner`` (a runner of pool ``pool-a``) as the operator would:
        the profile binding, then the assignment."""
        runner_name = runner if isinstance(runner, str) else runner.name
        spec: dict[str, Any] = {
            "workspace": workspace,
            "jobKind": kind.value,
            "profile": profile,
            "request": {"title": f"test {name}", "prompt": prompt},
            "timeoutSeconds": timeout,
        }
        if service:
            spec["service"] = service
        spec.update(spec_extra or {})  # governed jobs: source, change, checks, patch
        self.kube.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            JOBS,
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "metadata": {"name": name}, "spec": spec},
        )
        wanted = {
            "envelope": kind.value,
            "purpose": f"test profile for {kind.value}",
            "instructions": "You are tested by helmhive.",
            "providerMappings": [{"provider": "reference"}],
            **(profile_spec or {}),
        }
        verdict = decide_profile(profile=ProfileSpec.model_validate(wanted), envelope=ENVELOPES[kind])
        assert verdict.effective is not None, verdict.violations
        binding = ProfileBinding(
            name=profile,
            revision=f"{profile}-r1",
            hash="sha256:" + "0" * 64,
            snapshot=verdict.effective,
            bound_at=dt.datetime.now(dt.UTC),
        )
        status = {
            "profile": binding.to_wire(),
            "assignment": {
                "runner": runner_name,
                "pool": "pool-a",
                "runnerNamespace": self.namespace,
                "provider": "reference",
                "model": "reference-small",
                "modelSource": "mapping",
                "mappingIndex": 0,
                "memoryIds": memory_ids or [],
                "credentialGeneration": 1,
                "assignedAt": _now(),
            },
            "conditions": [
                {"type": t, "status": s, "reason": "Assigned", "message": "test routing", "lastTransitionTime": _now()}
                for t, s in (("Routed", "True"), ("Ready", "Unknown"))
            ],
        }
        return self.patch_status(name, status)

    def patch_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.kube.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, JOBS, name, {"status": status}
        )
        return result

    # -- reading ----------------------------------------------------------------------------
    def job(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.kube.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, JOBS, name)
        return obj

    def wait_finished(self, name: str, timeout: float = 90) -> dict[str, Any]:
        def finished() -> dict[str, Any]:
            job = self.job(name)
            succeeded = condition(job, "Succeeded")
            assert succeeded is not None and succeeded["status"] in ("True", "False"), job.get("status")
            return job

        return wait_for(finished, timeout=timeout, describe=f"job {name} to finish")

    def wait_running(self, name: str, timeout: float = 60) -> dict[str, Any]:
        def running() -> dict[str, Any]:
            job = self.job(name)
            cond = condition(job, "Running")
            assert cond is not None and cond["status"] == "True", job.get("status")
            return job

        return wait_for(running, timeout=timeout, describe=f"job {name} to be Running")

    def events(self, name: str) -> list[client.CoreV1Event]:
        """The job's Events as they are now. To check for one, use :meth:`wait_events`."""
        items: list[client.CoreV1Event] = self.kube.core.list_namespaced_event(self.namespace).items
        return [e for e in items if e.involved_object.kind == "AgentJob" and e.involved_object.name == name]

    def wait_events(self, name: str, reason: str, timeout: float = 60) -> list[client.CoreV1Event]:
        """The job's Events of ``reason``, once there is at least one.

        The runner posts an Event after the status it describes (the final Event after the final
        status), so a job read as finished may not have its Event yet: wait for it, never read once.
        """

        def posted() -> list[client.CoreV1Event]:
            events = self.events(name)
            found = [e for e in events if e.reason == reason]
            assert found, f"Events of job {name} so far: {sorted(str(e.reason) for e in events)}"
            return found

        return wait_for(posted, timeout=timeout, describe=f"a {reason} Event about job {name}")

    def binding(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "sessionbindings", name
        )
        return obj

    def sessions_data(self, runner: str) -> dict[str, str]:
        secret = self.kube.core.read_namespaced_secret(sessions_secret_name(runner), self.namespace)
        return dict(secret.data or {})

    def cleanup(self) -> None:
        for runner in self.runners:
            runner.rig.stop_all()
        admission = client.AdmissionregistrationV1Api(self.kube.api_client)
        for name in self.policies:
            with contextlib.suppress(ApiException):
                admission.delete_validating_admission_policy_binding(name)
            with contextlib.suppress(ApiException):
                admission.delete_validating_admission_policy(name)

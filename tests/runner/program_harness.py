"""Run the runner program the way a runner pod runs it, against the real test API server.

:class:`RunnerRig` sets up what the operator would for pool ``P`` in a namespace -- the
ServiceAccount, Role and RoleBinding ``helmhive-runner-P`` exactly as ``docs/runners.md`` lists
them, a Pod object ``P-0`` (it stays Pending: there is no kubelet), a token bound to that Pod,
``runner.json``, a credential and a state directory -- then starts ``python -m helmhive runner
run`` with the pod's environment and collects its JSON log lines from stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from harness import wait_for
from harness.kube import IdentityFactory, Kube
from helmhive.reference_agent.session import ENV_STATE_DIR

from .agent_harness import REFERENCE_AGENT
from .execution_rbac import as_policy_rules, execution_role_rules

GROUP, VERSION = "helmhive.dev", "v1alpha1"
CANARY = "hh-canary-7f3c9a1e5b2d4c68-sk-do-not-leak"

RUNNER_RULES = [
    client.V1PolicyRule(api_groups=[GROUP], resources=["runners"], verbs=["get", "list", "watch", "create"]),
    client.V1PolicyRule(api_groups=[GROUP], resources=["runners/status"], verbs=["get", "patch", "update"]),
    client.V1PolicyRule(
        api_groups=["coordination.k8s.io"], resources=["leases"], verbs=["get", "create", "update", "patch", "delete"]
    ),
    client.V1PolicyRule(api_groups=[""], resources=["events"], verbs=["create"]),
]


def reference_runner_json(
    *,
    mode: str = "",
    agent_state: Path | None = None,
    renew: int = 1,
    lease: int = 5,
    refresh: int = 30,
    concurrency: int = 1,
) -> dict[str, Any]:
    """runner.json for a pool whose adapter is the reference agent over ACP."""
    env = [{"name": ENV_STATE_DIR, "value": str(agent_state)}] if agent_state else []
    if mode:
        env.append({"name": "HELMHIVE_REFERENCE_AGENT_MODE", "value": mode})
    return {
        "provider": "reference",
        "adapter": {"type": "acp", "acp": {"command": str(REFERENCE_AGENT), "env": env}},
        "placementLabels": {"zone": "test-a", "domain": "code"},
        "capabilities": ["structured-output", "diff-review"],
        "concurrency": concurrency,
        "heartbeat": {"leaseDurationSeconds": lease, "renewIntervalSeconds": renew, "reportRefreshSeconds": refresh},
        "credentialEnvName": "HELMHIVE_REFERENCE_AGENT_TOKEN",
    }


@dataclass
class RunnerProc:
    """One running runner program and its log."""

    popen: subprocess.Popen[bytes]
    log_path: Path

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(raw)
                if isinstance(doc, dict):
                    out.append(doc)
        return out

    def raw_log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return f"(no log: {self.log_path} is gone)"

    def messages(self, message: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("message") == message]

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"runner did not exit within {timeout}s; log:\n{self.raw_log()[-4000:]}") from exc

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)


@dataclass
class RunnerRig:
    """A pool's runner identity and files in one namespace; starts runner processes."""

    kube: Kube
    namespace: str
    identities: IdentityFactory
    root: Path
    pool: str = "pool-a"
    index: int = 0
    procs: list[RunnerProc] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.pool}-{self.index}"

    @property
    def service_account(self) -> str:
        return f"helmhive-runner-{self.pool}"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def agent_state(self) -> Path:
        path = self.root / "agent-state"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def ensure_rbac(self) -> None:
        """ServiceAccount, Role and RoleBinding ``helmhive-runner-<pool>``: the contract's rules plus
        the execution rules of ``docs/execution.md`` (a runner pod now watches its assigned jobs)."""
        name = self.service_account
        rules = RUNNER_RULES + as_policy_rules(execution_role_rules(self.pool))
        with contextlib.suppress(ApiException):
            self.kube.core.create_namespaced_service_account(
                self.namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
            )
        with contextlib.suppress(ApiException):
            self.kube.rbac.create_namespaced_role(
                self.namespace, client.V1Role(metadata=client.V1ObjectMeta(name=name), rules=rules)
            )
        with contextlib.suppress(ApiException):
            self.kube.rbac.create_namespaced_role_binding(
                self.namespace,
                client.V1RoleBinding(
                    metadata=client.V1ObjectMeta(name=name),
                    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
                    subjects=[client.RbacV1Subject(kind="ServiceAccount", name=name, namespace=self.namespace)],
                ),
            )

    def ensure_pod(self) -> client.V1Pod:
        """The runner's Pod object (Pending forever without a kubelet), for the bound token."""
        try:
            return self.kube.core.read_namespaced_pod(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=self.name, labels={"helmhive.dev/pool": self.pool}),
            spec=client.V1PodSpec(
                service_account_name=self.service_account,
                automount_service_account_token=False,
                containers=[client.V1Container(name="runner", image="helmhive/runner:test")],
            ),
        )
        return self.kube.core.create_namespaced_pod(self.namespace, pod)

    def write_files(self, runner_json: dict[str, Any], *, credential: str | None = CANARY) -> dict[str, str]:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "runner.json"
        config.write_text(json.dumps(runner_json), encoding="utf-8")
        env = {"HELMHIVE_RUNNER_CONFIG": str(config)}
        if credential is not None:
            secret = self.root / "secret" / "credential"
            secret.parent.mkdir(parents=True, exist_ok=True)
            secret.write_text(credential, encoding="utf-8")
            env["HELMHIVE_CREDENTIAL_FILE"] = str(secret)
        return env

    def start(
        self,
        runner_json: dict[str, Any],
        *,
        credential: str | None = CANARY,
        credential_dir: Path | None = None,
        generation: int = 1,
        extra_env: dict[str, str] | None = None,
    ) -> RunnerProc:
        env = self.environ(
            runner_json,
            credential=credential,
            credential_dir=credential_dir,
            generation=generation,
            extra_env=extra_env,
        )
        log_path = self.root / f"runner-{len(self.procs)}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "helmhive", "runner", "run"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
            )
        proc = RunnerProc(popen=popen, log_path=log_path)
        self.procs.append(proc)
        return proc

    def environ(
        self,
        runner_json: dict[str, Any],
        *,
        credential: str | None = CANARY,
        credential_dir: Path | None = None,
        generation: int = 1,
        extra_env: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """The pod's environment (and files) for a runner of this rig, with a Pod-bound token."""
        self.ensure_rbac()
        pod = self.ensure_pod()
        identity = self.identities(self.namespace, self.service_account, bound_pod=pod, create=False)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root / "home"),
            "HELMHIVE_RUNNER_NAME": self.name,
            "HELMHIVE_NAMESPACE": self.namespace,
            "HELMHIVE_POOL": self.pool,
            "HELMHIVE_CREDENTIAL_GENERATION": str(generation),
            "HELMHIVE_STATE_DIR": str(self.state_dir),
            "HELMHIVE_RUNNER_IMAGE": "helmhive/runner:test",
            "HELMHIVE_PROBE_INTERVAL_SECONDS": "2",
            "HELMHIVE_SHUTDOWN_GRACE_SECONDS": "5",
            "KUBECONFIG": str(identity.kubeconfig),
        }
        env.update(self.write_files(runner_json, credential=None if credential_dir else credential))
        if credential_dir is not None:
            env["HELMHIVE_CREDENTIAL_DIR"] = str(credential_dir)
        env.update(extra_env or {})
        return env

    # -- reading the cluster as admin ------------------------------------------------------
    def runner(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "runners", self.name
        )
        return obj

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = (self.runner().get("status") or {}).get("report") or {}
        return report

    def lease(self) -> client.V1Lease:
        return client.CoordinationV1Api(self.kube.api_client).read_namespaced_lease(self.name, self.namespace)

    def lease_exists(self) -> bool:
        try:
            self.lease()
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def derived(self, *, auth_max_age_seconds: int = 3600, generation: int = 1) -> Any:
        """What the operator derives from this Runner and its Lease as the API server stores them now.

        The operator's own pure derivation (:func:`helmhive.policy.runners.state.decide_runner_status`),
        fed exactly as its watches feed it: the parsed Runner and the Lease's spec and annotations.
        """
        import datetime as dt

        from helmhive.controller.runners.derived import build_lease_view, parse_runner_body
        from helmhive.policy.runners.state import PoolFacts, decide_runner_status

        view = parse_runner_body(self.runner())
        assert view is not None
        lease = self.lease().to_dict()
        spec = {
            "holderIdentity": lease["spec"]["holder_identity"],
            "leaseDurationSeconds": lease["spec"]["lease_duration_seconds"],
        }
        spec["renewTime"] = lease["spec"]["renew_time"].isoformat() if lease["spec"]["renew_time"] else None
        return decide_runner_status(
            name=self.name,
            spec=view.spec,
            report=view.status.report,
            pool=PoolFacts(credential_generation=generation, auth_max_age=dt.timedelta(seconds=auth_max_age_seconds)),
            lease=build_lease_view(spec, lease["metadata"].get("annotations") or {}),
            now=dt.datetime.now(dt.UTC),
            grace=dt.timedelta(seconds=2),
        )

    def set_control_state(self, state: str) -> None:
        self.kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "runners", self.name, {"spec": {"controlState": state}}
        )

    def wait_registered(self, proc: RunnerProc, timeout: float = 60) -> dict[str, Any]:
        def registered() -> dict[str, Any]:
            assert proc.popen.poll() is None, f"runner exited {proc.popen.returncode}:\n{proc.raw_log()[-3000:]}"
            report = self.report()
            assert report.get("registeredAt"), "no report yet"
            return report

        return wait_for(registered, timeout=timeout, describe=f"runner {self.name} to register and report")

    def events(self) -> list[client.CoreV1Event]:
        """The namespace's Events as they are now. To check for one, use :meth:`wait_events`."""
        items: list[client.CoreV1Event] = self.kube.core.list_namespaced_event(self.namespace).items
        return items

    def wait_events(self, *reasons: str, timeout: float = 60) -> dict[str, client.CoreV1Event]:
        """One Event of each of ``reasons`` about this rig's Runner, once all of them are there.

        The runner posts an Event after the write it describes (``Registered`` after the report,
        ``Control<State>`` after it logged the change), so wait for it; never read once.
        """

        def posted() -> dict[str, client.CoreV1Event]:
            mine = {str(e.reason): e for e in self.events() if e.involved_object.name == self.name}
            assert set(reasons) <= set(mine), f"Events about {self.name} so far: {sorted(mine)}"
            return {reason: mine[reason] for reason in reasons}

        return wait_for(posted, timeout=timeout, describe=f"Events {', '.join(reasons)} about runner {self.name}")

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except AssertionError:
                proc.kill()

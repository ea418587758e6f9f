"""AgentJobs run by a JobPod runner against the real API server: :class:`JobExecution`'s JobPod path whole.

The runner's side is :class:`~helmhive.runner.jobs.execution.JobExecution` with a JobPod
:class:`~helmhive.runner.jobs.writes.ExecutionContext`, in this process: it marks the job Running,
claims a warm pod or creates one on the API server, posts the Event that names it, waits for it
through a watch, drives it over the link (the reference agent through ``helmhive-jobpod attach``),
ends the job and deletes the pod. There is no kubelet, so the test plays its part: it starts the
pod's shim and launcher as local processes named as the pod (the rig of :mod:`.test_jobpod_link`,
on loopback) and writes the pod's status (Running, 127.0.0.1, the shim started), as the kubelet
would once the pod runs. The operator's part (the job's profile and assignment) is
:class:`~tests.runner.execution_harness.ExecutionRig`'s.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import secrets
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from harness.kube import IdentityFactory, Kube
from harness.wait import wait_for
from helmhive.api.jobpod import LABEL_JOB, LABEL_RUNNER, LABEL_WARM, SHIM_CONTAINER
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.policy.jobpods.identity import build_job_pod_selector
from helmhive.policy.jobpods.pod import build_job_pod
from helmhive.policy.runners.pool import PoolRef
from helmhive.reference_agent.session import ENV_STATE_DIR
from helmhive.runner.adapters import TurnResult
from helmhive.runner.config import RunnerConfig, load_config
from helmhive.runner.credentials import CredentialHolder
from helmhive.runner.egress.limits import RequestLimits
from helmhive.runner.egress.proxy import EgressProxy
from helmhive.runner.jobs.agents import build_job_adapter, build_pod_job_adapter
from helmhive.runner.jobs.execution import ExecutionContext, JobExecution
from helmhive.runner.jobs.jobpod import JobPodSettings
from helmhive.runner.kube import RunnerKube
from helmhive.runner.metrics import REGISTRY
from helmhive.runner.sandbox.landlock import landlock_abi
from helmhive.runner.sandbox.limits import LimitSupport
from helmhive.runner.sessions.bindings import SessionStore

from .agent_harness import REFERENCE_AGENT, MethodLog
from .execution_harness import ExecutionRig, condition
from .test_jobpod_link import JOBPOD, JobPod, eventually, free_port, group_alive

RUNNER = "pool-a-0"
POOL = "pool-a"
POOL_SPEC: dict[str, Any] = {
    "provider": "reference",
    "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
    "image": "ghcr.io/helmhive/runner:test",
    "credential": {"secretRef": {"name": "pool-a-credential", "key": "api-key"}, "envName": "PROVIDER_API_KEY"},
    "credentialIsolation": "Proxy",
    "egress": {"upstream": "https://127.0.0.1:9"},
    "execution": {"mode": "JobPod"},
}
LIMITS = RequestLimits(requests_per_minute=600, burst=60, max_concurrent=8)


@dataclass
class PodRig:
    """A JobPod runner in this process, and the test's stand-ins for the operator and the kubelet."""

    kube: Kube
    namespace: str
    operator: ExecutionRig
    ctx: ExecutionContext
    key: bytes
    root: Path
    agent_state: Path
    link_port: int
    relay_port: int
    template: dict[str, Any]

    def pods(self, **labels: str) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in {**build_job_pod_selector(POOL), **labels}.items())
        items = self.kube.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return [self.kube.api_client.sanitize_for_serialization(p) for p in items]

    def start_pod(self, name: str) -> JobPod:
        """The kubelet's part: the pod's containers (local processes), then its status."""
        pod = JobPod(root=self.root, key=self.key, port=self.link_port, egress_port=self.relay_port, pod=name)
        pod.start()
        running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        status = {
            "phase": "Running",
            "startTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "containerStatuses": [
                {
                    "name": c,
                    "image": POOL_SPEC["image"],
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": running,
                }
                for c in (SHIM_CONTAINER, "agent")
            ],
        }
        self.kube.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})
        return pod

    def warm_pod(self) -> str:
        created = self.kube.core.create_namespaced_pod(self.namespace, json.loads(json.dumps(self.template)))
        return str(created.metadata.name)

    def gone(self, name: str) -> bool:
        try:
            self.kube.core.read_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    def events(self, job: str, reason: str) -> list[str]:
        return [e.message for e in self.operator.events(job) if e.reason == reason]

    async def run(self, name: str, uid: str) -> TurnResult:
        execution = JobExecution(ctx=self.ctx, name=name, uid=uid)
        return await execution.run(None, asyncio.Event())  # type: ignore[arg-type]  # the slot's adapter: unused


def _config(tmp: Path, *, template: dict[str, Any], agent_state: Path, key_file: Path, namespace: str) -> RunnerConfig:
    credential = tmp / "credential"
    credential.write_text("unused-by-the-reference-agent", encoding="utf-8")
    runner_json = {
        "provider": "reference",
        "adapter": {
            "type": "acp",
            "acp": {"command": str(REFERENCE_AGENT), "env": [{"name": ENV_STATE_DIR, "value": str(agent_state)}]},
        },
        "credentialIsolation": "Proxy",
        "egress": {"upstream": "https://127.0.0.1:9"},
        "execution": {"mode": "JobPod"},
        "jobPodTemplate": template,
    }
    environ = {
        "HELMHIVE_RUNNER_NAME": RUNNER,
        "HELMHIVE_NAMESPACE": namespace,
        "HELMHIVE_POOL": POOL,
        "HELMHIVE_RUNNER_CONFIG": "/etc/helmhive/runner.json",
        "HELMHIVE_CREDENTIAL_FILE": str(credential),
        "HELMHIVE_STATE_DIR": str(tmp / "state"),
        "HELMHIVE_POD_IP": "127.0.0.1",
        "HELMHIVE_JOBPOD_LINK_KEY_FILE": str(key_file),
    }
    return load_config(environ=environ, read_text=lambda _: json.dumps(runner_json))


@pytest.fixture
async def pod_rig(
    kube: Kube, namespace: str, crds: list[str], service_account_identity: IdentityFactory, tmp_path: Path
) -> AsyncIterator[PodRig]:
    operator = ExecutionRig(kube=kube, namespace=namespace, identities=service_account_identity, root=tmp_path / "op")
    operator.sessions_secret(RUNNER)
    pool = PoolRef(name=POOL, namespace=namespace, uid="0b9e6a4e-0000-4000-8000-00000000000a")
    template = json.loads(
        json.dumps(
            build_job_pod(
                pool=pool,
                pool_spec=RunnerPoolSpec.model_validate(POOL_SPEC),
                namespace=namespace,
                job=None,
                runner=None,
                timeout_seconds=None,
            )
        )
    )
    template["metadata"]["ownerReferences"] = []  # no RunnerPool here: the garbage collector would take the pod
    key = secrets.token_bytes(32)
    key_file = tmp_path / "link-key"
    key_file.write_bytes(key)
    agent_state = tmp_path / "agent-state"
    agent_state.mkdir()
    config = _config(tmp_path, template=template, agent_state=agent_state, key_file=key_file, namespace=namespace)
    credential = CredentialHolder(file=config.env.credential_file, directory=None, state_dir=config.env.state_dir)
    credential.prepare()
    proxy = EgressProxy(upstream=None, credential=lambda: credential.value, runner=RUNNER, limits=LIMITS)
    credential.proxy_port = (await proxy.start()).port
    relay_port = free_port()
    listener = await proxy.start_pod_listener(host="127.0.0.1", port=0, relay_port=relay_port)
    link_port = free_port()
    settings = JobPodSettings(
        key_file=key_file,
        egress_target=f"127.0.0.1:{listener.port}",
        limits=LIMITS,
        command=str(JOBPOD),
        link_port=link_port,
        relay_port=relay_port,
        job_root=str(tmp_path / "pod" / "job"),  # the one local pod's (JobPod.job_root)
    )
    runner_kube = RunnerKube(kube.api_client, namespace=namespace)
    ctx = ExecutionContext(
        kube=runner_kube,
        config=config,
        now=lambda: dt.datetime.now(dt.UTC),
        job_adapter=lambda plan: build_job_adapter(config, credential, plan),
        sessions=SessionStore(kube=runner_kube, runner=RUNNER),
        landlock_abi=landlock_abi(),
        limit_support=LimitSupport(uid=os.getuid(), user_namespaces=False),
        egress_port=credential.proxy_port,
        egress=proxy,
        job_pods=settings,
        pod_adapter=lambda agent: build_pod_job_adapter(config, credential, agent),
    )
    rig = PodRig(
        kube=kube,
        namespace=namespace,
        operator=operator,
        ctx=ctx,
        key=key,
        root=tmp_path / "pod",
        agent_state=agent_state,
        link_port=link_port,
        relay_port=relay_port,
        template=template,
    )
    try:
        yield rig
    finally:
        await proxy.close()


async def _run_with_pod(rig: PodRig, job: str, uid: str, *, warm: str | None = None) -> tuple[TurnResult, JobPod, str]:
    """Run the job; start its pod once the runner has one (a warm one started before: ``warm``)."""
    started: dict[str, JobPod] = {}
    if warm is not None:
        started[warm] = await asyncio.to_thread(rig.start_pod, warm)
    running = asyncio.create_task(rig.run(job, uid))
    try:
        if warm is None:

            def created() -> str:
                pods = rig.pods(**{LABEL_JOB: job})
                assert pods, "no pod yet"
                return str(pods[0]["metadata"]["name"])

            name = await asyncio.to_thread(wait_for, created, timeout=60, describe=f"the runner to create {job}'s pod")
            started[name] = await asyncio.to_thread(rig.start_pod, name)
        (name, pod), *_ = started.items()
        result = await asyncio.wait_for(running, 240)
    finally:
        if not running.done():
            running.cancel()
    return result, pod, name


@pytest.mark.parametrize("warm", [False, True], ids=["created", "claimed"])
async def test_a_job_runs_in_a_pod_of_its_own_which_is_deleted_after(pod_rig: PodRig, warm: bool) -> None:
    warm_name = pod_rig.warm_pod() if warm else None
    started = {"provider": "reference", "adapter": "acp", "start": "warm" if warm else "cold"}
    before = REGISTRY.get_sample_value("helmhive_runner_job_queue_to_agent_start_seconds_count", started) or 0.0
    job = pod_rig.operator.create_job("hello", runner=RUNNER, prompt="Say hello.\nWRITE-FILE: hello.txt")
    result, pod, name = await _run_with_pod(pod_rig, "hello", job["metadata"]["uid"], warm=warm_name)
    try:
        assert result.ok, result.message
        # The queue-to-agent-start metric observed the job once, as warm or cold.
        after = REGISTRY.get_sample_value("helmhive_runner_job_queue_to_agent_start_seconds_count", started)
        assert after == before + 1
        assert name == warm_name if warm else name != warm_name
        done = pod_rig.operator.job("hello")
        assert condition(done, "Succeeded")["status"] == "True", done["status"]  # type: ignore[index]
        running = condition(done, "Running")
        assert running is not None
        reason = "JobPodClaimed" if warm else "JobPodCreated"
        messages = await asyncio.to_thread(lambda: pod_rig.operator.wait_events("hello", reason))
        assert name in messages[0].message and RUNNER in messages[0].message  # kubectl describe names the pod
        assert "file hello.txt: written" in done["status"]["result"]["summary"]
        # kubectl describe agentjob shows the pod after it is gone, in the job's result.
        assert done["status"]["result"]["jobPod"] == {"name": name, "warm": warm}
        await asyncio.to_thread(wait_for, lambda: pod_rig.gone(name), timeout=60, describe=f"pod {name} to be deleted")
        shim = pod.shim
        assert shim is not None
        await eventually(lambda: shim.poll() is not None, what="the shim to exit (FINISH)")
        assert shim.returncode == 0
        assert MethodLog(pod_rig.agent_state).count("initialize") == 1
    finally:
        pod.stop()


async def test_a_job_whose_pod_is_taken_away_ends_job_pod_lost(pod_rig: PodRig) -> None:
    job = pod_rig.operator.create_job("lost", runner=RUNNER, prompt="Wait.\nREFERENCE-AGENT: hang", timeout=300)
    running = asyncio.create_task(pod_rig.run("lost", job["metadata"]["uid"]))
    pod: JobPod | None = None
    try:

        def created() -> str:
            pods = pod_rig.pods(**{LABEL_JOB: "lost", LABEL_RUNNER: RUNNER})
            assert pods and LABEL_WARM not in pods[0]["metadata"]["labels"], pods
            return str(pods[0]["metadata"]["name"])

        name = await asyncio.to_thread(wait_for, created, timeout=60, describe="the runner to create the pod")
        pod = await asyncio.to_thread(pod_rig.start_pod, name)
        log = MethodLog(pod_rig.agent_state)
        await eventually(lambda: "session/prompt" in log.methods(), what="the agent to get its prompt")
        agent = log.pids()[0]
        # Its node goes: the pod is deleted, and its containers with it.
        pod_rig.kube.core.delete_namespaced_pod(name, pod_rig.namespace, grace_period_seconds=0)
        assert pod.shim is not None
        pod.shim.send_signal(signal.SIGKILL)
        result = await asyncio.wait_for(running, 120)
        assert not result.ok
        done = pod_rig.operator.job("lost")
        ended = condition(done, "Succeeded")
        # Seen by the pod's watch (being deleted, or gone) or by the link: named lost either way.
        assert ended is not None and ended["status"] == "False", done["status"]
        assert ended["reason"] in {"JobPodLost", "JobPodLost:Deleted"}, done["status"]
        await eventually(lambda: not group_alive(agent), what="the agent to die with its pod")
    finally:
        if not running.done():
            running.cancel()
        if pod is not None:
            pod.stop()


async def test_a_pod_disrupted_while_its_agent_runs_ends_the_job_at_once_with_the_cause(pod_rig: PodRig) -> None:
    # The link stays up and the agent hangs: only the watch of the pod can tell the runner.
    job = pod_rig.operator.create_job("evicted", runner=RUNNER, prompt="Wait.\nREFERENCE-AGENT: hang", timeout=300)
    running = asyncio.create_task(pod_rig.run("evicted", job["metadata"]["uid"]))
    pod: JobPod | None = None
    try:

        def created() -> str:
            pods = pod_rig.pods(**{LABEL_JOB: "evicted", LABEL_RUNNER: RUNNER})
            assert pods, "no pod yet"
            return str(pods[0]["metadata"]["name"])

        name = await asyncio.to_thread(wait_for, created, timeout=60, describe="the runner to create the pod")
        pod = await asyncio.to_thread(pod_rig.start_pod, name)
        log = MethodLog(pod_rig.agent_state)
        await eventually(lambda: "session/prompt" in log.methods(), what="the agent to get its prompt")
        agent = log.pids()[0]
        # What the taint manager writes when the pod's node gets a NoExecute taint (a drain, a node gone).
        disruption = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
        }
        pod_rig.kube.core.patch_namespaced_pod_status(name, pod_rig.namespace, {"status": {"conditions": [disruption]}})
        result = await asyncio.wait_for(running, 120)  # not the job's 300 s timeout
        assert not result.ok
        done = pod_rig.operator.job("evicted")
        ended = condition(done, "Succeeded")
        assert ended is not None, done["status"]
        assert (ended["status"], ended["reason"]) == ("False", "JobPodLost:DeletionByTaintManager"), done["status"]
        assert "NoExecute" in ended["message"]
        await eventually(lambda: not group_alive(agent), what="the agent to be stopped")
        await asyncio.to_thread(wait_for, lambda: pod_rig.gone(name), timeout=60, describe=f"pod {name} deleted")
    finally:
        if not running.done():
            running.cancel()
        if pod is not None:
            pod.stop()

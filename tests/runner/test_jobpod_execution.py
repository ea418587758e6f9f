"""A job's agent in its job pod, from the pod's address on: the runner's own path, for real.

The job pod is ``helmhive-jobpod shim`` and ``helmhive-jobpod agent`` run as local processes on
loopback (the rig of :mod:`.test_jobpod_link`); the runner's side is what a JobPod runner runs once
its pod is up: :class:`~helmhive.runner.jobs.jobpod.PodRun` (the link, the trees, the checks, FINISH)
and the ACP adapter of :func:`~helmhive.runner.jobs.agents.build_pod_job_adapter` driving the
reference agent through ``helmhive-jobpod attach``, with a real egress proxy's job pods' listener in
front of the fake provider. Kubernetes is not involved here (:mod:`.test_jobpod_claims` is that part).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from helmhive.api.egress import EgressSpec, decide_allowed_paths
from helmhive.api.execution import ExecutionMode
from helmhive.api.governed import CheckOutcome, CheckSpec
from helmhive.api.jobpod import JOB_HOME, JOB_TMP, JOB_WORKSPACE, LINK_KEY_FILE, LINK_PORT, RUNNER_PROXY_PORT
from helmhive.api.reasons import Reason
from helmhive.api.runnerpool import AdapterType
from helmhive.reference_agent.session import ENV_STATE_DIR
from helmhive.runner.adapters import AcpAdapter, TurnOutcome, TurnRequest
from helmhive.runner.config import RunnerConfig, load_config
from helmhive.runner.credentials import CredentialHolder
from helmhive.runner.egress.limits import RequestLimits
from helmhive.runner.egress.proxy import EgressProxy
from helmhive.runner.jobpod.frames import LinkError
from helmhive.runner.jobs.agents import build_pod_job_adapter
from helmhive.runner.jobs.jobpod import (
    JobPodSettings,
    PodRun,
    PodTarget,
    build_attach_wrapper,
    decide_link_failure,
    jobpod_command,
)
from helmhive.runner.program.cluster_jobs import build_job_pod_settings

from .agent_harness import REFERENCE_AGENT, MethodLog
from .fake_provider import FakeProvider, fake_provider
from .test_jobpod_link import JOBPOD, JobPod, eventually, free_port, group_alive, make_job_pod

CANARY = "sk-jobpod-run-canary-7c41d9e2b0a35f68"
TOKEN_ENV = "HELMHIVE_REFERENCE_AGENT_TOKEN"
"""The reference agent's key variable (``PROVIDER-CALL`` and ``DAEMON`` send it): the pool's ``credentialEnvName``."""
GENEROUS = RequestLimits(requests_per_minute=6000, burst=1000, max_concurrent=16)
WARM_TEMPLATE = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"generateName": "pool-a-job-", "labels": {"helmhive.dev/warm": "true"}},
    "spec": {"containers": [{"name": "shim"}, {"name": "agent"}]},
}


@dataclass
class Rig:
    pod: JobPod
    provider: FakeProvider
    proxy: EgressProxy
    listener: int
    config: RunnerConfig
    credential: CredentialHolder
    runner_dir: Path
    agent_state: Path

    @property
    def target(self) -> PodTarget:
        return PodTarget(
            name=self.pod.pod,
            ip="127.0.0.1",
            link_port=self.pod.port,
            relay_port=self.pod.egress_port,
            job_root=str(self.pod.job_root),
        )

    def settings(self, **changes: object) -> JobPodSettings:
        fields: dict[str, object] = {
            "key_file": self.pod.key_file,
            "egress_target": f"127.0.0.1:{self.listener}",
            "limits": GENEROUS,
            "command": str(JOBPOD),
            "connect_window_s": 30.0,
            **changes,
        }
        return JobPodSettings(**fields)  # type: ignore[arg-type]

    def job(self, uid: str = "job-uid-1", **changes: object) -> PodRun:
        return PodRun(
            target=self.target, settings=self.settings(**changes), job="impl-1", job_uid=uid, egress=self.proxy
        )

    def dirs(self) -> tuple[Path, Path, Path]:
        """The runner's own directories of the job: its tree, the binding's HOME, its scratch."""
        workspace, home, scratch = (self.runner_dir / name for name in ("work", "home", "runner"))
        for path in (workspace, home, scratch):
            path.mkdir(parents=True, exist_ok=True)
        return workspace, home, scratch

    async def ask(self, key: str) -> httpx.Response:
        """A provider request with ``key`` as it reaches the runner from the pod's address."""
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.listener}", trust_env=False) as client:
            return await client.post("/v1/messages", headers={"x-api-key": key}, json={"stream": False})


def _runner_config(tmp_path: Path, *, upstream: str, agent_state: Path, key_file: Path) -> RunnerConfig:
    credential = tmp_path / "credential"
    credential.write_text(CANARY, encoding="utf-8")
    runner_json = {
        "provider": "anthropic",
        "adapter": {
            "type": "acp",
            "acp": {"command": str(REFERENCE_AGENT), "env": [{"name": ENV_STATE_DIR, "value": str(agent_state)}]},
        },
        "credentialEnvName": TOKEN_ENV,
        "credentialIsolation": "Proxy",
        "egress": {"upstream": upstream},
        "execution": {"mode": "JobPod"},
        "jobPodTemplate": WARM_TEMPLATE,
    }
    environ = {
        "HELMHIVE_RUNNER_NAME": "pool-a-0",
        "HELMHIVE_NAMESPACE": "team-a",
        "HELMHIVE_POOL": "pool-a",
        "HELMHIVE_RUNNER_CONFIG": "/etc/helmhive/runner.json",
        "HELMHIVE_CREDENTIAL_FILE": str(credential),
        "HELMHIVE_STATE_DIR": str(tmp_path / "state"),
        "HELMHIVE_POD_IP": "127.0.0.1",
        "HELMHIVE_JOBPOD_LINK_KEY_FILE": str(key_file),
    }
    return load_config(environ=environ, read_text=lambda _: json.dumps(runner_json))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    pods: Iterator[JobPod] = make_job_pod(tmp_path)
    pod = next(pods)
    agent_state = tmp_path / "agent-state"
    agent_state.mkdir()
    try:
        with fake_provider(tmp_path / "pki", canary=CANARY) as provider:
            config = _runner_config(tmp_path, upstream=provider.url, agent_state=agent_state, key_file=pod.key_file)
            credential = CredentialHolder(
                file=config.env.credential_file, directory=None, state_dir=config.env.state_dir
            )
            credential.prepare()
            proxy = EgressProxy(
                upstream=provider.url,
                credential=lambda: credential.value,
                ca_bundle=provider.ca_file,
                allowed_paths=decide_allowed_paths(provider="anthropic", egress=EgressSpec()),
                limits=GENEROUS,
            )
            credential.proxy_port = (await proxy.start()).port
            listener = await proxy.start_pod_listener(host="127.0.0.1", port=0, relay_port=pod.egress_port)
            try:
                yield Rig(
                    pod=pod,
                    provider=provider,
                    proxy=proxy,
                    listener=listener.port,
                    config=config,
                    credential=credential,
                    runner_dir=tmp_path / "runner-job",
                    agent_state=agent_state,
                )
            finally:
                await proxy.close()
    finally:
        pods.close()  # the shim and the launcher stopped


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _no_secret(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text, "a secret reached a log or an answer"


# -- pure ----------------------------------------------------------------------------------------


def test_the_wrapper_and_the_pods_paths_follow_the_contract(tmp_path: Path) -> None:
    target = PodTarget(name="pool-a-job-x7k2p", ip="10.0.4.7")
    assert (target.workspace, target.home, target.tmp, target.link_port) == (
        JOB_WORKSPACE,
        JOB_HOME,
        JOB_TMP,
        LINK_PORT,
    )
    settings = JobPodSettings(
        key_file=Path(LINK_KEY_FILE), egress_target=f"10.0.2.9:{RUNNER_PROXY_PORT}", limits=GENEROUS
    )
    assert build_attach_wrapper(settings=settings, target=target, job_uid="u-1") == (
        "helmhive-jobpod",
        *("attach", "--address", "10.0.4.7:7470", "--pod", "pool-a-job-x7k2p"),
        *("--key-file", "/var/run/helmhive/jobpod-link/key", "--job-uid", "u-1", "--cwd", "/job/workspace"),
        *("--egress-target", "10.0.2.9:7471", "--"),
    )
    assert PodTarget(name="p", ip="fd00::7").address == "[fd00::7]:7470"
    assert jobpod_command() == str(JOBPOD)  # the one beside the runner's interpreter, as in the image


def test_the_runners_job_pod_settings_come_from_its_config(tmp_path: Path) -> None:
    config = _runner_config(tmp_path, upstream="https://127.0.0.1:1", agent_state=tmp_path, key_file=tmp_path / "key")
    settings = build_job_pod_settings(config)
    assert settings is not None
    assert (settings.key_file, settings.egress_target) == (tmp_path / "key", f"127.0.0.1:{RUNNER_PROXY_PORT}")
    six = config.model_copy(update={"env": config.env.model_copy(update={"pod_ip": "fd00::2"})})
    assert build_job_pod_settings(six).egress_target == f"[fd00::2]:{RUNNER_PROXY_PORT}"  # type: ignore[union-attr]
    execution = config.file.execution.model_copy(update={"mode": ExecutionMode.IN_RUNNER})
    in_runner = config.model_copy(update={"file": config.file.model_copy(update={"execution": execution})})
    assert build_job_pod_settings(in_runner) is None


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("connect", "JobPodLost:Unreachable"),
        ("timeout", "JobPodLost:Unreachable"),
        ("closed", "JobPodLost:Unreachable"),
        ("auth", "JobPodFailed:Link_auth"),
        ("claimed", "JobPodFailed:Link_claimed"),
        ("pod-mismatch", "JobPodFailed:Link_pod_mismatch"),
    ],
)
def test_a_link_failure_the_pod_does_not_explain_ends_the_job(reason: str, expected: str) -> None:
    ending = decide_link_failure(LinkError(reason, "why"), pod="pool-a-job-x")
    assert (ending.succeeded, ending.reason) == (False, expected)
    assert "pool-a-job-x" in ending.message and reason in ending.message


# -- the job pod, for real -------------------------------------------------------------------------


async def test_a_job_runs_in_its_pod_and_its_tree_home_and_checks_come_back(rig: Rig) -> None:
    workspace, home, scratch = rig.dirs()
    (workspace / "seed.txt").write_text("seed\n", encoding="utf-8")
    (home / "settings.json").write_text("{}\n", encoding="utf-8")
    pod = rig.job()
    agent = await pod.open(local_cwd=scratch, local_home=home)
    assert agent.wrapper[:2] == (str(JOBPOD), "attach") and agent.workspace == str(rig.pod.workspace)
    assert agent.wrapper[agent.wrapper.index("--egress-target") + 1] == f"127.0.0.1:{rig.listener}"
    adapter = build_pod_job_adapter(rig.config, rig.credential, agent)
    assert isinstance(adapter, AcpAdapter)
    key = agent.key.get_secret_value()
    tree, kept = await pod.put_trees(workspace=workspace, home=home)
    assert (tree.files, kept.files) == (1, 1)

    rig.provider.release.set()  # the Messages API answers whole
    prompt = "\n".join(
        [
            "Implement the change.",
            "WRITE-FILE: made.txt",
            "WRITE-HOME-FILE: session.state",
            f"READ-FILE: {rig.pod.workspace}/seed.txt",
            "PROVIDER-CALL: /v1/messages",
        ]
    )
    try:
        result = await adapter.run_turn(TurnRequest(prompt=prompt, cwd=agent.workspace))
        assert result.outcome is TurnOutcome.COMPLETED, result.message
        assert "file made.txt: written" in result.text  # in the session's cwd: the pod's workspace
        assert "home-file session.state: written" in result.text  # in the pod's HOME
        assert f"read {rig.pod.workspace}/seed.txt: read (5 bytes)" in result.text  # the runner's tree, put there
        assert "escape PROVIDER-CALL: /v1/messages: status 200" in result.text
        # Through the shim's relay and the job pods' listener: the phantom key became the credential.
        assert [(r.method, r.path, r.auth) for r in rig.provider.requests] == [
            ("POST", "/v1/messages", {"authorization": "canary", "x-api-key": "canary"})
        ]
        assert (await rig.ask(key)).status_code == 200  # the job's key, from its pod, while it runs
        assert MethodLog(rig.agent_state).count("initialize") == 1  # one agent for the job
    finally:
        pod.end_agent()
        await adapter.close()

    refused = await rig.ask(key)  # from the moment its last turn is over
    assert (refused.status_code, refused.text) == (403, "helmhive egress proxy: refused (revoked)\n")

    assert (await pod.take_back("workspace", workspace)).files == 2
    assert sorted(p.name for p in workspace.iterdir()) == ["made.txt", "seed.txt"]
    await pod.take_back("home", home)
    assert sorted(p.name for p in home.iterdir()) == ["session.state", "settings.json"]
    assert not list(rig.runner_dir.glob("*.incoming")) and not list(rig.runner_dir.glob("*.old"))

    check = CheckSpec(name="tree", command=["sh", "-c", "ls; cat seed.txt"], timeout_seconds=60)
    ran = await pod.run_checks([check], cancel=asyncio.Event())
    assert not ran.cancelled and [e.outcome for e in ran.evidence] == [CheckOutcome.PASSED]
    assert ran.evidence[0].output_tail == "made.txt\nseed.txt\nseed\n"  # in the pod's copy of the tree

    await pod.close()
    shim = rig.pod.shim
    assert shim is not None
    await eventually(lambda: shim.poll() is not None, what="the shim to exit after FINISH")
    assert shim.returncode == 0
    forgotten = await rig.ask(key)
    assert (forgotten.status_code, forgotten.text) == (403, "helmhive egress proxy: refused (key)\n")
    logs = rig.pod.logs().decode() + result.text + result.message + result.diagnostics
    _no_secret(logs, key, CANARY, rig.pod.key.hex())


async def test_a_cancelled_job_pods_key_is_refused_at_once_and_its_agent_ends(rig: Rig) -> None:
    workspace, home, scratch = rig.dirs()
    pod = rig.job()
    agent = await pod.open(local_cwd=scratch, local_home=home)
    adapter = build_pod_job_adapter(rig.config, rig.credential, agent)
    await pod.put_trees(workspace=workspace, home=home)
    rig.provider.release.set()
    log = rig.agent_state / "daemon.log"
    cancel = asyncio.Event()
    # The agent leaves a process calling the provider, and ignores the cancel.
    prompt = "Review.\nDAEMON: daemon.log\nREFERENCE-AGENT: hang"
    turn = asyncio.create_task(adapter.run_turn(TurnRequest(prompt=prompt, cwd=agent.workspace), cancel))
    daemon = 0
    try:
        await eventually(lambda: "status 200" in " ".join(_lines(log)), what="the daemon to reach the provider")
        daemon = int((rig.agent_state / "daemon.log.pid").read_text(encoding="ascii"))
        agent_pid = MethodLog(rig.agent_state).pids()[0]

        pod.end_agent()  # what a cancel does first (JobResources.revoke), before the agent is asked to stop
        cancel.set()
        await eventually(
            lambda: any(line.endswith("status 403 revoked") for line in _lines(log)), what="the daemon to be refused"
        )
        lines = _lines(log)
        first = next(i for i, line in enumerate(lines) if line.endswith("status 403 revoked"))
        assert not [line for line in lines[first:] if line.endswith("status 200")]

        result = await asyncio.wait_for(turn, 120)  # the agent ignored session/cancel: killed after the grace
        assert result.outcome is TurnOutcome.KILLED, result.message
        await adapter.close()
        await eventually(lambda: not group_alive(agent_pid), what="the agent's group to die with its link")
        launcher = rig.pod.launcher
        assert launcher is not None
        await eventually(lambda: launcher.poll() is not None, what="the launcher to exit")
        await pod.take_back("home", home)  # the agent has exited: the pod hands its HOME back
        await pod.close()
        assert (await rig.ask(agent.key.get_secret_value())).status_code == 403
        assert len(rig.provider.requests) == sum(1 for line in _lines(log) if line.endswith("status 200"))
    finally:
        turn.cancel()
        with contextlib.suppress(BaseException):
            await turn
        if daemon:  # locally it outlives the launcher; in a pod it dies with the agent's container
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon, signal.SIGKILL)


async def test_a_link_that_cannot_be_made_fails_before_any_agent_starts(rig: Rig, tmp_path: Path) -> None:
    workspace, home, scratch = rig.dirs()
    wrong = tmp_path / "wrong-key"
    wrong.write_bytes(os.urandom(32))
    refused = rig.job(key_file=wrong)
    await refused.open(local_cwd=scratch, local_home=home)
    with pytest.raises(LinkError) as auth:
        await refused.put_trees(workspace=workspace, home=home)
    assert decide_link_failure(auth.value, pod=rig.pod.pod).reason == f"{Reason.JOB_POD_FAILED.value}:Link_auth"
    await refused.close()

    nobody = PodRun(
        target=PodTarget(name="gone", ip="127.0.0.1", link_port=free_port()),
        settings=rig.settings(connect_window_s=1.0),
        job="impl-1",
        job_uid="job-uid-1",
        egress=rig.proxy,
    )
    await nobody.open(local_cwd=scratch, local_home=home)
    with pytest.raises(LinkError) as unreachable:
        await nobody.put_trees(workspace=workspace, home=home)
    assert decide_link_failure(unreachable.value, pod="gone").reason == "JobPodLost:Unreachable"
    await nobody.close()
    async with rig.pod.connect() as link:  # nothing was claimed, nothing started
        assert link.pod_state == "idle"
    assert rig.provider.requests == []


async def test_the_pods_shim_starts_one_agent_per_job(rig: Rig) -> None:
    """Why a job pod needs one agent process for the whole job (and the Claude CLI is refused)."""
    workspace, home, scratch = rig.dirs()
    pod = rig.job()
    agent = await pod.open(local_cwd=scratch, local_home=home)
    await pod.put_trees(workspace=workspace, home=home)
    first = build_pod_job_adapter(rig.config, rig.credential, agent)
    second = build_pod_job_adapter(rig.config, rig.credential, agent)
    try:
        done = await first.run_turn(TurnRequest(prompt="Say hello.", cwd=agent.workspace))
        assert done.outcome is TurnOutcome.COMPLETED
        again = await second.run_turn(TurnRequest(prompt="Say hello.", cwd=agent.workspace))
        assert again.outcome is not TurnOutcome.COMPLETED  # the shim refuses a second START
    finally:
        for adapter in (first, second):
            await adapter.close()
        await pod.close()
    cli = rig.config.file.adapter.model_copy(update={"type": AdapterType.CLAUDE_CLI})
    claude = rig.config.file.model_copy(update={"adapter": cli})
    with pytest.raises(ValueError, match="ACP only"):
        build_pod_job_adapter(rig.config.model_copy(update={"file": claude}), rig.credential, agent)
    _no_secret(again.message + again.diagnostics, agent.key.get_secret_value(), CANARY)

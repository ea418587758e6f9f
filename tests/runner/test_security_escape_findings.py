"""The four ways out an independent escape test found in the runner's sandbox, each shown closed.

The runner program runs as a runner pod runs it (uid 65532, no capabilities, owning its state,
credential copy and kubeconfig: :mod:`.pod_harness`) with ``credentialIsolation: Proxy`` and
``egress.networkNamespace: Required`` in front of a fake provider, and the reference agent (in its
job's sandbox) tries what the escape test did (:mod:`helmhive.reference_agent.intrusions`):

1. another job's egress socket, reached by ``O_PATH`` and ``/proc/self/fd``: refused (403 ``peer``),
   since the proxy serves a job's socket only to the process the runner started for that job;
2. ``chmod`` and ``utime`` of the runner's files: refused (``EROFS``), since the agent sees every
   mount read-only but its own directories;
3. writing past the pool's ``jobLimits.diskBytes``: the job ends ``ResourceLimitExceeded:disk``, and
   the Runner reports the limit;
4. a ``setsid`` daemon that ignores SIGTERM: refused by the proxy (403 ``revoked``) the moment its
   job is cancelled, while its agent is still given its grace, and killed when the agent ends --
   with no cgroup (uid 65532 may write none here), by the job's pid namespace.

The canary key must be in nothing the agent wrote. See ``docs/security.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import wait_for
from helmhive.api.common import JobKind

from .execution_harness import JOBS, ExecutionRig, Runner, condition
from .fake_provider import FakeProvider, fake_provider
from .pod_harness import make_pod_python, make_pod_root, start_pod_runner
from .program_harness import CANARY, GROUP, VERSION

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def pod_python() -> Iterator[Path]:
    with make_pod_python() as python:
        yield python


@pytest.fixture
def pod_root() -> Iterator[Path]:
    with make_pod_root() as root:
        yield root


@pytest.fixture
def provider(pod_root: Path) -> Iterator[FakeProvider]:
    with fake_provider(pod_root / "pki", canary=CANARY) as fake:
        fake.release.set()  # answer every stream at once
        yield fake


def _proxy_runner(execution: ExecutionRig, *, root: Path, python: Path, provider: FakeProvider, **extra: Any) -> Runner:
    egress = {"upstream": provider.url, "caBundle": str(provider.ca_file), "networkNamespace": "Required"}
    config = {"credentialIsolation": "Proxy", "egress": egress}
    return start_pod_runner(execution, root=root, python=python, config=config, **extra)


def _escapes(job: dict[str, Any]) -> dict[str, str]:
    escapes: dict[str, str] = job["status"]["result"]["output"]["escapes"]
    return escapes


def _cancel(execution: ExecutionRig, name: str) -> None:
    execution.kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, execution.namespace, JOBS, name, {"spec": {"cancel": True}}
    )


def _socket_of(runner: Runner, job: dict[str, Any]) -> Path:
    return runner.rig.state_dir / "egress" / (str(job["metadata"]["uid"]).replace("-", "")[:32] + ".sock")


def test_a_jobs_egress_socket_serves_no_other_job(
    pod_root: Path, execution: ExecutionRig, pod_python: Path, provider: FakeProvider
) -> None:
    runner = _proxy_runner(execution, root=pod_root, python=pod_python, provider=provider, concurrency=2)
    execution.create_job("holder", runner=runner, kind=JobKind.REVIEW_PROBE, prompt="Hold.\nREFERENCE-AGENT: stall")
    holder = execution.wait_running("holder")
    socket = _socket_of(runner, holder)
    wait_for(socket.exists, timeout=60, describe="the holder's egress socket")

    prompt = f"Review.\nPROVIDER-CALL: /v1/messages\nUNIX-CALL: {socket}"
    execution.create_job("intruder", runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt, timeout=240)
    intruder = execution.wait_finished("intruder", timeout=240)
    assert condition(intruder, "Succeeded")["status"] == "True", json.dumps(intruder.get("status"))[:2000]
    escapes = _escapes(intruder)
    assert escapes["PROVIDER-CALL: /v1/messages"] == "status 200"  # its own way out works
    assert escapes[f"UNIX-CALL: {socket}"] == "status 403 peer"  # the holder's socket serves the holder only
    # The intruder's own request reached the provider, with the key; the holder made none.
    assert [(r.method, r.path, r.auth["x-api-key"]) for r in provider.requests] == [("POST", "/v1/messages", "canary")]
    assert [line["reason"] for line in runner.proc.messages("egress: request refused")] == ["peer"]

    _cancel(execution, "holder")
    held = execution.wait_finished("holder", timeout=120)
    assert condition(held, "Succeeded")["reason"] == "Cancelled", held["status"]
    assert CANARY not in json.dumps(intruder) + runner.proc.raw_log()


def test_the_agent_cannot_change_the_runners_files(
    pod_root: Path, execution: ExecutionRig, pod_python: Path, provider: FakeProvider
) -> None:
    runner = _proxy_runner(execution, root=pod_root, python=pod_python, provider=provider)
    state = runner.rig.state_dir
    theirs = [
        state / "credential" / "credential",  # the runner's copy of the key
        pod_root / "secret" / "credential",  # the mounted Secret
        pod_root / "kubeconfig",  # the runner's identity
        pod_root / "runner.json",
        state / "credential",
        state,
    ]
    before = {path: (path.stat().st_mode, path.stat().st_uid) for path in theirs}
    assert {uid for _, uid in before.values()} == ({65532} if os.getuid() == 0 else {os.getuid()})  # the agent's uid
    prompt = "\n".join(["Review.", *(f"CHMOD: {path}" for path in theirs), f"CHMOD: {runner.agent_state}"])
    execution.create_job("chmod", runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt, timeout=240)
    job = execution.wait_finished("chmod", timeout=240)
    assert condition(job, "Succeeded")["status"] == "True", json.dumps(job.get("status"))[:2000]
    escapes = _escapes(job)
    # Where the job may write, the directive works: it is the file system, not the directive, that says no.
    assert escapes[f"CHMOD: {runner.agent_state}"] == "chmod ok, utime ok"
    refused = {f"CHMOD: {path}": "chmod failed (EROFS), utime failed (EROFS)" for path in theirs}
    assert {key: escapes[key] for key in refused} == refused
    assert {path: (path.stat().st_mode, path.stat().st_uid) for path in theirs} == before
    (started,) = execution.wait_events("chmod", "Started")
    assert "files read-only but its own" in str(started.message)
    assert runner.rig.report()["sandbox"]["filesReadOnly"] is True


def test_a_job_over_its_disk_limit_ends_resource_limit_exceeded_disk(
    pod_root: Path, execution: ExecutionRig, pod_python: Path
) -> None:
    runner = start_pod_runner(execution, root=pod_root, python=pod_python, job_limits={"diskBytes": 64 * MIB})
    assert runner.rig.report()["sandbox"]["diskBytes"] == 64 * MIB
    execution.create_job("within", runner=runner, kind=JobKind.REVIEW_PROBE, prompt="Review.\nWRITE-DISK: 16")
    within = execution.wait_finished("within", timeout=240)
    assert condition(within, "Succeeded")["status"] == "True", json.dumps(within.get("status"))[:2000]
    assert _escapes(within)["WRITE-DISK: 16"] == "wrote 16 MiB"
    (started,) = execution.wait_events("within", "Started")
    assert "disk 64 MiB per job" in str(started.message)

    # 128 MiB into TMPDIR, 8 MiB a file: no one file reaches the limit, the job's total does.
    execution.create_job("over", runner=runner, kind=JobKind.REVIEW_PROBE, prompt="Review.\nWRITE-DISK: 128")
    over = execution.wait_finished("over", timeout=240)
    ended = condition(over, "Succeeded")
    assert (ended["status"], ended["reason"]) == ("False", "ResourceLimitExceeded:disk"), over["status"]
    assert "over its 64 MiB (jobLimits.diskBytes)" in ended["message"]
    assert over["status"]["result"]["outcome"] == "ResourceLimitExceeded:disk"

    execution.create_job("after", runner=runner, kind=JobKind.REVIEW_PROBE, prompt="Review.")
    after = execution.wait_finished("after", timeout=240)
    assert condition(after, "Succeeded")["status"] == "True", after["status"]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def test_a_detached_process_is_refused_when_its_job_ends_and_then_killed_without_cgroups(
    pod_root: Path, execution: ExecutionRig, pod_python: Path, provider: FakeProvider
) -> None:
    runner = _proxy_runner(execution, root=pod_root, python=pod_python, provider=provider)
    probed = wait_for(lambda: runner.proc.messages("job limits"), timeout=60, describe="the runner's probe")
    if os.getuid() == 0:
        assert probed[0]["cgroups"] == "None"  # uid 65532 may write no cgroup here: nothing but the pid namespace
    log = runner.agent_state / "daemon.log"
    prompt = "Review.\nDAEMON: daemon.log\nREFERENCE-AGENT: hang"  # the agent ignores the cancel too
    execution.create_job("daemon", runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt, timeout=600)
    pid = 0
    try:
        wait_for(lambda: "status 200" in " ".join(_lines(log)), timeout=120, describe="the daemon to call the provider")
        pid = int((runner.agent_state / "daemon.log.pid").read_text(encoding="ascii"))
        assert _alive(pid)

        _cancel(execution, "daemon")

        def refused() -> list[str]:
            lines = _lines(log)
            assert any(line.endswith("status 403 revoked") for line in lines), lines[-3:]
            return lines

        # The daemon is refused while it lives: revoked at the cancel, not when the agent's grace ends.
        lines = wait_for(refused, timeout=60, describe="the daemon to be refused")
        first = next(i for i, line in enumerate(lines) if line.endswith("status 403 revoked"))
        assert not [line for line in lines[first:] if line.endswith("status 200")], lines[first:]
        job = execution.wait_finished("daemon", timeout=120)
        assert condition(job, "Succeeded")["reason"] == "Cancelled", job["status"]
        # And once the agent is gone, so is the daemon: its pid namespace's init ended.
        wait_for(lambda: not _alive(pid), timeout=60, describe=f"the daemon (pid {pid}) to be killed")
        forwarded = sum(1 for line in _lines(log) if line.endswith("status 200"))
        assert len(provider.requests) == forwarded  # nothing refused reached the provider
        assert CANARY not in log.read_text(encoding="utf-8") + runner.proc.raw_log()
    finally:
        if pid and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

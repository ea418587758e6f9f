"""Per-job limits: a job that uses too much memory, CPU, processes or open files ends with a named
reason, and its runner stays Schedulable and runs the next job.

The reference agent is told to allocate (``ALLOCATE``), spin (``SPIN``), fork (``SPAWN``) and open
files (``OPEN-FILES``); under the pool's ``jobLimits`` the kernel stops it, and it dies as a
runtime would (``MemoryError``, ``EAGAIN``, ``EMFILE`` on stderr; SIGXCPU for CPU). The cluster
tests run a runner as uid 65532, as in a runner pod, since the kernel never applies RLIMIT_NPROC to
root: the processes limit holds only for a runner that is not root (and can create user
namespaces), which one test with a root runner shows too. The pure decisions and the launcher are
tested on their own first. See ``docs/security.md``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness import wait_for
from helmhive.api.common import JobKind
from helmhive.api.reasons import Reason
from helmhive.api.runner import RunnerReport, RunnerSpec
from helmhive.api.runnerpool import JobLimits
from helmhive.policy.runners.state import LeaseView, PoolFacts, decide_runner_status
from helmhive.reference_agent import rules
from helmhive.runner.adapters.base import CancelOrigin, TurnOutcome, TurnResult
from helmhive.runner.jobs.status import decide_turn_failure
from helmhive.runner.sandbox.limits import (
    EnforcedLimits,
    LimitSupport,
    build_enforced_limits,
    decide_limit_exceeded,
)

from .execution_harness import ExecutionRig, Runner, condition
from .pod_harness import POD_UID, make_pod_python, make_pod_root, start_pod_runner

MIB = 1024 * 1024
LIMITS = {"memoryBytes": 256 * MIB, "cpuSeconds": 5, "processes": 32, "openFiles": 64}
ENFORCED = EnforcedLimits(memory_bytes=256 * MIB, cpu_seconds=5, open_files=64, processes=32, user_namespace=True)


# -- pure decisions ------------------------------------------------------------------------------


def test_the_processes_limit_needs_a_runner_that_is_not_root_and_a_user_namespace() -> None:
    limits = JobLimits.model_validate(LIMITS)
    pod = build_enforced_limits(limits=limits, support=LimitSupport(uid=POD_UID, user_namespaces=True))
    assert (pod.processes, pod.user_namespace) == (32, True)
    assert pod.rlimits() == {
        "DATA": [256 * MIB, 256 * MIB],
        "CPU": [5, 10],  # SIGXCPU at 5 s, SIGKILL 5 s later
        "NOFILE": [64, 64],
        "FSIZE": [4096 * MIB, 4096 * MIB],  # no file larger than the job's disk
        "CORE": [0, 0],
        "NPROC": [32, 32],
    }
    assert pod.describe() == (
        "memory 256 MiB, cpu 5s, files 64 per process, processes 32 per job, disk 4096 MiB per job, "
        "no pid namespace, no read-only view"
    )
    root = build_enforced_limits(limits=limits, support=LimitSupport(uid=0, user_namespaces=True))
    assert (root.processes, root.user_namespace) == (None, False) and "NPROC" not in root.rlimits()
    assert "processes not limited (the runner is uid 0" in root.describe()
    no_userns = build_enforced_limits(limits=limits, support=LimitSupport(uid=POD_UID, user_namespaces=False))
    assert no_userns.processes is None and "every process of uid 65532" in no_userns.processes_note
    assert JobLimits().model_dump() == {
        "memory_bytes": 1024 * MIB,
        "cpu_seconds": 3600,
        "processes": 512,
        "open_files": 4096,
        "cpu_millicores": 2000,
        "disk_bytes": 4096 * MIB,
    }


@pytest.mark.parametrize(
    ("exit_code", "stderr", "expected"),
    [
        pytest.param(-signal.SIGXCPU, "", "cpu", id="sigxcpu"),
        pytest.param(128 + signal.SIGXCPU, "", "cpu", id="sigxcpu-through-a-shell"),
        pytest.param(1, "Traceback...\nMemoryError: cannot allocate 512 MiB\n", "memory", id="python-memory"),
        pytest.param(
            -6, "FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory", "memory", id="node"
        ),
        pytest.param(1, "OSError: [Errno 24] Too many open files: '/dev/null'", "files", id="emfile"),
        pytest.param(1, "BlockingIOError: [Errno 11] Resource temporarily unavailable", "processes", id="eagain"),
        pytest.param(2, "runtime: failed to create new OS thread (have 9 already; errno=11)", "processes", id="go"),
        pytest.param(1, "MemoryError\nlater: OSError: [Errno 24] Too many open files", "files", id="last-words-win"),
        pytest.param(-signal.SIGKILL, "", None, id="sigkill-is-not-attributed"),
        pytest.param(1, "ValueError: something else", None, id="another-failure"),
        pytest.param(0, "MemoryError", None, id="a-clean-exit"),
        pytest.param(None, "MemoryError", None, id="still-running"),
    ],
)
def test_which_limit_an_agent_hit(exit_code: int | None, stderr: str, expected: str | None) -> None:
    hit = decide_limit_exceeded(exit_code=exit_code, diagnostics=stderr, limits=ENFORCED)
    assert (hit.resource if hit else None) == expected


def test_without_a_processes_limit_eagain_is_not_a_limit() -> None:
    unlimited = EnforcedLimits(memory_bytes=256 * MIB, cpu_seconds=5, open_files=64, processes=None)
    text = "BlockingIOError: [Errno 11] Resource temporarily unavailable"
    assert decide_limit_exceeded(exit_code=1, diagnostics=text, limits=unlimited) is None


def test_a_limit_names_the_jobs_end_unless_the_runner_stopped_the_agent() -> None:
    crashed = TurnResult(outcome=TurnOutcome.AGENT_CRASHED, agent_exit_code=-signal.SIGXCPU, message="exited")
    verdict = decide_turn_failure(result=crashed, cause=None, timeout_s=60, limits=ENFORCED)
    assert verdict.reason == f"{Reason.RESOURCE_LIMIT_EXCEEDED.value}:cpu" and "5s of CPU time" in verdict.message
    assert decide_turn_failure(result=crashed, cause=None, timeout_s=60).reason == Reason.AGENT_CRASHED
    stopped = crashed.model_copy(update={"outcome": TurnOutcome.KILLED, "cancel_origin": CancelOrigin.CALLER})
    assert decide_turn_failure(result=stopped, cause=None, timeout_s=60, limits=ENFORCED).reason == Reason.INTERRUPTED


def test_the_reference_agents_resource_directives() -> None:
    prompt = "Go.\nALLOCATE: 64\nSPIN: 2\nSPAWN: 4\nOPEN-FILES: 99999999\nWRITE-HOME-FILE: a.txt\nWRITE-HOME-FILE: ../x"
    directives = rules.parse_directives(prompt)
    assert directives.resources() == {"allocate": 64, "spin": 2, "spawn": 4, "openFiles": rules.MAX_OPEN_FILES}
    assert directives.home_files == ("a.txt",)  # no paths, only names
    assert rules.first_content_line(prompt) == "Go."
    reply = rules.render_reply(
        prompt,
        turn=1,
        model="m",
        effort="e",
        tool_results={},
        home_file_results={"a.txt": "written"},
        resource_results={"allocate": "allocated 64 MiB"},
    )
    assert "home-file a.txt: written" in reply and "resource allocate: allocated 64 MiB" in reply
    assert rules.parse_directives("Go.").resources() == {}


# -- the launcher --------------------------------------------------------------------------------

REPORT_LIMITS = """
import json, resource
names = ("DATA", "CPU", "NOFILE", "NPROC", "CORE")
out = {n: list(resource.getrlimit(getattr(resource, "RLIMIT_" + n))) for n in names}
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (100000, 100000))
    out["raised"] = True
except (OSError, ValueError):
    out["raised"] = False
print(json.dumps(out))
"""


def _launch(policy: dict[str, Any], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "helmhive.runner.sandbox.landlock",
            "--policy",
            json.dumps(policy),
            "--",
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _policy(**extra: Any) -> dict[str, Any]:
    from helmhive.runner.sandbox.workdir import SYSTEM_READ_PATHS, runtime_read_paths

    return {"read": [*SYSTEM_READ_PATHS, *runtime_read_paths()], "write": [], "devices": ["/dev"], **extra}


def test_the_launcher_applies_the_limits_and_the_agent_cannot_raise_them() -> None:
    policy = _policy(rlimits=ENFORCED.rlimits(), userNamespace=False)
    done = _launch(policy, sys.executable, "-c", REPORT_LIMITS)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["DATA"], out["CPU"], out["NOFILE"], out["NPROC"], out["CORE"]) == (
        [256 * MIB, 256 * MIB],
        [5, 10],
        [64, 64],
        [32, 32],
        [0, 0],
    )
    assert out["raised"] is False  # not even as root: CAP_SYS_RESOURCE is gone
    bad = _launch(_policy(rlimits={"STACK": [1, 1]}), "true")
    assert bad.returncode == 126 and "refusing to start the agent unrestricted" in bad.stderr


def test_the_launcher_says_what_this_environment_allows() -> None:
    done = subprocess.run(
        [sys.executable, "-P", "-m", "helmhive.runner.sandbox.landlock", "--probe"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    probe = json.loads(done.stdout)
    assert probe["landlock"] >= 1 and isinstance(probe["userNamespace"], bool)


# -- a runner that is not root, as in a pod ---------------------------------------------------------


@pytest.fixture(scope="module")
def pod_python() -> Iterator[Path]:
    """An interpreter uid 65532 can run (:func:`.pod_harness.make_pod_python`)."""
    with make_pod_python() as python:
        yield python


@pytest.fixture
def pod_root() -> Iterator[Path]:
    """A directory uid 65532 can reach; requested before ``execution`` (see :func:`.pod_harness.make_pod_root`)."""
    with make_pod_root() as root:
        yield root


FORK_EIGHT = """
import os, time
children = []
try:
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        children.append(pid)
except OSError:
    pass
print(len(children))
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""


def test_in_its_own_user_namespace_a_job_counts_only_its_own_processes(pod_python: Path) -> None:
    """RLIMIT_NPROC counts every process of the uid (the runner's, other jobs'); in the job's own
    user namespace it counts the job's. 40 processes of the same uid run elsewhere; the limit is 16."""
    user: dict[str, Any] = {"user": POD_UID, "group": POD_UID, "extra_groups": []} if os.getuid() == 0 else {}
    sleep = [str(pod_python), "-c", "import time; time.sleep(300)"]
    others = [subprocess.Popen(sleep, stdin=subprocess.DEVNULL, **user) for _ in range(40)]
    try:
        forked = {}
        for userns in (False, True):
            policy = {"read": ["/"], "write": [], "rlimits": {"NPROC": [16, 16]}, "userNamespace": userns}
            launcher = [
                str(pod_python),
                "-P",
                "-m",
                "helmhive.runner.sandbox.landlock",
                "--policy",
                json.dumps(policy),
                "--",
            ]
            done = subprocess.run(
                [*launcher, str(pod_python), "-c", FORK_EIGHT],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                **user,
            )
            assert done.returncode == 0, done.stderr
            forked[userns] = int(done.stdout)
        assert forked == {False: 0, True: 8}
    finally:
        for proc in others:
            proc.kill()
            proc.wait()


def start_limited_runner(
    execution: ExecutionRig, *, root: Path, job_limits: dict[str, int], python: Path | None = None
) -> Runner:
    """A runner program with ``jobLimits`` in its runner.json (uid 65532 with ``python``: :func:`start_pod_runner`)."""
    return start_pod_runner(execution, root=root, python=python, job_limits=job_limits)


def _limited(execution: ExecutionRig, name: str, runner: Runner, prompt: str) -> dict[str, Any]:
    execution.create_job(name, runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt, timeout=240)
    return execution.wait_finished(name, timeout=240)


def _schedulable(runner: Runner, now: dt.datetime) -> bool:
    """What the operator would derive from the runner's own Runner object and Lease (the real pure function)."""
    obj = runner.rig.runner()
    lease = runner.rig.lease()
    view = LeaseView(
        holder=lease.spec.holder_identity,
        renew_time=lease.spec.renew_time,
        duration_seconds=int(lease.spec.lease_duration_seconds),
    )
    derived = decide_runner_status(
        name=runner.name,
        spec=RunnerSpec.model_validate(obj["spec"]),
        report=RunnerReport.model_validate(obj["status"]["report"]),
        pool=PoolFacts(credential_generation=1),
        lease=view,
        now=now,
        grace=dt.timedelta(seconds=2),
    )
    return derived.is_schedulable


def _lease_renewed_after(runner: Runner, moment: dt.datetime) -> bool:
    lease: client.V1Lease = runner.rig.lease()
    return lease.spec.renew_time is not None and lease.spec.renew_time > moment


def test_each_limit_ends_its_job_and_the_runner_goes_on(
    pod_root: Path, execution: ExecutionRig, pod_python: Path
) -> None:
    runner = start_limited_runner(execution, root=pod_root, python=pod_python, job_limits=LIMITS)
    probed = wait_for(lambda: runner.proc.messages("job limits"), timeout=60, describe="the runner's probe of limits")
    assert probed[0]["uid"] == (POD_UID if os.getuid() == 0 else os.getuid())
    assert probed[0]["cgroups"] == "None"  # uid 65532 may write no cgroup on this machine: rlimits only
    if not probed[0]["userNamespaces"]:
        pytest.skip(
            "this kernel or seccomp profile allows no user namespaces: the processes limit is not enforced here"
        )

    # Within the limits, every directive works, and the job succeeds.
    within = _limited(execution, "within", runner, "Review.\nALLOCATE: 16\nSPIN: 1\nSPAWN: 4\nOPEN-FILES: 16")
    assert condition(within, "Succeeded")["status"] == "True", within["status"]
    assert within["status"]["result"]["output"]["resources"] == {
        "allocate": "allocated 16 MiB",
        "spin": "spun 1 s of CPU",
        "spawn": "spawned 4 processes",
        "openFiles": "opened 16 files",
    }
    (started,) = execution.wait_events("within", "Started")
    assert "limits: memory 256 MiB, cpu 5s, files 64 per process, processes 32 per job" in str(started.message)

    cases = {
        "memory": ("ALLOCATE: 512", "MemoryError"),
        "cpu": ("SPIN: 60", "SIGXCPU"),
        "processes": ("SPAWN: 64", "Resource temporarily unavailable"),
        "files": ("OPEN-FILES: 200", "Too many open files"),
    }
    for limit, (directive, said) in cases.items():
        job = _limited(execution, f"over-{limit}", runner, f"Review.\n{directive}")
        ended = condition(job, "Succeeded")
        assert (ended["status"], ended["reason"]) == ("False", f"ResourceLimitExceeded:{limit}"), job["status"]
        assert said in ended["message"]
        assert job["status"]["result"]["outcome"] == f"ResourceLimitExceeded:{limit}"
        finished = dt.datetime.now(dt.UTC)

        # The runner is untouched: alive, its Lease renewed since, Schedulable as the operator derives it,
        # and it runs the next job.
        assert runner.proc.popen.poll() is None, runner.proc.raw_log()[-3000:]
        wait_for(
            lambda since=finished: _lease_renewed_after(runner, since), timeout=30, describe="the Lease to be renewed"
        )
        assert _schedulable(runner, dt.datetime.now(dt.UTC))
        after = _limited(execution, f"after-{limit}", runner, "Review.")
        assert condition(after, "Succeeded")["status"] == "True", after["status"]


def test_a_root_runner_limits_processes_with_the_jobs_cgroup(execution: ExecutionRig, tmp_path: Path) -> None:
    """RLIMIT_NPROC never applies to uid 0; a job cgroup's pids total does, whatever the uid. (The pod
    runner above, uid 65532, may write no cgroup here: it runs on rlimits alone and says so.)"""
    if os.getuid() != 0:
        pytest.skip("this shows a runner that runs as root")
    root = start_limited_runner(execution, root=tmp_path / "root-runner", job_limits=LIMITS)
    (probed,) = wait_for(lambda: root.proc.messages("job limits"), timeout=60, describe="the runner's probe")
    assert probed["cgroups"] in ("V1", "V2"), probed  # this CI machine lets root write cgroups
    job = _limited(execution, "root-memory", root, "Review.\nALLOCATE: 512")
    ended = condition(job, "Succeeded")
    assert (ended["status"], ended["reason"]) == ("False", "ResourceLimitExceeded:memory"), job["status"]
    (started,) = execution.wait_events("root-memory", "Started")
    assert "processes not limited (the runner is uid 0, which RLIMIT_NPROC never applies to)" in str(started.message)
    assert f"cgroup {probed['cgroups']}: memory 256 MiB, processes 32 per job" in str(started.message)
    fork = _limited(execution, "root-fork", root, "Review.\nSPAWN: 64")
    ended = condition(fork, "Succeeded")
    assert (ended["status"], ended["reason"]) == ("False", "ResourceLimitExceeded:processes"), fork["status"]
    assert f"32 processes and threads (cgroup {probed['cgroups']})" in ended["message"]
    assert root.rig.report()["sandbox"]["cgroups"] == probed["cgroups"]
    # The runner goes on, and no job cgroup is left behind.
    after = _limited(execution, "root-after", root, "Review.")
    assert condition(after, "Succeeded")["status"] == "True", after["status"]
    parents = str(probed["cgroupsReason"]).removeprefix("job cgroups under ").split(", ")
    uids = [str(j["metadata"]["uid"]).replace("-", "") for j in (job, fork, after)]

    # The runner removes a job's cgroup after it writes the job's final status: wait for it.
    def none_left() -> bool:
        found = [c for p in parents for u in uids for c in Path(p).glob(f"helmhive-*-{u}")]
        assert found == [], found
        return True

    wait_for(none_left, timeout=60, describe="no job cgroup left behind")

"""Per-job cgroups: the job's totals, enforced by the kernel and named by its counters.

The probe runs against fake ``/sys/fs/cgroup`` trees first (what it prefers, and the reasons it
gives); then, on this machine's real hierarchy (the tests run as root where cgroups are writable),
the real launcher joins a job cgroup and its processes together hit the memory total (no single
one is over its rlimit), or the pids total, and the runner's decision names each; finally the
cgroup is emptied and removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import wait_for
from helmhive.api.runner import CgroupMode
from helmhive.api.runnerpool import JobLimits
from helmhive.runner.sandbox.cgroups import (
    CgroupEvents,
    CgroupSupport,
    JobCgroup,
    build_cgroup_prefix,
    decide_cgroup_hit,
    ensure_job_cgroup,
    probe_cgroups,
    read_events,
    remove_job_cgroup,
    remove_stale_job_cgroups,
)
from helmhive.runner.sandbox.workdir import SYSTEM_READ_PATHS, runtime_read_paths

MIB = 1024 * 1024
PREFIX = build_cgroup_prefix(namespace="cgroup-tests", runner=f"pid-{os.getpid()}")


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_probe_prefers_a_delegated_v2_cgroup_then_v1_and_says_why_not(tmp_path: Path) -> None:
    proc = tmp_path / "proc-cgroup"
    # A pod's own delegated cgroup v2 (cgroup namespace: its path is "/").
    v2 = tmp_path / "v2"
    _tree(v2, {"cgroup.controllers": "cpu memory pids\n", "cgroup.subtree_control": "", "cgroup.procs": ""})
    proc.write_text("0::/\n")
    found = probe_cgroups(v2, proc)
    assert found.mode is CgroupMode.V2 and found.parents == {"unified": v2}
    assert (v2 / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"  # handed down to job cgroups
    # Without the pids controller: not v2, and no v1 either; both reasons are given.
    _tree(v2, {"cgroup.controllers": "cpu memory\n"})
    found = probe_cgroups(v2, proc)
    assert found.mode is CgroupMode.NONE
    assert "controllers pids are not available" in found.reason and "v1: no cgroup v1 memory hierarchy" in found.reason
    # v1 hierarchies (memory, pids; cpu optional) under the process's own cgroups.
    v1 = tmp_path / "v1"
    _tree(v1, {"memory/cgroup.procs": "", "memory/pod/cgroup.procs": "", "pids/cgroup.procs": ""})
    proc.write_text("5:pids:/\n4:memory:/pod\n0::/\n")
    found = probe_cgroups(v1, proc)
    assert found.mode is CgroupMode.V1
    assert found.parents == {"memory": v1 / "memory" / "pod", "pids": v1 / "pids"}


def test_what_each_counter_means() -> None:
    limits = JobLimits(memory_bytes=64 * MIB, processes=16)
    cgroup = JobCgroup(mode=CgroupMode.V1, dirs=(), limits=limits)
    assert decide_cgroup_hit(events=CgroupEvents(), cgroup=cgroup) is None
    memory = decide_cgroup_hit(events=CgroupEvents(oom_kills=2, pids_refused=1), cgroup=cgroup)
    assert memory is not None and memory[0] == "memory" and "64 MiB" in memory[1] and "killed 2" in memory[1]
    pids = decide_cgroup_hit(events=CgroupEvents(pids_refused=3), cgroup=cgroup)
    assert pids is not None and pids[0] == "processes" and "16 processes" in pids[1]


# -- this machine's hierarchy ---------------------------------------------------------------------

EAT = """
import os, sys
mib, count = int(sys.argv[1]), int(sys.argv[2])
hold_r, hold_w = os.pipe()
ready_r, ready_w = os.pipe()
children = []
for _ in range(count):
    pid = os.fork()
    if pid == 0:
        os.close(hold_w)
        os.close(ready_r)
        block = bytearray(mib * 1024 * 1024)  # touched: every page is charged to the cgroup
        os.write(ready_w, b"x")
        os.close(ready_w)
        os.read(hold_r, 1)  # hold it until every child has allocated (or died trying)
        os._exit(0)
    children.append(pid)
os.close(ready_w)
while os.read(ready_r, 64):  # EOF once every child has allocated and waits, or is dead
    pass
os.close(hold_w)
ends = [os.waitpid(pid, 0)[1] for pid in children]
print(sum(1 for status in ends if os.WIFSIGNALED(status)), flush=True)
"""

FORK = """
import os, sys, time
made, failed = 0, 0
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError:
        failed += 1
        continue
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
print(made, failed, flush=True)
"""


@pytest.fixture(scope="module")
def support() -> CgroupSupport:
    found = probe_cgroups()
    if found.mode is CgroupMode.NONE:
        pytest.fail(
            f"these tests need a writable cgroup hierarchy (run them as root on the CI machine): {found.reason}"
        )
    return found


def _launcher(cgroup_procs: tuple[str, ...], rlimit_data: int = 1024 * MIB) -> list[str]:
    policy = {
        "read": [*SYSTEM_READ_PATHS, *runtime_read_paths()],
        "write": [],
        "devices": ["/dev"],
        "rlimits": {"DATA": [rlimit_data, rlimit_data]},
        "cgroup": list(cgroup_procs),
    }
    return [sys.executable, "-P", "-m", "helmhive.runner.sandbox.landlock", "--policy", json.dumps(policy), "--"]


def _launch(
    cgroup_procs: tuple[str, ...], rlimit_data: int, script: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_launcher(cgroup_procs, rlimit_data), sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_the_jobs_processes_together_hit_its_memory_total(support: CgroupSupport) -> None:
    limits = JobLimits(memory_bytes=96 * MIB, processes=64)
    cgroup = ensure_job_cgroup(support=support, prefix=PREFIX, uid="0000aaaa-memory-test", limits=limits)
    assert cgroup is not None and all(d.is_dir() for d in cgroup.dirs)
    try:
        # Four children of 40 MiB each: every one is far below its 96 MiB rlimit, the job is not.
        done = _launch(cgroup.procs_files, 96 * MIB, EAT, "40", "4")
        assert done.returncode == 0, done.stderr[-2000:]
        assert int(done.stdout) >= 1  # the kernel killed at least one of them
        events = read_events(cgroup)
        assert events.oom_kills >= 1
        hit = decide_cgroup_hit(events=events, cgroup=cgroup)
        assert hit is not None and hit[0] == "memory"
    finally:
        assert remove_job_cgroup(cgroup)
    assert not any(d.exists() for d in cgroup.dirs)


def test_the_jobs_processes_hit_its_pids_total_whatever_their_uid(support: CgroupSupport) -> None:
    limits = JobLimits(processes=8)
    cgroup = ensure_job_cgroup(support=support, prefix=PREFIX, uid="0000bbbb-pids-test", limits=limits)
    assert cgroup is not None
    try:
        done = _launch(cgroup.procs_files, 1024 * MIB, FORK, "20")  # as root: RLIMIT_NPROC would not apply
        assert done.returncode == 0, done.stderr[-2000:]
        made, failed = (int(n) for n in done.stdout.split())
        assert made == 7 and failed == 13  # the launcher-turned-agent is the eighth
        events = read_events(cgroup)
        assert events.pids_refused >= 13 and events.oom_kills == 0
        assert decide_cgroup_hit(events=events, cgroup=cgroup) is not None
    finally:
        # The sleeping children outlived the agent: removing the cgroup kills them first.
        assert remove_job_cgroup(cgroup)
    assert not any(d.exists() for d in cgroup.dirs)


def test_a_restarted_runner_removes_its_own_stale_job_cgroups_and_no_one_elses(support: CgroupSupport) -> None:
    """A runner that was killed left a job cgroup with a process in it; when it starts again it kills
    that process and removes the cgroup. Another runner's job cgroup is not touched."""
    other_prefix = build_cgroup_prefix(namespace="cgroup-tests", runner=f"other-{os.getpid()}")
    assert other_prefix != PREFIX and PREFIX.startswith("helmhive-") and len(PREFIX) == len("helmhive-") + 13
    limits = JobLimits(processes=8)
    mine = ensure_job_cgroup(support=support, prefix=PREFIX, uid="0000cccc-stale", limits=limits)
    theirs = ensure_job_cgroup(support=support, prefix=other_prefix, uid="0000dddd-running", limits=limits)
    assert mine is not None and theirs is not None
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    left = subprocess.Popen([*_launcher(mine.procs_files), *sleep])
    running = subprocess.Popen([*_launcher(theirs.procs_files), *sleep])
    try:
        procs = Path(mine.procs_files[0])
        wait_for(lambda: procs.read_text().split() == [str(left.pid)], timeout=30, describe="the process in it")
        assert remove_stale_job_cgroups(support=support, prefix=PREFIX) == len(mine.dirs)
        assert left.wait(timeout=30) == -9  # killed with the cgroup
        assert not any(d.exists() for d in mine.dirs)
        assert running.poll() is None and all(d.is_dir() for d in theirs.dirs)
    finally:
        running.kill()
        left.kill()
        running.wait()
        assert remove_job_cgroup(theirs)

"""The shim's checks, through the link: in the shim's copy of the tree, sandboxed, with nothing of the
shim's environment, their results mapping onto CheckEvidence."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from helmhive.api.governed import CheckOutcome, CheckSpec
from helmhive.runner.jobpod.checks import carve_read_paths
from helmhive.runner.jobpod.frames import LinkError
from helmhive.runner.sandbox.landlock import landlock_abi

from .test_jobpod_link import JobPod, eventually, group_alive, make_job_pod

CANARY = "check-canary-" + secrets.token_hex(8)


@pytest.fixture
def job_pod(tmp_path: Path) -> Iterator[JobPod]:
    yield from make_job_pod(tmp_path, HELMHIVE_CHECK_CANARY=CANARY)


async def _finished_agent(job_pod: JobPod, tree: Path) -> None:
    async with job_pod.connect() as link:
        await link.put_tree("workspace", tree)
        agent = await link.start(["/bin/sh", "-c", "echo built > built.txt"], env={}, cwd=str(job_pod.workspace))
        ended, _, _ = await agent.wait()
        assert ended.code == 0


def test_this_machine_can_sandbox_checks() -> None:
    assert landlock_abi() >= 4, "this machine's kernel must offer Landlock ABI 4+ (the CI images do)"


async def test_checks_pass_fail_time_out_and_not_run(job_pod: JobPod, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "test.sh").write_text("#!/bin/sh\ncat built.txt\necho from-test\n")
    (tree / "test.sh").chmod(0o755)
    pidfile = job_pod.shim_dir / "copy" / "workspace" / "sleeper.pid"
    async with job_pod.connect() as link:
        with pytest.raises(LinkError) as early:
            await link.run_check(CheckSpec(name="early", command=["true"]))
        assert early.value.reason == "running"
    await _finished_agent(job_pod, tree)

    async with job_pod.connect() as link:
        passed = await link.run_check(CheckSpec(name="unit", command=["./test.sh"]))
        failed = await link.run_check(CheckSpec(name="lint", command=["sh", "-c", "echo bad >&2; exit 3"]))
        slow = CheckSpec(
            name="slow", command=["sh", "-c", "echo $$ > sleeper.pid; sleep 300 & sleep 300"], timeout_seconds=2
        )
        timed_out = await link.run_check(slow)
        missing = await link.run_check(CheckSpec(name="missing", command=["no-such-command-here"]))
        tail = await link.run_check(
            CheckSpec(name="tail", command=["sh", "-c", "echo 0123456789"]), output_tail_chars=4
        )

    evidence = passed.to_evidence()
    assert (evidence.outcome, evidence.exit_code) == (CheckOutcome.PASSED, 0)
    assert evidence.output_tail == "built\nfrom-test\n"  # it ran in the agent's result
    assert (evidence.output_bytes, evidence.name) == (len("built\nfrom-test\n"), "unit")
    assert failed.to_evidence().outcome is CheckOutcome.FAILED
    assert (failed.exit_code, failed.output_tail) == (3, "bad\n")
    assert timed_out.timed_out and timed_out.exit_code is None
    assert timed_out.to_evidence().outcome is CheckOutcome.TIMED_OUT
    assert timed_out.duration_ms >= 2000
    await eventually(lambda: pidfile.exists() and pidfile.read_text().strip() != "", what="the check's pid file")
    await eventually(lambda: not group_alive(int(pidfile.read_text())), what="the timed-out check's group to die")
    assert missing.not_run is not None and "no-such-command-here" in missing.not_run
    assert (missing.to_evidence().outcome, missing.exit_code) == (CheckOutcome.NOT_RUN, None)
    assert missing.output_tail == missing.not_run
    assert tail.output_tail == "789\n" and tail.output_bytes == 11
    assert tail.to_evidence().output_sha256 == tail.output_sha256


async def test_a_check_sees_nothing_of_the_shim(job_pod: JobPod, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    await _finished_agent(job_pod, tree)
    async with job_pod.connect() as link:
        env = await link.run_check(CheckSpec(name="env", command=["env"]))
        key = await link.run_check(CheckSpec(name="key", command=["cat", str(job_pod.key_file)]))
        job = await link.run_check(CheckSpec(name="job", command=["ls", str(job_pod.job_root / "home")]))
        write = await link.run_check(CheckSpec(name="write", command=["touch", str(job_pod.shim_dir / "planted")]))
        net = await link.run_check(
            CheckSpec(
                name="net",
                command=["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {job_pod.port}))"],
            )
        )
    assert env.exit_code == 0
    names = {line.split("=", 1)[0] for line in env.output_tail.splitlines()}
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PWD", "SHLVL", "_", "LC_CTYPE"}
    assert CANARY not in env.output_tail and "HELMHIVE" not in env.output_tail
    assert f"HOME={job_pod.shim_dir}/tmp" in env.output_tail
    # Refused by the sandbox (the test runs as root: permission bits would not stop it).
    assert key.exit_code != 0 and "Permission denied" in key.output_tail
    assert job_pod.key.hex() not in key.output_tail
    assert job.exit_code != 0 and "Permission denied" in job.output_tail  # the job volume is not the check's
    assert write.exit_code != 0 and not (job_pod.shim_dir / "planted").exists()
    assert net.not_run is None and net.exit_code not in (0, None)  # no TCP connect at all
    assert "PermissionError" in net.output_tail


def test_carving_a_read_path_around_the_key(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "helmhive-link").mkdir(parents=True)
    (etc / "ssl").mkdir()
    (etc / "hosts").write_text("")
    (etc / "to-key").symlink_to(etc / "helmhive-link")
    usr = tmp_path / "usr"
    usr.mkdir()
    granted = carve_read_paths([str(etc), str(usr), str(tmp_path / "absent")], [str(etc / "helmhive-link")])
    assert sorted(granted) == sorted([str(etc / "hosts"), str(etc / "ssl"), str(usr)])
    assert carve_read_paths([str(etc / "helmhive-link" / "x")], [str(etc / "helmhive-link")]) == []
    assert os.path.isdir(etc / "helmhive-link")  # carving only reads

"""Implementation jobs of governed changes: the runner checks out the exact commit, then computes,
stores and bounds the patch itself, and runs the checks in the sandbox with the network disabled.

Everything is real: the runner program against the API server, the reference agent over ACP in
the Landlock sandbox (its governed directives make the edits), and a ``git daemon`` on loopback
serving a repository the test builds.
"""

from __future__ import annotations

import hashlib
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from harness import wait_for
from helmhive.api.common import JobKind

from .execution_governed import MANIFEST_CHECK, GovernedRig, fresh_clone, git, governed, tree_manifest
from .execution_harness import condition
from .program_harness import CANARY

__all__ = ["governed"]

IMPL = JobKind.CHANGE_IMPLEMENTATION
FILES = {
    "README.md": "# demo\n",
    "src/app.py": "print('hello')\n",
    "old.txt": "to be deleted\n",
    "data/blob.bin": bytes(range(256)) * 4,
}


def _ended(job: dict[str, Any]) -> tuple[str, str, str]:
    cond = condition(job, "Succeeded")
    assert cond is not None
    return cond["status"], cond["reason"], cond["message"]


def _event(governed: GovernedRig, name: str, reason: str) -> str:
    """The message of the job's one Event of ``reason``, waited for."""
    (event,) = governed.execution.wait_events(name, reason)
    return str(event.message)


def test_the_patch_is_computed_stored_whole_and_applies_to_the_exact_commit(
    governed: GovernedRig, tmp_path: Path
) -> None:
    repo = governed.repo("app", FILES)
    commit = repo.head
    repo.commit({"README.md": "# a later commit the job must not see\n"})
    runner = governed.execution.start_runner()
    governed.create(
        "impl",
        runner=runner,
        kind=IMPL,
        directives=(
            "APPEND-LINE: README.md :: a line appended by the agent",
            "REPLACE-TEXT: src/app.py :: hello => governed",
            "DELETE-FILE: old.txt",
            "WRITE-BYTES: assets/new.bin :: 3000",
            "REPLACE-TEXT: data/blob.bin :: ABC => xyz",
        ),
        source=governed.source(repo, commit),
        checks=[{"name": "manifest", "command": MANIFEST_CHECK, "timeoutSeconds": 60}],
    )
    job = governed.execution.wait_finished("impl")
    status, reason, message = _ended(job)
    assert (status, reason) == ("True", "Completed"), job["status"]
    ref, text = governed.stored_patch(job)
    raw = text.encode()
    assert ref == {
        "configMap": "impl-artifacts",
        "key": "patch.diff",
        "bytes": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "files": 5,
    }
    assert f"sha256 {ref['sha256']}" in message and "ChecksPassed" in message
    assert "deleted file mode" in text and "new file mode" in text and "GIT binary patch" in text
    assert "# a later commit" not in text  # against the exact commit, not the branch's head
    artifact = {a["key"]: a for a in job["status"]["result"]["artifacts"]}["patch.diff"]
    assert (artifact["sha256"], artifact["truncated"]) == (ref["sha256"], False)

    # The stored patch, read back through the API, applies to a fresh clone of the exact commit
    # and rebuilds the agent's tree byte for byte (the manifest check ran on the agent's tree).
    clone = fresh_clone(repo, commit, tmp_path / "clone")
    check = git(clone, "apply", "--check", "--binary", "-", stdin=raw)
    assert check.returncode == 0, check.stderr
    assert git(clone, "apply", "--binary", "-", stdin=raw).returncode == 0
    (evidence,) = job["status"]["result"]["checks"]
    assert (evidence["name"], evidence["outcome"], evidence["exitCode"]) == ("manifest", "Passed", 0)
    assert evidence["outputTail"] == tree_manifest(clone)
    assert not (clone / "old.txt").exists() and (clone / "assets/new.bin").read_bytes()[:1] == b"\0"
    assert (clone / "README.md").read_text() == "# demo\na line appended by the agent\n"

    assert "ChecksPassed" in _event(governed, "impl", "ChecksPassed")
    started = _event(governed, "impl", "Started")
    assert f"source {governed.daemon.url_for(repo)} at {commit}" in started
    assert not list((runner.rig.state_dir / "jobs").iterdir())  # the job's tree and git dir are gone


def test_an_implementation_that_changes_nothing_ends_with_no_changes(governed: GovernedRig) -> None:
    repo = governed.repo("app", FILES)
    runner = governed.execution.start_runner()
    governed.create("idle", runner=runner, kind=IMPL, source=governed.source(repo))
    job = governed.execution.wait_finished("idle")
    status, reason, message = _ended(job)
    assert (status, reason) == ("False", "NoChanges")
    assert repo.head in message and job["status"]["result"].get("patch") is None
    with pytest.raises(ApiException) as missing:
        governed.config_map("idle-artifacts")
    assert missing.value.status == 404


def test_a_patch_over_the_maximum_is_refused_never_cut(governed: GovernedRig) -> None:
    repo = governed.repo("app", FILES)
    runner = governed.execution.start_runner()
    governed.create(
        "huge",
        runner=runner,
        kind=IMPL,
        directives=("WRITE-BYTES: big.bin :: 300000", "APPEND-LINE: README.md :: small"),
        source=governed.source(repo),
    )
    job = governed.execution.wait_finished("huge")
    status, reason, message = _ended(job)
    assert (status, reason) == ("False", "PatchTooLarge")
    assert "262144-byte maximum" in message and "never cut" in message
    assert job["status"]["result"].get("patch") is None
    with pytest.raises(ApiException) as missing:
        governed.config_map("huge-artifacts")
    assert missing.value.status == 404


def test_checks_leave_bounded_evidence_and_a_failing_check_does_not_fail_the_job(governed: GovernedRig) -> None:
    repo = governed.repo("app", FILES)
    runner = governed.execution.start_runner()
    chatty = "i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done"
    governed.create(
        "checked",
        runner=runner,
        kind=IMPL,
        directives=("APPEND-LINE: README.md :: checked",),
        source=governed.source(repo),
        checks=[
            {"name": "passes", "command": ["sh", "-c", "grep -q checked README.md && echo fine"]},
            {"name": "fails", "command": ["sh", "-c", "echo broken >&2; exit 3"]},
            {"name": "missing", "command": ["no-such-check-tool", "--flag"]},
            {"name": "chatty", "command": ["sh", "-c", chatty]},
            {"name": "environment", "command": ["sh", "-c", "env | sort"]},
        ],
    )
    job = governed.execution.wait_finished("checked")
    status, reason, message = _ended(job)
    assert (status, reason) == ("True", "Completed"), job["status"]
    assert "ChecksFailed: 2 of 5 check(s) did not pass" in message
    evidence = {e["name"]: e for e in job["status"]["result"]["checks"]}
    assert list(evidence) == ["passes", "fails", "missing", "chatty", "environment"]  # in order
    assert (evidence["passes"]["outcome"], evidence["passes"]["exitCode"]) == ("Passed", 0)
    assert evidence["passes"]["outputTail"] == "fine\n"
    fails = evidence["fails"]
    assert (fails["outcome"], fails["exitCode"], fails["outputTail"]) == ("Failed", 3, "broken\n")
    assert fails["outputSha256"] == hashlib.sha256(b"broken\n").hexdigest() and fails["outputBytes"] == 7
    assert evidence["missing"]["outcome"] == "NotRun" and "no-such-check-tool" in evidence["missing"]["outputTail"]
    assert evidence["missing"].get("exitCode") is None

    whole = "".join(f"line-{i}\n" for i in range(3000)).encode()
    chatty_evidence = evidence["chatty"]
    assert chatty_evidence["outputBytes"] == len(whole)
    assert chatty_evidence["outputSha256"] == hashlib.sha256(whole).hexdigest()
    assert chatty_evidence["outputTail"] == whole.decode()[-4096:]

    env = dict(line.split("=", 1) for line in evidence["environment"]["outputTail"].splitlines() if "=" in line)
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PWD", "SHLVL", "_", "OLDPWD"}, env
    assert env["HOME"] == env["TMPDIR"] and env["HOME"].startswith(str(runner.rig.state_dir / "jobs"))
    assert CANARY not in evidence["environment"]["outputTail"]

    (warning,) = governed.execution.wait_events("checked", "ChecksFailed")
    assert str(warning.message).startswith("ChecksFailed: 2 of 5") and warning.type == "Warning"


def _running(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False)
    return found.stdout.split()


def test_a_hanging_check_is_killed_with_its_process_group_at_its_timeout(governed: GovernedRig) -> None:
    repo = governed.repo("app", FILES)
    runner = governed.execution.start_runner()
    # Sleeps no other run of this test on the machine has (pgrep sees every process), e.g. 7301.48213.
    tag = f"{secrets.randbelow(90000) + 10000}"
    governed.create(
        "hangs",
        runner=runner,
        kind=IMPL,
        directives=("APPEND-LINE: README.md :: x",),
        source=governed.source(repo),
        checks=[
            {
                "name": "hang",
                "command": ["sh", "-c", f"echo started; sleep 7301.{tag} & sleep 7302.{tag}"],
                "timeoutSeconds": 2,
            },
            {"name": "after", "command": ["true"]},
        ],
    )
    job = governed.execution.wait_finished("hangs")
    assert _ended(job)[:2] == ("True", "Completed")
    hang, after = job["status"]["result"]["checks"]
    assert (hang["outcome"], hang.get("exitCode"), hang["outputTail"]) == ("TimedOut", None, "started\n")
    assert hang["durationSeconds"] >= 2  # it was given its whole timeout
    assert after["outcome"] == "Passed"  # the next check still ran
    # The check's background child was killed with it (SIGKILL lands when the process is next
    # scheduled, so wait for it to be gone; left alone it would sleep for two hours).
    wait_for(lambda: _running(rf"sleep 730[12]\.{tag}") == [], timeout=30, describe="the check's sleeps to be gone")


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()


def test_checks_run_with_the_network_disabled(governed: GovernedRig, listener: int) -> None:
    with socket.create_connection(("127.0.0.1", listener), timeout=2):
        pass  # outside the sandbox the port is open
    repo = governed.repo("app", FILES)
    runner = governed.execution.start_runner()
    connect = f"import socket; socket.create_connection(('127.0.0.1', {listener}), timeout=5); print('connected')"
    bind = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1); print('listening')"
    governed.create(
        "offline",
        runner=runner,
        kind=IMPL,
        directives=("APPEND-LINE: README.md :: x",),
        source=governed.source(repo),
        checks=[
            {"name": "connect", "command": [sys.executable, "-c", connect]},
            {"name": "listen", "command": [sys.executable, "-c", bind]},
        ],
    )
    job = governed.execution.wait_finished("offline")
    assert _ended(job)[:2] == ("True", "Completed")
    for evidence in job["status"]["result"]["checks"]:
        assert evidence["outcome"] == "Failed", evidence
        assert "PermissionError" in evidence["outputTail"] and "connected" not in evidence["outputTail"]
        assert "listening" not in evidence["outputTail"]


def test_a_repository_cannot_plant_code_in_the_sandbox_launcher(governed: GovernedRig, tmp_path: Path) -> None:
    """The agent and each check start in the checkout; a ``helmhive`` package there must not be
    imported by ``python -m helmhive.runner.sandbox.landlock`` before the sandbox is in force."""
    marker = tmp_path / "escaped"
    planted = f"open({str(marker)!r}, 'w').write('ran outside the sandbox')\n"
    files = {**FILES, "helmhive/__init__.py": planted, "helmhive/runner/__init__.py": planted}
    repo = governed.repo("planted", files)
    runner = governed.execution.start_runner()
    governed.create(
        "planted",
        runner=runner,
        kind=IMPL,
        directives=("APPEND-LINE: README.md :: x",),
        source=governed.source(repo),
        checks=[{"name": "runs", "command": ["true"]}],
    )
    job = governed.execution.wait_finished("planted")
    assert _ended(job)[:2] == ("True", "Completed"), job["status"]
    assert job["status"]["result"]["checks"][0]["outcome"] == "Passed"
    assert not marker.exists()

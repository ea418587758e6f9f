"""The ACP adapter's session fork and its ``fs/*`` client methods, against the reference agent over stdio."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helmhive.runner.adapters import TurnOutcome, TurnRequest
from helmhive.runner.adapters.acp_process import FsPolicy

from .agent_harness import AdapterFactory, MethodLog

CANARY_PREFIX = "canary-sess-9d1e"


async def test_fork_starts_a_new_session_seeded_from_the_old_one(
    make_adapter: AdapterFactory, workdir: str, method_log: MethodLog
) -> None:
    adapter = make_adapter(extra_env={"HELMHIVE_REFERENCE_AGENT_SESSION_PREFIX": CANARY_PREFIX})
    first = await adapter.run_turn(TurnRequest(prompt="remember this", cwd=workdir))
    assert first.ok and first.native_session_id is not None
    base = first.native_session_id.get_secret_value()
    assert base.startswith(CANARY_PREFIX)
    forked = await adapter.run_turn(
        TurnRequest(prompt="go on", cwd=workdir, session_id=first.native_session_id, fork=True)
    )
    assert forked.ok and forked.session_forked and not forked.session_resumed
    assert forked.native_session_id is not None and forked.native_session_id.get_secret_value() != base
    assert "turn=2" in forked.text  # the fork carries the base session's history
    again = await adapter.run_turn(
        TurnRequest(prompt="again", cwd=workdir, session_id=first.native_session_id, fork=True)
    )
    assert "turn=2" in again.text  # a branch from the same base, not a continuation of the first fork
    assert method_log.count("session/fork") == 2
    for result in (first, forked, again):  # the id is in no rendering of the result
        assert CANARY_PREFIX not in result.model_dump_json() and CANARY_PREFIX not in repr(result)


async def test_fork_fails_closed_when_the_agent_cannot_fork(
    make_adapter: AdapterFactory, workdir: str, method_log: MethodLog
) -> None:
    adapter = make_adapter("no-fork")
    first = await adapter.run_turn(TurnRequest(prompt="start", cwd=workdir))
    forked = await adapter.run_turn(
        TurnRequest(prompt="go on", cwd=workdir, session_id=first.native_session_id, fork=True)
    )
    assert forked.outcome is TurnOutcome.FORK_UNSUPPORTED
    assert method_log.count("session/fork") == 0 and method_log.count("session/prompt") == 1
    assert forked.native_session_id is None  # never silently a fresh session


def test_a_fork_needs_a_session_to_fork() -> None:
    with pytest.raises(ValueError, match="fork needs the session_id"):
        TurnRequest(prompt="x", cwd="/", fork=True)


@pytest.mark.parametrize(
    ("access", "expected", "exists"),
    [("read", "refused", False), ("write", "written", True), ("none", "refused", False)],
)
async def test_fs_write_text_file_follows_the_jobs_access(
    make_adapter: AdapterFactory, workdir: str, access: str, expected: str, exists: bool
) -> None:
    adapter = make_adapter(fs_root=workdir, fs_access=access)
    result = await adapter.run_turn(TurnRequest(prompt="ACP-WRITE-FILE: out.txt", cwd=workdir))
    assert result.ok
    assert f"acp-file out.txt: {expected}" in result.text
    assert (Path(workdir) / "out.txt").exists() is exists
    (record,) = result.tool_requests
    assert (record.tool, record.kind, record.allowed) == ("fs/write_text_file", "edit", exists)


def test_fs_policy_keeps_paths_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    (tmp_path / "secret").write_text("x")
    os.symlink(tmp_path / "secret", root / "link")
    policy = FsPolicy(root=str(root), access="write")
    assert policy.check(str(root / "a.txt"), write=True).allowed
    assert policy.check(str(root / "sub" / ".." / "b.txt"), write=True).allowed
    assert not policy.check(str(root / ".." / "secret"), write=False).allowed
    escaped = policy.check(str(root / "link"), write=False)  # a symlink out of the root
    assert not escaped.allowed and "outside" in escaped.reason
    assert not policy.check("relative.txt", write=False).allowed
    read_only = FsPolicy(root=str(root), access="read")
    assert read_only.check(str(root / "a.txt"), write=False).allowed
    assert "read-only" in read_only.check(str(root / "a.txt"), write=True).reason
    assert not FsPolicy(root=None, access="write").check(str(root / "a.txt"), write=True).allowed

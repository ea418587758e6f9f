"""Every way an ACP turn can fail, driven against the reference agent over real stdio.

The tests assert what was done (the outcome and who cancelled, whether a kill was sent, whether
the same process answered the next turn), never how fast: a turn's ``duration_s`` is checked only
where a lower bound follows from the rules (a watchdog fires no earlier than its timeout).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from helmhive.reference_agent.session import (
    CRASH_EXIT_CODE,
    ENV_LEAK_ON_CRASH,
    ENV_SLOW_INTERVAL,
    ENV_SLOW_STEPS,
    ENV_TOKEN,
)
from helmhive.runner.adapters import AuthReason, AuthState, CancelOrigin, TurnOutcome, TurnRequest
from helmhive.runner.adapters.decisions import REDACTED

from .agent_harness import AdapterFactory, MethodLog


async def test_hang_is_cancelled_then_killed_and_the_next_turn_respawns(
    make_adapter: AdapterFactory, method_log: MethodLog, workdir: str
) -> None:
    adapter = make_adapter()
    hung = await adapter.run_turn(TurnRequest(prompt="REFERENCE-AGENT: hang", cwd=workdir))
    assert hung.outcome is TurnOutcome.KILLED
    assert hung.cancel_origin is CancelOrigin.WATCHDOG
    assert hung.agent_exit_code == -9  # SIGKILL
    assert hung.message == "no answer 1s after session/cancel (Watchdog); killed"
    assert hung.duration_s >= 1.9  # no earlier than 1 s idle, then 1 s grace
    assert method_log.methods()[-2:] == ["session/prompt", "session/cancel"]
    assert adapter.process_id is None

    after = await adapter.run_turn(TurnRequest(prompt="still there?", cwd=workdir))
    assert after.outcome is TurnOutcome.COMPLETED
    assert len(set(method_log.pids())) == 2
    assert adapter.process_id == method_log.pids()[-1]


async def test_stall_honouring_cancel_is_an_idle_timeout_without_kill(
    make_adapter: AdapterFactory, method_log: MethodLog, workdir: str
) -> None:
    # A grace far longer than the turn: answering the cancel must end the turn at once, not when
    # the grace runs out (then the agent would have been killed, and the outcome says so).
    adapter = make_adapter(cancel_grace_s=60.0)
    stalled = await adapter.run_turn(TurnRequest(prompt="REFERENCE-AGENT: stall", cwd=workdir))
    assert stalled.outcome is TurnOutcome.IDLE_TIMEOUT
    assert (stalled.stop_reason, stalled.cancel_origin) == ("cancelled", CancelOrigin.WATCHDOG)
    assert stalled.agent_exit_code is None  # no kill was sent
    assert method_log.methods()[-2:] == ["session/prompt", "session/cancel"]
    assert stalled.duration_s >= 1.0  # the watchdog waited its whole idle timeout
    pid = adapter.process_id
    assert pid is not None  # the agent that answered the cancel is still running
    again = await adapter.run_turn(TurnRequest(prompt="next", cwd=workdir))
    assert again.ok
    assert method_log.pids() == [pid] and adapter.process_id == pid  # the same process answered


async def test_steady_updates_keep_the_watchdog_quiet(make_adapter: AdapterFactory, workdir: str) -> None:
    # Updates every 0.25 s against a 2 s idle timeout: a loaded machine may delay an update by
    # seconds before the watchdog would rightly fire. The turn itself outlasts the timeout.
    adapter = make_adapter(
        "slow",
        idle_timeout_s=2.0,
        extra_env={
            ENV_SLOW_STEPS: "12",
            ENV_SLOW_INTERVAL: "0.25",
        },
    )
    result = await adapter.run_turn(TurnRequest(prompt="take your time", cwd=workdir))
    assert result.outcome is TurnOutcome.COMPLETED
    assert result.cancel_origin is None and result.agent_exit_code is None  # the watchdog never acted
    assert result.duration_s > 2.0  # 12 steps of 0.25 s: longer than the idle timeout, never shorter
    assert result.session_updates >= 13


async def test_caller_cancel(make_adapter: AdapterFactory, workdir: str) -> None:
    adapter = make_adapter(idle_timeout_s=30.0)
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, cancel.set)
    result = await adapter.run_turn(TurnRequest(prompt="REFERENCE-AGENT: stall", cwd=workdir), cancel=cancel)
    assert result.outcome is TurnOutcome.CANCELLED
    assert result.cancel_origin is CancelOrigin.CALLER  # not the 30 s watchdog
    assert result.agent_exit_code is None and adapter.process_id is not None  # answered: no kill


async def test_caller_cancel_of_a_hung_agent_kills_it(make_adapter: AdapterFactory, workdir: str) -> None:
    adapter = make_adapter(idle_timeout_s=30.0, cancel_grace_s=0.5)
    cancel = asyncio.Event()
    cancel.set()
    result = await adapter.run_turn(TurnRequest(prompt="REFERENCE-AGENT: hang", cwd=workdir), cancel=cancel)
    assert (result.outcome, result.cancel_origin) == (TurnOutcome.KILLED, CancelOrigin.CALLER)


async def test_crash_mid_turn(make_adapter: AdapterFactory, workdir: str) -> None:
    adapter = make_adapter()
    crashed = await adapter.run_turn(TurnRequest(prompt="REFERENCE-AGENT: crash", cwd=workdir))
    assert crashed.outcome is TurnOutcome.AGENT_CRASHED
    assert crashed.agent_exit_code == CRASH_EXIT_CODE
    assert "crashing mid-turn on request" in crashed.diagnostics
    assert (await adapter.run_turn(TurnRequest(prompt="again", cwd=workdir))).ok


async def test_crash_mode_from_the_environment(make_adapter: AdapterFactory, workdir: str) -> None:
    result = await make_adapter("crash").run_turn(TurnRequest(prompt="anything", cwd=workdir))
    assert (result.outcome, result.agent_exit_code) == (TurnOutcome.AGENT_CRASHED, CRASH_EXIT_CODE)


async def test_unauthenticated_agent(make_adapter: AdapterFactory, method_log: MethodLog, workdir: str) -> None:
    adapter = make_adapter("unauthenticated")
    report = await adapter.probe()
    # The adapter holds no API-key variable (no credential_env), so it has no method to authenticate with.
    assert (report.auth, report.auth_reason) == (AuthState.UNAUTHENTICATED, AuthReason.NO_AUTH_METHOD)
    assert report.auth_methods == ["reference-token"]
    assert report.agent_name == "helmhive-reference-agent"
    assert report.models == []  # no session, so no catalogue
    result = await adapter.run_turn(TurnRequest(prompt="hi", cwd=workdir))
    assert result.outcome is TurnOutcome.AUTH_REQUIRED
    assert result.native_session_id is None
    assert "session/prompt" not in method_log.methods()


async def test_spawn_failure(make_adapter: AdapterFactory, tmp_path: Path, workdir: str) -> None:
    adapter = make_adapter(command=str(tmp_path / "no-such-agent"))
    report = await adapter.probe()
    assert (report.auth, report.auth_reason) == (AuthState.FAILING, AuthReason.SPAWN_FAILED)
    result = await adapter.run_turn(TurnRequest(prompt="hi", cwd=workdir))
    assert result.outcome is TurnOutcome.SPAWN_FAILED


async def test_agent_exiting_before_initialize(make_adapter: AdapterFactory, workdir: str) -> None:
    adapter = make_adapter(command="/bin/sh", args=("-c", "echo 'agent: no licence' >&2; exit 3"))
    report = await adapter.probe()
    assert (report.auth, report.auth_reason) == (AuthState.FAILING, AuthReason.INITIALIZE_FAILED)
    result = await adapter.run_turn(TurnRequest(prompt="hi", cwd=workdir))
    assert (result.outcome, result.agent_exit_code) == (TurnOutcome.AGENT_CRASHED, 3)
    assert "exited (code 3)" in result.message
    assert "no licence" in result.diagnostics


async def test_canary_credential_and_session_id_stay_where_intended(
    make_adapter: AdapterFactory, workdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    canary = "hh-canary-7f3a9c1e5b"
    caplog.set_level(logging.DEBUG)
    adapter = make_adapter(extra_env={ENV_LEAK_ON_CRASH: "1"}, secret_env={ENV_TOKEN: canary})
    report = await adapter.probe()
    done = await adapter.run_turn(TurnRequest(prompt=f"USE-TOOL: Read\nnot the {ENV_TOKEN}", cwd=workdir))
    assert done.ok and done.native_session_id is not None
    session_id = done.native_session_id.get_secret_value()
    # A careless agent prints the credential to stderr as it crashes; the adapter must redact it.
    crashed = await adapter.run_turn(
        TurnRequest(prompt="REFERENCE-AGENT: crash", cwd=workdir, session_id=done.native_session_id)
    )
    assert crashed.outcome is TurnOutcome.AGENT_CRASHED
    assert f"(token {REDACTED})" in crashed.diagnostics  # it did leak, and was redacted

    for result in (done, crashed):
        for rendering in (result.model_dump_json(), repr(result), str(result.model_dump())):
            assert canary not in rendering
            assert session_id not in rendering
    assert canary not in report.model_dump_json()
    assert caplog.records, "expected the adapter to log something"
    assert canary not in caplog.text
    assert session_id not in caplog.text
    # Where it is intended: the caller gets the session ID back, as a secret.
    assert crashed.native_session_id is not None
    assert crashed.native_session_id.get_secret_value() == session_id

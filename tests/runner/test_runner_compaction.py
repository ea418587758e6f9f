"""Compaction driven through the ACP adapter against the reference agent over real stdio.

The reference agent reports ``1000 + 1000 * turns`` tokens of a 10000-token window after each
turn and advertises ``compact`` unless told not to, so each path of
:func:`helmhive.runner.sessions.compaction.run_compaction` is reached with figures the test can predict:
the compact command when it shrinks the session, and archive + a fresh session carrying the
instructions when there is no command, or it fails, stays silent or does not shrink.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from helmhive.api.runnerpool import CompactionSettings
from helmhive.api.session import CompactionMethod
from helmhive.reference_agent.session import ENV_CONTEXT_SIZE
from helmhive.runner.adapters import AcpAdapter, TurnOutcome, TurnRequest, TurnResult
from helmhive.runner.config import ConfigError, load_config
from helmhive.runner.sessions.compaction import run_compaction

from .agent_harness import AdapterFactory, MethodLog

INSTRUCTIONS = "Keep answers short. Canary instruction 7c1f."
LOW = CompactionSettings(watermark_percent=25, command_timeout_seconds=5)  # 2500 of 10000: two turns


def _prompts(state_dir: Path) -> list[dict[str, Any]]:
    lines = (state_dir / "prompts.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


async def _two_turns(make_adapter: AdapterFactory, workdir: str, mode: str = "") -> tuple[AcpAdapter, TurnResult]:
    adapter = make_adapter(mode)
    first = await adapter.run_turn(TurnRequest(prompt="First.", cwd=workdir))
    assert (first.context_used, first.context_size) == (2000, 10000)
    request = TurnRequest(prompt="Second.", cwd=workdir, session_id=first.native_session_id)
    second = await adapter.run_turn(request)
    assert second.ok and second.context_used == 3000  # grows by 1000 a turn, deterministically
    return adapter, second


async def test_usage_and_the_compact_command_are_reported(make_adapter: AdapterFactory, workdir: str) -> None:
    turn = await make_adapter().run_turn(TurnRequest(prompt="Hello.", cwd=workdir))
    assert (turn.context_used, turn.context_size, turn.commands) == (2000, 10000, ["compact"])
    quiet = await make_adapter("no-compact-command").run_turn(TurnRequest(prompt="Hello.", cwd=workdir))
    assert quiet.commands == [] and quiet.context_used == 2000
    sized = make_adapter(extra_env={ENV_CONTEXT_SIZE: "4000"})
    assert (await sized.run_turn(TurnRequest(prompt="Hello.", cwd=workdir))).context_size == 4000


async def test_below_the_watermark_nothing_happens(make_adapter: AdapterFactory, workdir: str) -> None:
    adapter = make_adapter()
    turn = await adapter.run_turn(TurnRequest(prompt="Once.", cwd=workdir))
    request = TurnRequest(prompt="Once.", cwd=workdir)
    done = await run_compaction(
        adapter=adapter, turn=turn, request=request, settings=LOW, instructions=INSTRUCTIONS, cancel=asyncio.Event()
    )
    assert done is None  # 2000 < 2500


async def test_the_advertised_command_compacts_the_same_session(
    make_adapter: AdapterFactory, workdir: str, method_log: MethodLog
) -> None:
    adapter, second = await _two_turns(make_adapter, workdir)
    request = TurnRequest(prompt="Second.", cwd=workdir)
    done = await run_compaction(
        adapter=adapter, turn=second, request=request, settings=LOW, instructions=INSTRUCTIONS, cancel=asyncio.Event()
    )
    assert done is not None and done.method is CompactionMethod.COMPACT_COMMAND
    assert (done.used_before, done.used_after, done.size) == (3000, 2000, 10000)
    assert done.session_id == second.native_session_id  # the same session, smaller
    assert [e["behaviour"] for e in method_log.entries() if e["method"] == "compact"] == ["compact"]
    # The compacted session goes on from its one summary turn.
    after = await adapter.run_turn(TurnRequest(prompt="Third.", cwd=workdir, session_id=done.session_id))
    assert "turn=2 " in after.text and after.context_used == 3000


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("no-compact-command", "no compact command advertised"),
        ("compact-fails", "the compact command failed (ProtocolError)"),
        ("compact-silent", "stayed silent past its window (5s, or the idle timeout if shorter)"),
        # Judged against the context after the checkpoint turn (one more turn: 4000), not before it.
        ("compact-no-shrink", "the compact command left 4000 tokens in context, not fewer than 4000"),
    ],
)
async def test_otherwise_the_session_is_archived_for_a_fresh_one(
    make_adapter: AdapterFactory, workdir: str, method_log: MethodLog, state_dir: Path, mode: str, why: str
) -> None:
    adapter, second = await _two_turns(make_adapter, workdir, mode)
    request = TurnRequest(prompt="Second.", cwd=workdir)
    done = await run_compaction(
        adapter=adapter, turn=second, request=request, settings=LOW, instructions=INSTRUCTIONS, cancel=asyncio.Event()
    )
    assert done is not None and done.method is CompactionMethod.ARCHIVE, done
    assert done.reason.endswith(why), done.reason
    assert (done.used_before, done.used_after) == (3000, 2000)  # the fresh session holds one turn
    assert done.session_id is not None and second.native_session_id is not None
    assert done.session_id.get_secret_value() != second.native_session_id.get_secret_value()
    assert method_log.count("session/new") == 2  # the first session, then the fresh one
    compacts = [e["behaviour"] for e in method_log.entries() if e["method"] == "compact"]
    assert compacts == ([] if mode == "no-compact-command" else [mode.removeprefix("compact-")])
    # The fresh session was told the system prompt, and goes on from it.
    seeds = [p for p in _prompts(state_dir) if INSTRUCTIONS in p["prompt"]]
    assert [p["turn"] for p in seeds] == [1] and "was archived" in seeds[0]["prompt"]
    after = await adapter.run_turn(TurnRequest(prompt="Third.", cwd=workdir, session_id=done.session_id))
    assert after.outcome is TurnOutcome.COMPLETED and "turn=2 " in after.text


def test_a_runner_json_with_bad_compaction_settings_is_refused_with_the_field_path() -> None:
    environ = {
        "HELMHIVE_RUNNER_NAME": "pool-a-0",
        "HELMHIVE_NAMESPACE": "team",
        "HELMHIVE_POOL": "pool-a",
        "HELMHIVE_RUNNER_CONFIG": "/etc/helmhive/runner.json",
        "HELMHIVE_CREDENTIAL_FILE": "/var/run/secret/key",
        "HELMHIVE_CREDENTIAL_GENERATION": "1",
    }
    wire = {"provider": "reference", "adapter": {"type": "acp", "acp": {"command": "agent"}}}
    good = load_config(environ=environ, read_text=lambda path: json.dumps(wire))
    assert good.file.compaction == CompactionSettings()  # safe defaults: 80%, 180 s
    assert (good.file.compaction.watermark_percent, good.file.compaction.command_timeout_seconds) == (80, 180)
    bad = json.dumps({**wire, "compaction": {"watermarkPercent": 0, "commandTimeoutSeconds": 601}})
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ, read_text=lambda path: bad)
    problems = "\n".join(caught.value.problems)
    assert "runner.json.compaction.watermarkPercent" in problems
    assert "runner.json.compaction.commandTimeoutSeconds" in problems

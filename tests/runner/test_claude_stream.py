"""The Claude CLI's stream-json events as the adapter reads them (pure): usage, compaction, outcome.

The event shapes are the ones the real CLI 2.1.332 printed in ``tests/runner/test_claude_cli_compaction.py``
runs; here each edge the real runs cannot steer is fed directly.
"""

from __future__ import annotations

import json
from typing import Any

from helmhive.runner.adapters.base import MAX_LIST, CancelOrigin, TurnOutcome
from helmhive.runner.adapters.claude_compact import build_turn_env, decide_commands
from helmhive.runner.adapters.claude_stream import (
    ClaudeStream,
    consume_line,
    decide_context,
    decide_outcome,
    is_compact_prompt,
)


def _stream(*events: dict[str, Any]) -> ClaudeStream:
    stream = ClaudeStream()
    for event in events:
        consume_line(json.dumps(event).encode(), stream)
    return stream


def _init(model: str = "claude-sonnet-5-5", commands: list[Any] | None = None) -> dict[str, Any]:
    return {"type": "system", "subtype": "init", "session_id": "s-1", "model": model, "slash_commands": commands or []}


def _assistant(usage: dict[str, int], model: str = "claude-sonnet-5-5", text: str = "ok") -> dict[str, Any]:
    message = {"model": model, "content": [{"type": "text", "text": text}], "usage": usage}
    return {"type": "assistant", "session_id": "s-1", "message": message}


def _result(**extra: Any) -> dict[str, Any]:
    usage = {"claude-sonnet-5-5": {"inputTokens": 9, "contextWindow": 200000}}
    return {"type": "result", "subtype": "success", "is_error": False, "result": "", "modelUsage": usage} | extra


def test_the_context_is_the_last_real_model_call_and_the_window_is_the_turn_models() -> None:
    usage = {
        "input_tokens": 100,
        "cache_creation_input_tokens": 20,
        "cache_read_input_tokens": 3000,
        "output_tokens": 7,
    }
    stream = _stream(
        _init(),
        _assistant({"input_tokens": 5, "output_tokens": 1}),
        _assistant(usage),
        _assistant({"input_tokens": 0, "output_tokens": 0}, model="<synthetic>", text="made up by the CLI"),
        _result(),
    )
    assert decide_context(stream) == (3127, 200000)
    assert decide_outcome(stream, None, False, 0) == (TurnOutcome.COMPLETED, "result success")
    assert decide_context(_stream(_init(), _result(modelUsage={}))) == (None, None)  # nothing reported: never compact


def test_a_compact_boundary_leaves_post_tokens_and_a_compact_without_one_is_an_error() -> None:
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "compact_metadata": {"pre_tokens": 9000, "post_tokens": 800},
    }
    done = _stream(_init(), boundary, _result(local_command="compact"))
    assert done.compacted == (9000, 800) and decide_context(done) == (800, 200000)
    assert decide_outcome(done, None, False, 0, compacting=True)[0] is TurnOutcome.COMPLETED

    failed_status = {
        "type": "system",
        "subtype": "status",
        "compact_result": "failed",
        "compact_error": "API Error: 400",
    }
    failed = _stream(_init(), failed_status, _result(local_command="compact"))
    outcome, message = decide_outcome(failed, None, False, 0)
    assert outcome is TurnOutcome.PROTOCOL_ERROR and message.endswith("API Error: 400")
    refused = _stream(_init(), _result(result="/compact isn't available in this environment."))
    outcome, message = decide_outcome(refused, None, False, 0, compacting=True)
    assert outcome is TurnOutcome.PROTOCOL_ERROR and "isn't available" in message
    assert decide_outcome(refused, None, False, 0)[0] is TurnOutcome.COMPLETED  # an ordinary prompt's answer


def test_compact_is_kept_among_many_commands_and_dropped_when_the_cli_may_not_compact() -> None:
    many = [f"skill-{i}" for i in range(MAX_LIST + 10)] + ["compact", 7]
    stream = _stream(_init(commands=many))
    assert len(stream.commands) == MAX_LIST and "compact" in stream.commands
    assert "compact" in decide_commands(stream.commands, {})
    assert "compact" in decide_commands(stream.commands, {"DISABLE_COMPACT": "0"})
    assert "compact" not in decide_commands(stream.commands, {"DISABLE_COMPACT": "1"})


def test_turns_run_without_auto_compaction_unless_the_environment_says_otherwise() -> None:
    assert build_turn_env({"HOME": "/h"}) == {"DISABLE_AUTO_COMPACT": "1", "HOME": "/h"}
    assert build_turn_env({"DISABLE_AUTO_COMPACT": "0"})["DISABLE_AUTO_COMPACT"] == "0"


def test_interruptions_and_compact_prompts() -> None:
    stream = _stream(_init(), {"type": "system", "subtype": "status", "status": "compacting"})
    assert decide_outcome(stream, CancelOrigin.WATCHDOG, False, 130)[0] is TurnOutcome.IDLE_TIMEOUT
    assert decide_outcome(stream, CancelOrigin.WATCHDOG, True, -9)[0] is TurnOutcome.KILLED
    assert decide_outcome(stream, None, False, 1)[0] is TurnOutcome.AGENT_CRASHED
    assert is_compact_prompt("/compact") and is_compact_prompt("  /compact keep the plan\n")
    assert not is_compact_prompt("/compactor") and not is_compact_prompt("please /compact")

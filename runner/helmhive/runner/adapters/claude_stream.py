"""Reading the Claude CLI's ``--output-format stream-json`` stdout: one JSON event a line. Pure.

What a turn's events say, as :class:`ClaudeStream` accumulates them (:func:`consume_line`):

- ``system``/``init``: the session id, the model, and ``slash_commands`` (the commands the
  session offers; ``compact`` among them);
- ``assistant``: text blocks, the ``authentication_failed`` error, and the message's ``usage``
  (a message the CLI made up itself has model ``<synthetic>`` and no usage that means anything);
- ``system``/``compact_boundary``: the CLI compacted the session; ``compact_metadata`` holds
  ``pre_tokens`` and ``post_tokens`` (the context before and after);
- ``system``/``status`` with ``compact_result: failed``: a compaction failed (``compact_error``);
- ``result``: ``is_error``, the answer, ``local_command`` (``compact`` for ``/compact``) and
  ``modelUsage`` with each model's ``contextWindow``.

The context a turn leaves (:func:`decide_context`) is the last real model call's input
(``input_tokens`` + cache reads and writes) plus its output, or ``post_tokens`` if a compaction
came later; the window is the turn model's ``contextWindow``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from helmhive.runner.adapters.base import MAX_LIST, CancelOrigin, TurnOutcome

__all__ = [
    "COMPACT_COMMAND",
    "ClaudeStream",
    "consume_line",
    "decide_context",
    "decide_outcome",
    "is_compact_prompt",
]

COMPACT_COMMAND = "compact"
SYNTHETIC_MODEL = "<synthetic>"
_USAGE_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")


@dataclass
class ClaudeStream:
    """What a turn's stdout said so far."""

    session_id: str | None = None
    model: str | None = None
    text: list[str] = field(default_factory=list)
    result: dict[str, Any] | None = None
    auth_error: str | None = None
    events: int = 0
    commands: tuple[str, ...] = ()
    used: int | None = None
    """The context after the last model call or compaction of the turn (None: nothing reported)."""
    compacted: tuple[int, int | None] | None = None
    """``(pre_tokens, post_tokens)`` of the turn's last ``compact_boundary``."""
    compact_error: str | None = None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _usage_total(usage: Any) -> int | None:
    if not isinstance(usage, dict) or not any(isinstance(usage.get(key), int) for key in _USAGE_KEYS):
        return None
    return sum(_count(usage.get(key)) for key in _USAGE_KEYS)


def consume_line(line: bytes, stream: ClaudeStream) -> None:
    """Fold one stdout line into ``stream``; a line that is not a JSON object is ignored."""
    try:
        event = json.loads(line)
    except ValueError:
        return
    if not isinstance(event, dict):
        return
    stream.events += 1
    kind, subtype = event.get("type"), event.get("subtype")
    if isinstance(event.get("session_id"), str):
        stream.session_id = event["session_id"]
    if kind == "system":
        _system(event, subtype, stream)
    elif kind == "assistant":
        message = event.get("message") or {}
        if not isinstance(message, dict):
            return
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                stream.text.append(block["text"])
        if event.get("error") == "authentication_failed":
            stream.auth_error = "".join(stream.text)[-200:] or "authentication_failed"
        if message.get("model") != SYNTHETIC_MODEL:
            total = _usage_total(message.get("usage"))
            stream.used = total if total is not None else stream.used
    elif kind == "result":
        stream.result = event


def _system(event: dict[str, Any], subtype: Any, stream: ClaudeStream) -> None:
    if subtype == "init":
        model = event.get("model")
        stream.model = model[:128] if isinstance(model, str) else None
        commands = event.get("slash_commands")
        if isinstance(commands, list):
            names = [c[:64] for c in commands if isinstance(c, str)]
            # Bounded, but never at the cost of ``compact``, which the compaction policy looks for.
            stream.commands = tuple(sorted(names, key=lambda name: name != COMPACT_COMMAND)[:MAX_LIST])
    elif subtype == "compact_boundary":
        meta = event.get("compact_metadata") or {}
        pre = meta.get("pre_tokens") if isinstance(meta, dict) else None
        post = meta.get("post_tokens") if isinstance(meta, dict) else None
        post = post if isinstance(post, int) and post >= 0 else None
        stream.compacted = (_count(pre), post)
        stream.used = post
        stream.compact_error = None
    elif subtype == "status" and event.get("compact_result") == "failed":
        stream.compact_error = str(event.get("compact_error") or "compaction failed")[:300]


def decide_context(stream: ClaudeStream) -> tuple[int | None, int | None]:
    """(context used, context window) as the turn left them; None where the CLI did not say."""
    usage = (stream.result or {}).get("modelUsage")
    size: int | None = None
    if isinstance(usage, dict):
        entry = usage.get(stream.model) if stream.model in usage else None
        if entry is None and len(usage) == 1:
            entry = next(iter(usage.values()))
        window = entry.get("contextWindow") if isinstance(entry, dict) else None
        size = window if isinstance(window, int) and window > 0 else None
    return stream.used, size


def is_compact_prompt(prompt: str) -> bool:
    """Whether a turn's prompt is the CLI's own ``/compact`` command (with optional instructions)."""
    words = prompt.strip().split(maxsplit=1)
    return bool(words) and words[0] == f"/{COMPACT_COMMAND}"


def decide_outcome(
    stream: ClaudeStream, origin: CancelOrigin | None, killed: bool, code: int, *, compacting: bool = False
) -> tuple[TurnOutcome, str]:
    """How the turn ended, from the result event (or its absence) and who interrupted it.

    ``compacting``: the prompt was ``/compact``. The CLI ends such a turn with a successful result
    even when it did not compact (disabled, or the summary call failed); only a
    ``compact_boundary`` shows it did, so without one the turn is a ``ProtocolError``.
    """
    if killed:
        return TurnOutcome.KILLED, f"no exit after SIGINT ({origin}); killed"
    if origin is not None:
        return (
            TurnOutcome.IDLE_TIMEOUT if origin is CancelOrigin.WATCHDOG else TurnOutcome.CANCELLED
        ), f"interrupted ({origin})"
    result = stream.result
    if result is None:
        return TurnOutcome.AGENT_CRASHED, f"the CLI exited (code {code}) without a result"
    answer = str(result.get("result") or "")[:500]
    if (compacting or result.get("local_command") == COMPACT_COMMAND) and stream.compacted is None:
        why = stream.compact_error or answer or "no compact_boundary was reported"
        return TurnOutcome.PROTOCOL_ERROR, f"/compact did not compact the session: {why}"
    if not result.get("is_error"):
        return TurnOutcome.COMPLETED, f"result {result.get('subtype', 'success')}"
    if stream.auth_error is not None:
        return TurnOutcome.AUTH_REQUIRED, answer or "authentication failed"
    if str(result.get("subtype", "")).startswith("error_max_turns"):
        return TurnOutcome.TRUNCATED, answer or "maximum turns reached"
    return TurnOutcome.PROTOCOL_ERROR, answer or f"the CLI reported an error ({result.get('subtype')})"

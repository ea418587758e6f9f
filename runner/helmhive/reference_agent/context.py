"""The reference agent's context: the usage it reports and its ``compact`` command. Pure.

Deterministic, so a test can predict every figure (``docs/reference-agent.md#context-and-compaction``):

* a session with *n* stored turns holds ``1000 + 1000 * n`` tokens of a window of
  ``HELMHIVE_REFERENCE_AGENT_CONTEXT_SIZE`` (default 10000); the agent reports it in a
  ``usage_update`` after every answered prompt, after ``session/load`` and after ``/compact``;
* it advertises one command, ``compact`` (``available_commands_update``, sent with every session
  it opens, loads, resumes or forks), unless mode ``no-compact-command``;
* ``/compact`` replaces the stored history with one summary turn, so the context shrinks to
  2000 tokens. Modes ``compact-fails`` (answers an error), ``compact-silent`` (sends nothing until
  ``session/cancel``) and ``compact-no-shrink`` (answers, keeps the history) break it on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "COMPACT_COMMAND",
    "COMPACT_MODES",
    "DEFAULT_CONTEXT_SIZE",
    "CompactBehaviour",
    "compact_behaviour",
    "context_used",
    "is_compact_prompt",
    "parse_context_size",
    "summary_turn",
]

COMPACT_COMMAND = "compact"
COMPACT_DESCRIPTION = "Replace this session's history with a one-turn summary (helmhive reference agent)."
DEFAULT_CONTEXT_SIZE = 10_000
MAX_CONTEXT_SIZE = 10_000_000
BASE_TOKENS = 1_000
TOKENS_PER_TURN = 1_000
COMPACT_MODES = ("compact-fails", "compact-silent", "compact-no-shrink")

CompactBehaviour = str
"""``compact``, ``fails``, ``silent`` or ``no-shrink``."""


def context_used(turns: int) -> int:
    """Tokens in a session's context with ``turns`` stored turns."""
    return BASE_TOKENS + TOKENS_PER_TURN * max(turns, 0)


def parse_context_size(raw: str) -> int:
    """``HELMHIVE_REFERENCE_AGENT_CONTEXT_SIZE``: a whole number of tokens, 1000 to 10,000,000."""
    text = raw.strip()
    if not text:
        return DEFAULT_CONTEXT_SIZE
    if not text.isdigit() or not 1_000 <= int(text) <= MAX_CONTEXT_SIZE:
        raise ValueError(f"must be a whole number from 1000 to {MAX_CONTEXT_SIZE}, not {raw!r}")
    return int(text)


def is_compact_prompt(text: str, *, advertised: bool) -> bool:
    """Whether a prompt runs the compact command: exactly ``/compact``, and only when it is advertised."""
    return advertised and text.strip() == f"/{COMPACT_COMMAND}"


def compact_behaviour(modes: frozenset[str]) -> CompactBehaviour:
    for mode in COMPACT_MODES:
        if mode in modes:
            return mode.removeprefix("compact-")
    return "compact"


@dataclass(frozen=True)
class SummaryTurn:
    prompt: str
    reply: str

    def as_history(self) -> Mapping[str, str]:
        return {"prompt": self.prompt, "reply": self.reply}


def summary_turn(turns: int) -> SummaryTurn:
    """The one turn a compacted session keeps in place of its ``turns`` turns."""
    reply = f"helmhive-reference-agent: compacted {turns} turn(s) into this summary (deterministic, not a model)."
    return SummaryTurn(prompt=f"/{COMPACT_COMMAND}", reply=reply)

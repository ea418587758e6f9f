"""Compaction of resumed session chains: when, how, whether it worked, and its audit record. Pure.

A chain that is resumed job after job grows without bound. After a job's turn, the runner asks
:func:`decide_compaction` whether the session is past the pool's watermark (from the context the
agent reported in its ACP ``usage_update``). If it is, the **checkpoint turn** runs first on the
same session (:func:`build_checkpoint_prompt`, the pool's ``compaction.checkpointPrompt``): the
agent writes down what a successor needs. Then:

* **compact-command**: the agent advertises a compact command (``available_commands_update``,
  a command named ``compact``), so ``/compact`` is sent as a prompt on the same session, as ACP
  runs any advertised command. :func:`decide_command_result` accepts it only when the command
  completed *and* the agent then reported a smaller context than before;
* **archive**: otherwise (no such command, it failed, it stayed silent past its window, or the
  context did not shrink) the session is archived -- its id is dropped from the runner's Secret --
  and a fresh session, seeded with :func:`build_fresh_session_prompt` (the profile's instructions,
  the system prompt of every job, then the checkpoint's answer, bounded by
  :func:`decide_checkpoint_text`), takes its place in the binding. A compact command that failed
  does not run the checkpoint turn a second time: its answer is reused.

So a compaction always leaves a smaller session. The operator records each one as a
``SessionCompacted`` AuditRecord (:func:`build_session_compacted_audit`) from the binding's
``status.compactions`` and ``status.lastCompaction``; it holds figures and names, never a session id.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from helmhive.api.audit import AuditAction, AuditActor, AuditState
from helmhive.api.runnerpool import CompactionSettings
from helmhive.policy.audit.records import build_audit_record

__all__ = [
    "CHECKPOINT_MAX_CHARS",
    "COMPACT_COMMAND_NAMES",
    "DEFAULT_CHECKPOINT_PROMPT",
    "CommandVerdict",
    "CompactionPlan",
    "build_checkpoint_prompt",
    "build_fresh_session_prompt",
    "build_session_compacted_audit",
    "compacted_audit_name",
    "compaction_count",
    "decide_checkpoint_text",
    "decide_command_result",
    "decide_compaction",
]

COMPACT_COMMAND_NAMES = ("compact",)
"""Advertised command names that compact the session they run in (ACP names carry no slash)."""
RUNNER_ACTOR_PREFIX = "helmhive-runner:"
CHECKPOINT_MAX_CHARS = 8000
"""The most of a checkpoint's answer carried into the fresh session (its head; the cut is said)."""
DEFAULT_CHECKPOINT_PROMPT = (
    "Checkpoint: this session is about to be compacted. Write down, for whoever continues this work "
    "without its history: the task, what has been done and where, the decisions taken and why, what "
    "is open, and the next step. Plain text, at most 400 words. Do not change any file."
)


@dataclass(frozen=True, kw_only=True)
class CompactionPlan:
    """A compaction to run after a turn: the command to send (None: archive) and why."""

    command: str | None
    used: int
    size: int
    reason: str


def decide_compaction(
    *, used: int | None, size: int | None, commands: Sequence[str], settings: CompactionSettings
) -> CompactionPlan | None:
    """Whether a session with ``used`` of ``size`` tokens must be compacted, and how to start.

    None when the agent reported no usage (nothing to judge: never compact blind) or the session
    is below the watermark. The first advertised compact command is used; without one, archive.
    """
    if used is None or size is None or size <= 0:
        return None
    if used * 100 < settings.watermark_percent * size:
        return None
    percent = used * 100 // size
    past = f"context {used} of {size} tokens ({percent}%) is at or past the {settings.watermark_percent}% watermark"
    command = next((name for name in commands if name in COMPACT_COMMAND_NAMES), None)
    if command is None:
        return CompactionPlan(command=None, used=used, size=size, reason=f"{past}; no compact command advertised")
    return CompactionPlan(command=command, used=used, size=size, reason=past)


@dataclass(frozen=True, kw_only=True)
class CommandVerdict:
    """What became of a compact command: accepted, or why the session is archived instead."""

    accepted: bool
    reason: str


def decide_command_result(
    *, before: int, completed: bool, outcome: str, used_after: int | None, window_s: float
) -> CommandVerdict:
    """Accept a compact command only if it completed and the agent then reported a smaller context."""
    if not completed:
        if outcome in ("IdleTimeout", "Killed"):
            why = f"the compact command stayed silent past its window ({window_s:g}s, or the idle timeout if shorter)"
            return CommandVerdict(accepted=False, reason=why)
        return CommandVerdict(accepted=False, reason=f"the compact command failed ({outcome})")
    if used_after is None:
        return CommandVerdict(accepted=False, reason="the agent reported no context usage after the compact command")
    if used_after >= before:
        why = f"the compact command left {used_after} tokens in context, not fewer than {before}"
        return CommandVerdict(accepted=False, reason=why)
    return CommandVerdict(accepted=True, reason="")


def build_checkpoint_prompt(settings: CompactionSettings) -> str | None:
    """The checkpoint turn's prompt: the pool's, the built-in one when unset, None when set empty."""
    if settings.checkpoint_prompt is None:
        return DEFAULT_CHECKPOINT_PROMPT
    return settings.checkpoint_prompt.strip() or None


def decide_checkpoint_text(text: str | None) -> str | None:
    """The part of a checkpoint's answer to carry over: stripped, at most :data:`CHECKPOINT_MAX_CHARS`
    (the cut said), None when there is nothing."""
    kept = (text or "").strip()
    if not kept:
        return None
    if len(kept) <= CHECKPOINT_MAX_CHARS:
        return kept
    return kept[:CHECKPOINT_MAX_CHARS] + f"\n[checkpoint cut at {CHECKPOINT_MAX_CHARS} of {len(kept)} characters]"


def build_fresh_session_prompt(*, instructions: str, checkpoint: str | None = None) -> str:
    """The first prompt of the session that replaces an archived one: the system prompt, what the
    archived session's checkpoint turn wrote (if any), and why."""
    carried = (
        f"## Checkpoint of the archived session (written by the agent before it was archived)\n{checkpoint}\n\n"
        if checkpoint
        else ""
    )
    history = (
        "its history is not carried over, only the checkpoint above"
        if checkpoint
        else "its history is not carried over"
    )
    return (
        "## Instructions (from the platform team's profile)\n"
        f"{instructions.strip() or '(none)'}\n"
        "\n"
        f"{carried}"
        "## Session\n"
        "This session continues a chain whose earlier session was archived to keep it small; "
        f"{history}. Acknowledge in one line. Requests follow in later prompts.\n"
    )


def compaction_count(body: Mapping[str, Any] | None) -> int:
    """``status.compactions`` of a SessionBinding (0 when absent or not a number)."""
    raw = ((body or {}).get("status") or {}).get("compactions")
    try:
        return max(int(raw or 0), 0)
    except (TypeError, ValueError):
        return 0


def compacted_audit_name(binding: str, uid: str, count: int) -> str:
    """The AuditRecord name of compaction number ``count`` of one binding."""
    return f"sessionbinding-{binding[:200]}-{uid[:8]}-compaction-{count}"


def build_session_compacted_audit(*, binding: Mapping[str, Any], now: dt.datetime) -> dict[str, Any] | None:
    """The ``SessionCompacted`` record of ``binding``'s latest compaction; None if it has none.

    Before and after are the context figures the agent reported; the actor is the runner that
    wrote the binding's status (its ``spec.runner``). No session id: the binding holds none.
    """
    status = binding.get("status") or {}
    last = status.get("lastCompaction")
    count = compaction_count(binding)
    if not isinstance(last, Mapping) or count <= 0:
        return None
    meta = binding.get("metadata") or {}
    spec = binding.get("spec") or {}
    name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    method = str(last.get("method") or "")[:32]
    before, after, size = last.get("usedBefore"), last.get("usedAfter"), last.get("contextSize")
    details = {key: str(spec.get(key) or "")[:512] for key in ("workspace", "profile", "provider", "runner", "scope")}
    details.update(
        {
            "method": method,
            "compactions": str(count),
            "job": str(last.get("job") or "")[:253],
            "usedBefore": str(before),
            "usedAfter": "unreported" if after is None else str(after),
            "contextSize": str(size),
            "reason": str(last.get("reason") or "")[:512],
        }
    )
    after_text = "unreported" if after is None else f"{after} tokens"
    record = build_audit_record(
        action=AuditAction.SESSION_COMPACTED,
        obj=binding,
        actor=AuditActor(username=f"{RUNNER_ACTOR_PREFIX}{str(spec.get('runner') or 'unknown')[:200]}"),
        before=AuditState(value=f"context {before} of {size} tokens"),
        after=AuditState(value=f"context {after_text} ({method})"),
        message=(
            f"session binding {name} compacted ({method}, compaction {count}): "
            f"context {before} -> {after_text} of {size}"
        )[:1024],
        details=details,
        now=now,
    )
    record["metadata"].pop("generateName", None)
    record["metadata"]["name"] = compacted_audit_name(name, uid, count)
    return record

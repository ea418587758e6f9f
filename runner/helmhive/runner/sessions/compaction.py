"""Compacting a resumed session chain after a job's turn, with the job's own agent.

:func:`run_compaction` is called by the job's execution after an accepted, stored turn of a
session that has a binding (never a fork's: a fork is a branch and is not stored). The decisions
are pure (:mod:`helmhive.policy.sessions.compaction`); this module drives the agent through them:

1. past the pool's watermark, the checkpoint turn first (the pool's ``compaction.checkpointPrompt``,
   unless set empty) on the same session: the agent writes down what a successor needs;
2. with an advertised ``compact`` command: send ``/compact`` as a prompt on the same session, its
   idle window the pool's ``compaction.commandTimeoutSeconds``; accept it only if it completed and
   the agent then reported a smaller context than after the checkpoint;
3. otherwise archive: open a fresh session in the same agent and seed it with the profile's
   instructions and the checkpoint's answer (the checkpoint is not run a second time). Its id
   replaces the old one in the runner's Secret (the caller stores it).

The checkpoint's answer goes only into the agent's own next session: never into a status, an
Event, a log line or an audit record.

The result carries the session id to store as a ``SecretStr`` only; :meth:`Compaction.status`
is what goes into the binding's status, and holds figures and names, never an id.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from helmhive.api.runnerpool import CompactionSettings
from helmhive.api.session import CompactionMethod, SessionCompaction
from helmhive.policy.sessions.compaction import (
    build_checkpoint_prompt,
    build_fresh_session_prompt,
    decide_checkpoint_text,
    decide_command_result,
    decide_compaction,
)
from helmhive.runner.adapters.base import AgentAdapter, TurnRequest, TurnResult
from helmhive.runner.sessions.bindings import SessionStore

__all__ = ["Compaction", "ensure_compacted", "run_compaction"]


@dataclass(frozen=True, kw_only=True)
class Compaction:
    """A compaction that ran: how, the figures, and the session now bound (None if none could be made)."""

    method: CompactionMethod | None
    """None: the archive's fresh session could not be opened; the binding keeps the old session."""
    used_before: int
    used_after: int | None
    size: int
    reason: str
    session_id: SecretStr | None

    def status(self, *, job: str, now: dt.datetime) -> dict[str, Any]:
        """``status.lastCompaction`` of the binding, in wire form (no session id)."""
        assert self.method is not None
        wire = SessionCompaction(
            method=self.method,
            at=now,
            job=job,
            used_before=self.used_before,
            used_after=self.used_after,
            context_size=self.size,
            reason=self.reason[:256],
        ).to_wire()
        # A merge patch keeps keys it does not name: an unreported figure must clear the last one.
        return {"usedAfter": None} | wire

    def figures(self) -> dict[str, int | None]:
        return {"usedBefore": self.used_before, "usedAfter": self.used_after, "contextSize": self.size}

    def describe(self) -> str:
        after = "unreported" if self.used_after is None else str(self.used_after)
        if self.method is None:
            return f"compaction failed, the session is kept as it is: {self.reason}"[:1000]
        return f"compacted ({self.method.value}): context {self.used_before} -> {after} of {self.size} tokens"[:1000]


async def run_compaction(
    *,
    adapter: AgentAdapter,
    turn: TurnResult,
    request: TurnRequest,
    settings: CompactionSettings,
    instructions: str,
    cancel: asyncio.Event,
) -> Compaction | None:
    """Compact the session ``turn`` left if it is past the watermark; None if it is not (or unknown)."""
    plan = decide_compaction(used=turn.context_used, size=turn.context_size, commands=turn.commands, settings=settings)
    if plan is None or turn.native_session_id is None:
        return None
    reason = plan.reason
    checkpoint, before, session, note = await _checkpoint(
        adapter=adapter, turn=turn, request=request, settings=settings, cancel=cancel
    )
    if note:
        reason = f"{reason}; {note}"
    if plan.command is not None and not cancel.is_set():
        window = float(settings.command_timeout_seconds)
        compact = request.model_copy(
            update={
                "prompt": f"/{plan.command}",
                "session_id": session,
                "fork": False,
                "idle_timeout_s": window,
            }
        )
        done = await adapter.run_turn(compact, cancel)
        verdict = decide_command_result(
            before=before if before is not None else plan.used,
            completed=done.ok,
            outcome=done.outcome.value,
            used_after=done.context_used,
            window_s=window,
        )
        if verdict.accepted:
            return Compaction(
                method=CompactionMethod.COMPACT_COMMAND,
                used_before=plan.used,
                used_after=done.context_used,
                size=plan.size,
                reason=reason,
                session_id=session,
            )
        reason = f"{reason}; {verdict.reason}"
    if cancel.is_set():  # the job was cancelled or timed out meanwhile: no new session now
        return Compaction(
            method=None, used_before=plan.used, used_after=None, size=plan.size, reason=reason, session_id=None
        )
    fresh = request.model_copy(
        update={
            "prompt": build_fresh_session_prompt(instructions=instructions, checkpoint=checkpoint),
            "session_id": None,
            "fork": False,
            "idle_timeout_s": None,
        }
    )
    seeded = await adapter.run_turn(fresh, cancel)
    if not seeded.ok or seeded.native_session_id is None:
        why = f"{reason}; the fresh session could not be started ({seeded.outcome.value})"
        return Compaction(
            method=None, used_before=plan.used, used_after=None, size=plan.size, reason=why, session_id=None
        )
    return Compaction(
        method=CompactionMethod.ARCHIVE,
        used_before=plan.used,
        used_after=seeded.context_used,
        size=plan.size,
        reason=reason,
        session_id=seeded.native_session_id,
    )


async def _checkpoint(
    *,
    adapter: AgentAdapter,
    turn: TurnResult,
    request: TurnRequest,
    settings: CompactionSettings,
    cancel: asyncio.Event,
) -> tuple[str | None, int | None, SecretStr | None, str]:
    """The checkpoint turn on the session ``turn`` left: (its answer to carry over, the context the
    agent reported after it, the session to go on with, a note for the reason when it gave nothing)."""
    prompt = build_checkpoint_prompt(settings)
    if prompt is None or cancel.is_set():
        return None, None, turn.native_session_id, ""
    asked = request.model_copy(
        update={"prompt": prompt, "session_id": turn.native_session_id, "fork": False, "idle_timeout_s": None}
    )
    done = await adapter.run_turn(asked, cancel)
    if not done.ok:
        return None, None, turn.native_session_id, f"the checkpoint turn failed ({done.outcome.value})"
    text = decide_checkpoint_text(done.text)
    session = done.native_session_id or turn.native_session_id
    return text, done.context_used, session, "" if text else "the checkpoint turn answered nothing"


async def ensure_compacted(
    *,
    adapter: AgentAdapter,
    request: TurnRequest,
    turn: TurnResult,
    settings: CompactionSettings,
    instructions: str,
    cancel: asyncio.Event,
    sessions: SessionStore,
    binding: str,
    job: str,
    now: Callable[[], dt.datetime],
) -> tuple[Compaction, str | None] | None:
    """Compact if needed and keep the result for ``binding``: (what ran, why it was not kept or None).

    None when no compaction was needed. A compaction is kept by storing the session now bound
    (after an archive, the fresh one's id overwrites the old) and counting it in the binding's
    status in the same write.
    """
    done = await run_compaction(
        adapter=adapter, turn=turn, request=request, settings=settings, instructions=instructions, cancel=cancel
    )
    if done is None:
        return None
    if done.method is None or done.session_id is None:
        return done, done.describe()
    archived = done.method is CompactionMethod.ARCHIVE
    problem = await sessions.store(
        binding=binding,
        session_id=done.session_id,
        turns=1 if archived else 0,
        new_chain=archived,
        job=job,
        now=now(),
        compaction=done.status(job=job, now=now()),
    )
    return done, problem

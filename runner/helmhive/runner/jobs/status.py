"""Pure decisions about the AgentJobs a runner runs: what an event means, how a turn ended, what status says.

Nothing here does I/O or reads the clock. :mod:`helmhive.runner.program.cluster_jobs` feeds watch events to
:func:`decide_job_action`; :mod:`helmhive.runner.jobs.execution` uses the rest to name outcomes and
build the status patches it writes (conditions ``Running``, ``Succeeded`` and ``Ready`` with
fixed reasons, and ``status.result``).

The start and finish patches are :func:`helmhive.policy.agentjob.life.start` and
:func:`helmhive.policy.agentjob.life.finish`; whether a job is finished or running is read by
:func:`helmhive.policy.agentjob.life.parse_agent_job`, as the operator reads it.

A job the runner has started says so in status, so the operator can tell it was running on
this runner: ``Running=True`` (reason ``Started``, the runner named in the message),
``status.result.startedAt``, and ``status.assignment.runner`` (written by the operator).
The same write reports the memory the runner injected (``status.result.memory``).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.reasons import Reason, detailed
from helmhive.policy.agentjob import life as agentjob
from helmhive.policy.agentjob.life import parse_agent_job
from helmhive.policy.timestamps import as_utc
from helmhive.runner.adapters.base import TurnOutcome, TurnResult
from helmhive.runner.sandbox.limits import EnforcedLimits, decide_limit_exceeded

__all__ = [
    "CancelCause",
    "JobAction",
    "JobEnding",
    "JobView",
    "build_final_status",
    "build_running_status",
    "decide_job_action",
    "decide_queued_seconds",
    "decide_turn_failure",
    "decide_unlisted",
    "iso",
    "view_job",
]


def iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decide_queued_seconds(job: Mapping[str, Any], now: dt.datetime) -> float | None:
    """Seconds from the job's creation (its queueing) to ``now``; None without a readable creation time."""
    text = (job.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(text, str):
        return None
    try:
        created = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return round((as_utc(now) - as_utc(created)).total_seconds(), 3)


class CancelCause(enum.StrEnum):
    """Why a running job's turn was cancelled."""

    CANCELLED = "Cancelled"
    """``spec.cancel`` was set."""
    DELETED = "Deleted"
    """The job was deleted."""
    TIMED_OUT = "TimedOut"
    """``spec.timeoutSeconds`` passed."""
    SUPERSEDED = "Superseded"
    """The job is no longer this run's: at a later attempt, or assigned elsewhere. Nothing is
    written for it: its final write is made only at the attempt it started."""


class JobAction(enum.StrEnum):
    RUN = "Run"
    """Assigned here, not started, not finished: queue it."""
    CANCEL = "Cancel"
    """Running here and cancelled or deleted: cancel its turn."""
    CANCEL_PENDING = "CancelPending"
    """Assigned here, never started, and cancelled: finish it as Cancelled without running it."""
    MARK_LOST = "MarkLost"
    """Running on this runner but not in this process: an earlier process died mid-job."""
    FORGET = "Forget"
    """Not (or no longer) this runner's to run: drop it from the queue."""
    IGNORE = "Ignore"


@dataclass(frozen=True, kw_only=True)
class JobView:
    """What the runner needs to know about one AgentJob object."""

    uid: str
    name: str
    runner: str | None
    runner_namespace: str | None
    finished: bool
    running: bool
    cancel: bool
    deleting: bool
    attempts: int = 0
    """``status.attempts``: the operator's re-runs so far (a re-queued job is a new attempt)."""


def view_job(obj: Mapping[str, Any]) -> JobView:
    """The runner's view of a job, with its state as :mod:`helmhive.policy.agentjob.life` reads it."""
    job = parse_agent_job(obj)
    assignment = job.raw_status.get("assignment")
    assignment = assignment if isinstance(assignment, Mapping) else {}
    return JobView(
        uid=job.uid,
        name=job.name,
        runner=assignment.get("runner"),
        runner_namespace=assignment.get("runnerNamespace"),
        finished=job.finished,
        running=job.running,
        cancel=job.cancel,
        deleting=job.deleting,
        attempts=job.attempts,
    )


def decide_job_action(
    *,
    view: JobView,
    event: str,
    runner: str,
    namespace: str,
    in_flight: bool,
    done: bool,
    in_flight_attempt: int | None = None,
) -> tuple[JobAction, CancelCause | None]:
    """What to do about one watch event (``LISTED``, ``ADDED``, ``MODIFIED`` or ``DELETED``).

    ``in_flight_attempt`` is the attempt the running job started at (None: not started yet). A
    ``DELETED`` event carries the job as it last matched the watch's field selector, so a job
    deleted and one re-queued (its assignment removed) look alike: both cancel its turn as
    ``Deleted``. A started run that an event shows assigned elsewhere or at a later attempt (the
    watch missed the re-queue, or a re-list after a gap shows it) is cancelled as
    ``Superseded``: its turns would be spent on an answer nobody may write.
    """
    if event == "DELETED" or view.deleting:
        return (JobAction.CANCEL, CancelCause.DELETED) if in_flight else (JobAction.FORGET, None)
    mine = view.runner == runner and view.runner_namespace in (None, namespace)
    started = in_flight and in_flight_attempt is not None
    if started and not view.finished and (not mine or view.attempts > (in_flight_attempt or 0)):
        return JobAction.CANCEL, CancelCause.SUPERSEDED
    if not mine or view.finished or done:
        return (JobAction.IGNORE, None) if in_flight else (JobAction.FORGET, None)
    if view.cancel:
        return (JobAction.CANCEL, CancelCause.CANCELLED) if in_flight else (JobAction.CANCEL_PENDING, None)
    if in_flight:
        return JobAction.IGNORE, None
    return (JobAction.MARK_LOST, None) if view.running else (JobAction.RUN, None)


def decide_unlisted(*, started: Mapping[str, int | None], listed: Collection[str]) -> list[str]:
    """The started runs (uid -> the attempt each started at) a fresh list of this runner's jobs no
    longer shows: deleted or re-queued while the watch was away. Each is cancelled as
    ``Superseded``; a run not started yet (None) is checked when it starts."""
    return [uid for uid, attempt in started.items() if attempt is not None and uid not in listed]


@dataclass(frozen=True, kw_only=True)
class JobEnding:
    """How a job ends: a fixed reason (maybe with a detail) and a message."""

    succeeded: bool
    reason: str
    message: str


_NAMED_FAILURES = {
    TurnOutcome.AGENT_CRASHED: Reason.AGENT_CRASHED,
    TurnOutcome.KILLED: Reason.AGENT_UNRESPONSIVE,
    TurnOutcome.IDLE_TIMEOUT: Reason.AGENT_UNRESPONSIVE,
    TurnOutcome.FORK_UNSUPPORTED: Reason.FORK_UNSUPPORTED,
    TurnOutcome.RESUME_UNSUPPORTED: Reason.RESUME_UNSUPPORTED,
    TurnOutcome.SESSION_NOT_FOUND: Reason.SESSION_NOT_FOUND,
}


def decide_turn_failure(
    *, result: TurnResult, cause: CancelCause | None, timeout_s: int, limits: EnforcedLimits | None = None
) -> JobEnding:
    """The verdict for a turn that did not complete (or was cut short by ``cause``).

    A cause (timeout, cancel, deletion) names the outcome whatever the agent did on the way
    out; without a cause, a cancelled turn means the runner stopped it (``Interrupted``). An
    agent that ended by itself on one of its ``limits`` is ``ResourceLimitExceeded:<limit>``
    (:func:`~helmhive.runner.sandbox.limits.decide_limit_exceeded`).
    """
    detail = f"{result.outcome.value}: {result.message}".strip(": ")
    if cause is CancelCause.TIMED_OUT:
        return JobEnding(succeeded=False, reason=Reason.TIMED_OUT, message=f"spec.timeoutSeconds ({timeout_s}s) passed")
    if cause is CancelCause.CANCELLED:
        return JobEnding(
            succeeded=False, reason=Reason.CANCELLED, message="spec.cancel was set; the turn was cancelled"
        )
    if cause is CancelCause.DELETED:
        return JobEnding(
            succeeded=False, reason=Reason.CANCELLED, message="the job was deleted; the turn was cancelled"
        )
    if cause is CancelCause.SUPERSEDED:  # never written: the job is no longer this run's
        return JobEnding(
            succeeded=False,
            reason=Reason.INTERRUPTED,
            message="the job was re-queued or assigned elsewhere; this run's turn was cancelled",
        )
    if result.outcome is TurnOutcome.CANCELLED and result.cancel_origin is not None:
        why = "the runner stopped the turn (shutdown or control state)"
        return JobEnding(succeeded=False, reason=Reason.INTERRUPTED, message=why)
    if limits is not None and result.cancel_origin is None and result.outcome is not TurnOutcome.KILLED:
        hit = decide_limit_exceeded(exit_code=result.agent_exit_code, diagnostics=result.diagnostics, limits=limits)
        if hit is not None:
            return JobEnding(
                succeeded=False, reason=detailed(Reason.RESOURCE_LIMIT_EXCEEDED, hit.resource), message=hit.message
            )
    named = _NAMED_FAILURES.get(result.outcome)
    if result.outcome is TurnOutcome.KILLED and result.cancel_origin is not None:
        named = Reason.INTERRUPTED
    if named is not None:
        return JobEnding(succeeded=False, reason=named, message=detail)
    return JobEnding(succeeded=False, reason=detailed(Reason.AGENT_FAILED, result.outcome.value), message=detail)


def build_running_status(
    *,
    job: Mapping[str, Any],
    runner: str,
    message: str,
    session: Mapping[str, Any] | None,
    now: dt.datetime,
    memory: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The start step's status patch (:func:`helmhive.policy.agentjob.life.start`): Running on ``runner``."""
    return agentjob.start(
        parse_agent_job(job), runner=runner, message=message, session=session, now=now, memory=memory
    ).status


def build_final_status(
    *,
    job: Mapping[str, Any],
    verdict: JobEnding,
    result: Mapping[str, Any],
    now: dt.datetime,
) -> dict[str, Any]:
    """The finish step's status patch (:func:`helmhive.policy.agentjob.life.finish`) for ``verdict``."""
    return agentjob.finish(
        parse_agent_job(job),
        succeeded=verdict.succeeded,
        reason=verdict.reason,
        message=verdict.message,
        result=result,
        now=now,
    ).status

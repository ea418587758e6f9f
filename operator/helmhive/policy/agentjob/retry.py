"""Whether a failed AgentJob may be run again automatically. Pure.

The rule (``docs/execution.md``):

* Only failures of the *infrastructure* are retried: the runner died (``RunnerLost``), the
  job's pod was taken away (``JobPodLost:<cause>``, a pool in mode JobPod), the runner stopped or
  was disabled mid-job (``Interrupted``), the agent process crashed (``AgentCrashed``) or stopped
  answering (``AgentUnresponsive``). Everything else -- the
  agent's own answer (``OutputContractViolated``), the requester (``Cancelled``), the budget
  (``TimedOut``), a missing session or capability -- fails the same way again and is final.
* A job that **may have had side effects** is never re-run automatically: it started (its
  ``status.result.startedAt`` is set) and its effective filesystem access is ``write``, or it is
  an implementation job. Someone has to look at what it left behind first.
* Any other job -- read-only, or one that never started -- may be re-run **once**
  (``status.attempts`` counts the re-runs already made).

The operator calls :func:`decide_job_retry` with the job, read once by
:func:`helmhive.policy.agentjob.life.parse_agent_job`, when it sees a job fail; the
runner never re-runs anything on its own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from helmhive.api.common import FilesystemAccess, JobKind
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.agentjob.state import AgentJob
from helmhive.policy.envelopes import ENVELOPES, is_implementation
from helmhive.policy.finality import NOT_RERUN, RETRYABLE_REASONS

__all__ = [
    "MAX_AUTOMATIC_RETRIES",
    "NOT_RERUN",
    "RETRYABLE_REASONS",
    "RetryDecision",
    "decide_job_retry",
    "decide_retry",
    "decide_retry_window",
    "format_span",
]

MAX_AUTOMATIC_RETRIES = 1
"""A job is re-run automatically at most this many times."""


@dataclass(frozen=True, kw_only=True)
class RetryDecision:
    """``retry`` says whether to re-queue the job; ``reason`` is a fixed name, ``message`` says why."""

    retry: bool
    reason: Reason
    message: str


def format_span(delta: dt.timedelta) -> str:
    """``3h``, ``15m``, ``1h30m``, ``2d4h``: the two largest units, rounded down."""
    seconds = max(int(delta.total_seconds()), 0)
    units = [("d", 86400), ("h", 3600), ("m", 60), ("s", 1)]
    parts: list[str] = []
    for name, size in units:
        count, seconds = divmod(seconds, size)
        if count and len(parts) < 2:
            parts.append(f"{count}{name}")
        elif parts:
            break
    return "".join(parts) or "0s"


def decide_retry_window(
    since: dt.datetime, *, now: dt.datetime, window: dt.timedelta, what: str
) -> RetryDecision | None:
    """The ``RetryWindowPassed`` verdict when ``since`` (the failure) is more than ``window`` before ``now``.

    ``what`` starts the message (``"failed"``: "failed 3h ago, outside the 15m re-run window").
    Exactly at the bound is inside; a time after ``now`` (clock skew) is inside.
    """
    age = now - since
    if age <= window:
        return None
    reason = Reason.RETRY_WINDOW_PASSED
    return RetryDecision(
        retry=False,
        reason=reason,
        message=f"{what} {format_span(age)} ago, outside the {format_span(window)} re-run window ({reason.value})",
    )


def _base(reason: str) -> str:
    return reason.split(":", 1)[0]


def decide_retry(
    *,
    job_kind: JobKind,
    filesystem: FilesystemAccess,
    failure_reason: str,
    started: bool,
    attempts: int,
) -> RetryDecision:
    """Decide whether a job that failed with ``failure_reason`` may be run again.

    ``started`` says the runner marked the job Running (it may have acted);
    ``attempts`` is the number of automatic re-runs already made.
    """
    base = _base(failure_reason)
    if base not in {r.value for r in RETRYABLE_REASONS}:
        return RetryDecision(
            retry=False,
            reason=Reason.NOT_RETRYABLE,
            message=f"{failure_reason} is not an infrastructure failure; running the job again would fail the same way",
        )
    writes = filesystem is FilesystemAccess.WRITE or is_implementation(job_kind)
    if started and writes:
        return RetryDecision(
            retry=False,
            reason=Reason.MAY_HAVE_SIDE_EFFECTS,
            message=(
                f"the job started with {filesystem.value} filesystem access ({job_kind.value}) and may have had "
                "side effects; it is never re-run automatically"
            ),
        )
    if attempts >= MAX_AUTOMATIC_RETRIES:
        return RetryDecision(
            retry=False,
            reason=Reason.RETRY_LIMIT_REACHED,
            message=f"already re-run {attempts} time(s); at most {MAX_AUTOMATIC_RETRIES} automatic re-run",
        )
    why = "it never started" if not started else f"it is read-only ({filesystem.value} filesystem access)"
    return RetryDecision(
        retry=True,
        reason=Reason.RETRY_ALLOWED,
        message=f"{failure_reason}: {why}, so it may be run once more",
    )


def decide_job_retry(*, job: AgentJob) -> RetryDecision | None:
    """:func:`decide_retry` for an AgentJob; None while the job has not failed.

    The filesystem access is the bound profile snapshot's; without a snapshot, the envelope's.
    """
    if not job.failed:
        return None
    try:
        kind = JobKind(str(job.raw_spec.get("jobKind")))
    except ValueError:
        return RetryDecision(retry=False, reason=Reason.NOT_RETRYABLE, message="the job kind is unknown")
    snapshot = job.status_part("profile").get("snapshot")
    declared = snapshot.get("filesystem") if isinstance(snapshot, Mapping) else None
    try:
        filesystem = FilesystemAccess(declared or ENVELOPES[kind].filesystem)
    except ValueError:
        filesystem = FilesystemAccess.WRITE  # unknown: assume the worst
    recorded = job.recorded_attempts
    attempts = MAX_AUTOMATIC_RETRIES if recorded is None else recorded  # unreadable: spend no re-run on it
    succeeded = job.condition(ConditionType.SUCCEEDED) or {}
    return decide_retry(
        job_kind=kind,
        filesystem=filesystem,
        failure_reason=str(succeeded.get("reason") or ""),
        started=job.started,
        attempts=attempts,
    )

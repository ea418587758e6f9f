"""Jobs their runner ended with an infrastructure failure: re-queue them, or record why not. Pure.

The runner never re-runs a job. When it ends one ``Succeeded=False`` with a retryable reason
(:data:`helmhive.policy.agentjob.retry.RETRYABLE_REASONS`: ``AgentCrashed``, ``AgentUnresponsive``,
``Interrupted``, or ``RunnerLost`` when it restarted without its journal), the operator calls
:func:`decide_failed_requeue` on the job's event and writes what it returns:

* :func:`~helmhive.policy.agentjob.retry.decide_job_retry` allows a re-run: the **requeue** step
  (:func:`helmhive.policy.agentjob.life.requeue`: only the binding kept, ``attempts + 1``,
  ``Routed=Unknown`` with the failure's reason and the verdict);
* it does not (``MayHaveSideEffects``, ``RetryLimitReached``), ``spec.cancel`` is set, or the
  failure is older than the re-run window (``RetryWindowPassed``, below): the **close** step
  (:func:`helmhive.policy.agentjob.life.close`) adds ``; not re-run: <why>`` to the ``Succeeded``
  and ``Ready`` messages. That verdict is how a later event of the same ended job
  knows it was decided: it writes nothing again.

**The re-run window.** A failure is re-run only if it ended within ``window`` (default
:data:`DEFAULT_RETRY_WINDOW`, the operator's ``HELMHIVE_RETRY_WINDOW_SECONDS``) of the injected
``now``: its ``status.result.completedAt``, else the ``Succeeded`` condition's
``lastTransitionTime``. Otherwise an operator starting after an upgrade would re-run, from its
initial listing, every undecided failure however old. Exactly at the bound is inside; a time after
``now`` (clock skew) is inside; no readable time fails closed (not re-run). The window only
overrides an allowed re-run: a job that may not be re-run anyway keeps that verdict.

Nothing is written for a job that did not fail, failed for a reason that is not retryable (that
ending is final as the runner wrote it), is being deleted, or already carries a verdict (the
lost-runner step writes one with every ``RunnerLost`` it ends a job with). Governed-change jobs
are handled here like any other: :mod:`helmhive.policy.change.jobs` counts a job for which
:func:`decide_pending_requeue` holds as still running, so its Change waits for the re-run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.agentjob.life import NOT_RERUN, AgentJob, StatusPatch, Step, close, requeue
from helmhive.policy.agentjob.retry import (
    RETRYABLE_REASONS,
    RetryDecision,
    decide_job_retry,
    decide_retry_window,
    format_span,
)

__all__ = ["DEFAULT_RETRY_WINDOW", "FailedOutcome", "decide_failed_requeue", "decide_pending_requeue", "failed_at"]

_RETRYABLE = frozenset(r.value for r in RETRYABLE_REASONS)

DEFAULT_RETRY_WINDOW = dt.timedelta(minutes=15)
"""A failure older than this (on the operator's clock) is not re-run automatically."""


@dataclass(frozen=True, kw_only=True)
class FailedOutcome:
    """The write for a failed job (``requeue`` or ``close``), the failure's reason and the retry decision."""

    patch: StatusPatch
    failure: Reason
    retry: RetryDecision

    @property
    def requeued(self) -> bool:
        return self.patch.step is Step.REQUEUE


def _undecided_failure(job: AgentJob) -> tuple[Reason, str] | None:
    """The retryable reason and message of a job that ended failed and has no verdict yet."""
    if job.deleting or not job.failed:
        return None
    succeeded = job.condition(ConditionType.SUCCEEDED) or {}
    base = str(succeeded.get("reason") or "").split(":", 1)[0]
    message = str(succeeded.get("message") or "")
    if base not in _RETRYABLE or NOT_RERUN in message:
        return None
    return Reason(base), message


def _parse_time(value: object) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None  # a zone-less time is not trusted


def failed_at(job: AgentJob) -> dt.datetime | None:
    """When the job ended: ``status.result.completedAt``, else the Succeeded condition's lastTransitionTime."""
    result = job.raw_status.get("result")
    completed = _parse_time(result.get("completedAt")) if isinstance(result, Mapping) else None
    if completed is not None:
        return completed
    succeeded = job.condition(ConditionType.SUCCEEDED) or {}
    return _parse_time(succeeded.get("lastTransitionTime"))


def _outside_window(job: AgentJob, *, now: dt.datetime, window: dt.timedelta) -> RetryDecision | None:
    """The ``RetryWindowPassed`` verdict when the failure ended before ``now - window`` or has no time."""
    ended = failed_at(job)
    if ended is None:
        reason = Reason.RETRY_WINDOW_PASSED
        return RetryDecision(
            retry=False,
            reason=reason,
            message=(
                "the failure has no time (status.result.completedAt, Succeeded lastTransitionTime), so it is not "
                f"known to be within the {format_span(window)} re-run window ({reason.value})"
            ),
        )
    return decide_retry_window(ended, now=now, window=window, what="failed")


def _decide(job: AgentJob) -> RetryDecision | None:
    if job.cancel:
        return RetryDecision(retry=False, reason=Reason.NOT_RETRYABLE, message="spec.cancel is set")
    return decide_job_retry(job=job)


def decide_pending_requeue(job: AgentJob) -> bool:
    """The job ended with a retryable failure and :func:`decide_failed_requeue` may re-queue it.

    It reads no clock: a failure outside the re-run window counts as pending until its
    ``RetryWindowPassed`` verdict is written, on the same event that would have re-queued it.
    """
    if _undecided_failure(job) is None:
        return False
    decision = _decide(job)
    return decision is not None and decision.retry


def decide_failed_requeue(
    job: AgentJob, *, now: dt.datetime, window: dt.timedelta = DEFAULT_RETRY_WINDOW
) -> FailedOutcome | None:
    """Re-queue a job its runner ended with a retryable reason, or record why not; None: nothing to write.

    ``window``: a re-run is allowed only for a failure that ended at most this long before ``now``.
    """
    failure = _undecided_failure(job)
    if failure is None:
        return None
    reason, message = failure
    decision = _decide(job)
    if decision is None:  # not failed after all (decide_job_retry reads the same condition)
        return None
    if decision.retry:
        decision = _outside_window(job, now=now, window=window) or decision
    if decision.retry:
        patch = requeue(job, message=message, retry_message=decision.message, now=now, reason=reason)
    else:
        patch = close(job, why_not_rerun=decision.message, now=now)
    return FailedOutcome(patch=patch, failure=reason, retry=decision)

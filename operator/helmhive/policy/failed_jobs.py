"""Jobs their runner ended with an infrastructure failure: re-queue them, or record why not. Pure.

The runner never re-runs a job. When it ends one ``Succeeded=False`` with a retryable reason
(:data:`helmhive.policy.retry.RETRYABLE_REASONS`: ``AgentCrashed``, ``AgentUnresponsive``,
``Interrupted``, or ``RunnerLost`` when it restarted without its journal), the operator calls
:func:`decide_failed_requeue` on the job's event and writes what it returns:

* :func:`~helmhive.policy.retry.decide_job_retry` allows a re-run: the **requeue** step
  (:func:`helmhive.policy.agentjob.requeue`: only the binding kept, ``attempts + 1``,
  ``Routed=Unknown`` with the failure's reason and the verdict);
* it does not (``MayHaveSideEffects``, ``RetryLimitReached``), or ``spec.cancel`` is set: the
  **close** step (:func:`helmhive.policy.agentjob.close`) adds ``; not re-run: <why>`` to the
  ``Succeeded`` and ``Ready`` messages. That verdict is how a later event of the same ended job
  knows it was decided: it writes nothing again.

Nothing is written for a job that did not fail, failed for a reason that is not retryable (that
ending is final as the runner wrote it), is being deleted, or already carries a verdict (the
lost-runner step writes one with every ``RunnerLost`` it ends a job with). Governed-change jobs
are handled here like any other: :mod:`helmhive.policy.change_jobs` counts a job for which
:func:`decide_pending_requeue` holds as still running, so its Change waits for the re-run.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.agentjob import NOT_RERUN, AgentJob, StatusPatch, Step, close, requeue
from helmhive.policy.retry import RETRYABLE_REASONS, RetryDecision, decide_job_retry

__all__ = ["FailedOutcome", "decide_failed_requeue", "decide_pending_requeue"]

_RETRYABLE = frozenset(r.value for r in RETRYABLE_REASONS)


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
    succeeded = next((c for c in job.conditions if c.get("type") == ConditionType.SUCCEEDED), {})
    base = str(succeeded.get("reason") or "").split(":", 1)[0]
    message = str(succeeded.get("message") or "")
    if base not in _RETRYABLE or NOT_RERUN in message:
        return None
    return Reason(base), message


def _decide(job: AgentJob) -> RetryDecision | None:
    if job.cancel:
        return RetryDecision(retry=False, reason=Reason.NOT_RETRYABLE, message="spec.cancel is set")
    return decide_job_retry(job={"spec": job.raw_spec, "status": job.raw_status})


def decide_pending_requeue(job: AgentJob) -> bool:
    """The job ended with a retryable failure and :func:`decide_failed_requeue` will re-queue it."""
    if _undecided_failure(job) is None:
        return False
    decision = _decide(job)
    return decision is not None and decision.retry


def decide_failed_requeue(job: AgentJob, *, now: dt.datetime) -> FailedOutcome | None:
    """Re-queue a job its runner ended with a retryable reason, or record why not; None: nothing to write."""
    failure = _undecided_failure(job)
    if failure is None:
        return None
    reason, message = failure
    decision = _decide(job)
    if decision is None:  # not failed after all (decide_job_retry reads the same condition)
        return None
    if decision.retry:
        patch = requeue(job, message=message, retry_message=decision.message, now=now, reason=reason)
    else:
        patch = close(job, why_not_rerun=decision.message)
    return FailedOutcome(patch=patch, failure=reason, retry=decision)

"""The retry policy: only infrastructure failures, never a job that may have had side effects, at most once."""

from __future__ import annotations

from typing import Any

import pytest

from helmhive.api.common import FilesystemAccess, JobKind
from helmhive.api.reasons import Reason
from helmhive.policy.agentjob.life import parse_agent_job
from helmhive.policy.agentjob.retry import MAX_AUTOMATIC_RETRIES, decide_job_retry, decide_retry

INFRASTRUCTURE = ["RunnerLost", "Interrupted", "AgentCrashed", "AgentUnresponsive"]
FINAL = [
    "OutputContractViolated",
    "Cancelled",
    "TimedOut",
    "ForkUnsupported",
    "InvalidSpec",
    "AgentFailed:AuthRequired",
]


@pytest.mark.parametrize("reason", INFRASTRUCTURE)
@pytest.mark.parametrize(
    ("kind", "filesystem"),
    [
        (JobKind.REVIEW_PROBE, FilesystemAccess.READ),
        (JobKind.CONNECTION_TEST, FilesystemAccess.NONE),
        (JobKind.CHANGE_PLANNING, FilesystemAccess.READ),
    ],
    ids=["review-read", "connection-none", "planning-read"],
)
def test_read_only_jobs_are_retried_once(reason: str, kind: JobKind, filesystem: FilesystemAccess) -> None:
    first = decide_retry(job_kind=kind, filesystem=filesystem, failure_reason=reason, started=True, attempts=0)
    assert (first.retry, first.reason) == (True, Reason.RETRY_ALLOWED)
    again = decide_retry(job_kind=kind, filesystem=filesystem, failure_reason=reason, started=True, attempts=1)
    assert (again.retry, again.reason) == (False, Reason.RETRY_LIMIT_REACHED)


@pytest.mark.parametrize("reason", INFRASTRUCTURE)
@pytest.mark.parametrize(
    ("kind", "filesystem"),
    [
        (JobKind.IMPLEMENTATION_PROBE, FilesystemAccess.WRITE),
        (JobKind.CHANGE_IMPLEMENTATION, FilesystemAccess.WRITE),
        (JobKind.IMPLEMENTATION_PROBE, FilesystemAccess.READ),  # narrowed, but still an implementation job
    ],
    ids=["probe-write", "change-write", "probe-narrowed"],
)
def test_a_started_job_that_may_have_written_is_never_retried(
    reason: str, kind: JobKind, filesystem: FilesystemAccess
) -> None:
    decision = decide_retry(job_kind=kind, filesystem=filesystem, failure_reason=reason, started=True, attempts=0)
    assert (decision.retry, decision.reason) == (False, Reason.MAY_HAVE_SIDE_EFFECTS)
    assert "never re-run automatically" in decision.message


def test_a_write_job_that_never_started_may_run_once() -> None:
    decision = decide_retry(
        job_kind=JobKind.CHANGE_IMPLEMENTATION,
        filesystem=FilesystemAccess.WRITE,
        failure_reason="Interrupted",
        started=False,
        attempts=0,
    )
    assert (decision.retry, decision.reason) == (True, Reason.RETRY_ALLOWED)
    assert "never started" in decision.message


@pytest.mark.parametrize("reason", FINAL)
def test_failures_of_the_job_itself_are_final(reason: str) -> None:
    decision = decide_retry(
        job_kind=JobKind.REVIEW_PROBE, filesystem=FilesystemAccess.READ, failure_reason=reason, started=True, attempts=0
    )
    assert (decision.retry, decision.reason) == (False, Reason.NOT_RETRYABLE)
    assert reason in decision.message


def _job(kind: str, reason: str | None, *, started: bool, attempts: int = 0, fs: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"attempts": attempts, "conditions": [], "result": {"outcome": reason or "Started"}}
    if started:
        status["result"]["startedAt"] = "2026-01-01T00:00:00Z"
    if reason is not None:
        status["conditions"].append({"type": "Succeeded", "status": "False", "reason": reason})
    if fs is not None:
        status["profile"] = {"snapshot": {"filesystem": fs}}
    return {"spec": {"jobKind": kind}, "status": status}


def test_decide_job_retry_reads_the_job_object() -> None:
    assert decide_job_retry(job=parse_agent_job(_job("review-probe", None, started=True))) is None  # not failed
    lost = decide_job_retry(job=parse_agent_job(_job("review-probe", "RunnerLost", started=True)))
    assert lost is not None and lost.retry
    done = decide_job_retry(
        job=parse_agent_job(_job("review-probe", "RunnerLost", started=True, attempts=MAX_AUTOMATIC_RETRIES))
    )
    assert done is not None and done.reason is Reason.RETRY_LIMIT_REACHED
    # The snapshot's filesystem wins over the envelope's (a connection test never writes).
    writes = decide_job_retry(job=parse_agent_job(_job("policy-suggestion", "AgentCrashed", started=True, fs="write")))
    assert writes is not None and writes.reason is Reason.MAY_HAVE_SIDE_EFFECTS
    unknown = decide_job_retry(job=parse_agent_job(_job("no-such-kind", "RunnerLost", started=True)))
    assert unknown is not None and not unknown.retry


def test_an_unreadable_attempt_count_spends_no_re_run() -> None:
    raw = _job("review-probe", "RunnerLost", started=True)
    raw["status"]["attempts"] = "many"
    job = parse_agent_job(raw)
    assert (job.recorded_attempts, job.attempts) == (None, 0)
    decision = decide_job_retry(job=job)
    assert decision is not None and not decision.retry and decision.reason is Reason.RETRY_LIMIT_REACHED
    assert parse_agent_job(_job("review-probe", "RunnerLost", started=True, attempts=1)).recorded_attempts == 1

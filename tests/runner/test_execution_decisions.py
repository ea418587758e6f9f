"""The runner's pure job decisions: what a watch event means, how a turn's end is named, what status says."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from helmhive.runner.adapters.base import CancelOrigin, TurnOutcome, TurnResult
from helmhive.runner.jobs.status import (
    CancelCause,
    JobAction,
    JobEnding,
    build_final_status,
    build_running_status,
    decide_job_action,
    decide_turn_failure,
    decide_unlisted,
    view_job,
)

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def _job(
    *,
    runner: str | None = "r-0",
    namespace: str | None = "ns",
    succeeded: str | None = None,
    running: str | None = None,
    cancel: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    conditions = [
        {"type": "Routed", "status": "True", "reason": "Assigned", "lastTransitionTime": "2026-06-01T11:00:00Z"}
    ]
    for ctype, status in (("Succeeded", succeeded), ("Running", running)):
        if status is not None:
            conditions.append(
                {"type": ctype, "status": status, "reason": "X", "lastTransitionTime": "2026-06-01T11:00:00Z"}
            )
    meta: dict[str, Any] = {"name": "j", "uid": "u-1", "generation": 1}
    if deleting:
        meta["deletionTimestamp"] = "2026-06-01T11:59:00Z"
    assignment = {"runner": runner, "runnerNamespace": namespace} if runner else None
    return {
        "metadata": meta,
        "spec": {"cancel": cancel},
        "status": {"assignment": assignment, "conditions": conditions},
    }


@pytest.mark.parametrize(
    ("job", "event", "in_flight", "done", "expected"),
    [
        (_job(), "ADDED", False, False, (JobAction.RUN, None)),
        (_job(), "MODIFIED", True, False, (JobAction.IGNORE, None)),
        (_job(runner="r-1"), "ADDED", False, False, (JobAction.FORGET, None)),
        (_job(namespace="elsewhere"), "ADDED", False, False, (JobAction.FORGET, None)),
        (_job(namespace=None), "ADDED", False, False, (JobAction.RUN, None)),
        (_job(succeeded="True"), "MODIFIED", False, False, (JobAction.FORGET, None)),
        (_job(succeeded="False"), "MODIFIED", True, False, (JobAction.IGNORE, None)),
        (_job(), "LISTED", False, True, (JobAction.FORGET, None)),
        (_job(cancel=True), "MODIFIED", True, False, (JobAction.CANCEL, CancelCause.CANCELLED)),
        (_job(cancel=True), "MODIFIED", False, False, (JobAction.CANCEL_PENDING, None)),
        (_job(), "DELETED", True, False, (JobAction.CANCEL, CancelCause.DELETED)),
        (_job(deleting=True), "MODIFIED", True, False, (JobAction.CANCEL, CancelCause.DELETED)),
        (_job(), "DELETED", False, False, (JobAction.FORGET, None)),
        (_job(running="True"), "LISTED", False, False, (JobAction.MARK_LOST, None)),
        (_job(running="True"), "MODIFIED", True, False, (JobAction.IGNORE, None)),
        (_job(running="True", succeeded="False"), "LISTED", False, False, (JobAction.FORGET, None)),
    ],
    ids=[
        "new-assignment",
        "own-update",
        "other-runner",
        "other-namespace",
        "no-namespace-recorded",
        "finished",
        "own-final-write",
        "already-done",
        "cancel-running",
        "cancel-queued",
        "deleted-running",
        "deleting-running",
        "deleted-queued",
        "running-elsewhere-in-time",
        "running-here",
        "lost-but-finished",
    ],
)
def test_decide_job_action(
    job: dict[str, Any], event: str, in_flight: bool, done: bool, expected: tuple[JobAction, CancelCause | None]
) -> None:
    view = view_job(job)
    assert (
        decide_job_action(view=view, event=event, runner="r-0", namespace="ns", in_flight=in_flight, done=done)
        == expected
    )


def _attempt(job: dict[str, Any], attempts: int) -> dict[str, Any]:
    job["status"]["attempts"] = attempts
    return job


@pytest.mark.parametrize(
    ("job", "event", "started_at", "expected"),
    [
        # The watch missed the re-queue; an event or a re-list shows the job assigned elsewhere...
        (_job(runner="r-1"), "LISTED", 0, (JobAction.CANCEL, CancelCause.SUPERSEDED)),
        (_job(runner=None), "MODIFIED", 0, (JobAction.CANCEL, CancelCause.SUPERSEDED)),
        # ... or assigned here again at a later attempt.
        (_attempt(_job(running="True"), 1), "LISTED", 0, (JobAction.CANCEL, CancelCause.SUPERSEDED)),
        (_attempt(_job(), 2), "ADDED", 1, (JobAction.CANCEL, CancelCause.SUPERSEDED)),
        # The same attempt, or a run not started yet (no attempt to compare): nothing to cancel.
        (_attempt(_job(running="True"), 1), "MODIFIED", 1, (JobAction.IGNORE, None)),
        (_attempt(_job(), 1), "MODIFIED", None, (JobAction.IGNORE, None)),
        # Finished (this run's own final write, or the operator's): nothing to cancel.
        (_attempt(_job(runner="r-1", succeeded="False"), 1), "MODIFIED", 0, (JobAction.IGNORE, None)),
        # A DELETED event carries the job as it last matched the selector: deleted and re-queued look alike.
        (_job(), "DELETED", 0, (JobAction.CANCEL, CancelCause.DELETED)),
    ],
    ids=[
        "listed-elsewhere",
        "assignment-removed",
        "later-attempt-listed-here",
        "later-attempt-added-here",
        "same-attempt",
        "not-started",
        "finished",
        "deleted-or-requeued",
    ],
)
def test_a_started_run_that_is_no_longer_this_runs_is_cancelled_as_superseded(
    job: dict[str, Any], event: str, started_at: int | None, expected: tuple[JobAction, CancelCause | None]
) -> None:
    action = decide_job_action(
        view=view_job(job),
        event=event,
        runner="r-0",
        namespace="ns",
        in_flight=True,
        done=False,
        in_flight_attempt=started_at,
    )
    assert action == expected
    # Not in flight, the same events never cancel anything.
    idle = decide_job_action(view=view_job(job), event=event, runner="r-0", namespace="ns", in_flight=False, done=False)
    assert idle[0] is not JobAction.CANCEL


def test_a_relist_cancels_the_started_runs_it_no_longer_shows() -> None:
    started = {"u-1": 0, "u-2": 1, "u-3": None, "u-4": 0}
    assert decide_unlisted(started=started, listed={"u-1", "u-9"}) == ["u-2", "u-4"]  # u-3 is checked when it starts
    assert decide_unlisted(started=started, listed={"u-1", "u-2", "u-3", "u-4"}) == []
    assert decide_unlisted(started={}, listed=set()) == []


def test_a_superseded_turn_is_interrupted_and_says_why() -> None:
    ending = decide_turn_failure(
        result=TurnResult(outcome=TurnOutcome.CANCELLED, message="cancelled", cancel_origin=CancelOrigin.CALLER),
        cause=CancelCause.SUPERSEDED,
        timeout_s=60,
    )
    assert (ending.succeeded, ending.reason) == (False, "Interrupted")
    assert "re-queued or assigned elsewhere" in ending.message


@pytest.mark.parametrize(
    ("outcome", "origin", "cause", "reason"),
    [
        (TurnOutcome.CANCELLED, CancelOrigin.CALLER, CancelCause.TIMED_OUT, "TimedOut"),
        (TurnOutcome.KILLED, CancelOrigin.CALLER, CancelCause.TIMED_OUT, "TimedOut"),
        (TurnOutcome.CANCELLED, CancelOrigin.CALLER, CancelCause.CANCELLED, "Cancelled"),
        (TurnOutcome.CANCELLED, CancelOrigin.CALLER, CancelCause.DELETED, "Cancelled"),
        (TurnOutcome.CANCELLED, CancelOrigin.CALLER, None, "Interrupted"),
        (TurnOutcome.KILLED, CancelOrigin.CALLER, None, "Interrupted"),
        (TurnOutcome.KILLED, None, None, "AgentUnresponsive"),
        (TurnOutcome.IDLE_TIMEOUT, CancelOrigin.WATCHDOG, None, "AgentUnresponsive"),
        (TurnOutcome.AGENT_CRASHED, None, None, "AgentCrashed"),
        (TurnOutcome.FORK_UNSUPPORTED, None, None, "ForkUnsupported"),
        (TurnOutcome.RESUME_UNSUPPORTED, None, None, "ResumeUnsupported"),
        (TurnOutcome.SESSION_NOT_FOUND, None, None, "SessionNotFound"),
        (TurnOutcome.AUTH_REQUIRED, None, None, "AgentFailed:AuthRequired"),
        (TurnOutcome.MODEL_NOT_OFFERED, None, None, "AgentFailed:ModelNotOffered"),
        (TurnOutcome.CANCELLED, None, None, "AgentFailed:Cancelled"),
    ],
)
def test_every_unfinished_turn_gets_a_named_reason(
    outcome: TurnOutcome, origin: CancelOrigin | None, cause: CancelCause | None, reason: str
) -> None:
    result = TurnResult(outcome=outcome, message="why", cancel_origin=origin)
    verdict = decide_turn_failure(result=result, cause=cause, timeout_s=30)
    assert (verdict.succeeded, verdict.reason) == (False, reason)
    assert verdict.message


def test_running_then_final_status() -> None:
    job = _job()
    running = build_running_status(job=job, runner="r-0", message="details", session={"mode": "fresh"}, now=NOW)
    by_type = {c["type"]: c for c in running["conditions"]}
    assert (by_type["Running"]["status"], by_type["Running"]["reason"]) == ("True", "Started")
    assert by_type["Running"]["message"] == "running on runner r-0: details"
    assert by_type["Ready"]["status"] == "Unknown" and by_type["Routed"]["reason"] == "Assigned"
    assert running["result"]["startedAt"] == "2026-06-01T12:00:00Z" and running["result"]["output"] is None
    assert running["session"] == {"mode": "fresh"}
    job["status"].update(running)
    later = NOW + dt.timedelta(seconds=5)
    verdict = JobEnding(succeeded=True, reason="Completed", message="done")
    final = build_final_status(job=job, verdict=verdict, result={"summary": "hi"}, now=later)
    by_type = {c["type"]: c for c in final["conditions"]}
    assert {t: (c["status"], c["reason"]) for t, c in by_type.items() if t != "Routed"} == {
        "Running": ("False", "Completed"),
        "Succeeded": ("True", "Completed"),
        "Ready": ("True", "Completed"),
    }
    assert final["result"]["startedAt"] == "2026-06-01T12:00:00Z"  # kept from Running
    assert final["result"]["completedAt"] == "2026-06-01T12:00:05Z"
    assert (final["result"]["outcome"], final["result"]["summary"]) == ("Completed", "hi")
    assert final["result"]["validationErrors"] is None  # cleared, not left from an earlier attempt

"""The re-run window: a retryable failure is re-run automatically only if it ended recently.

An operator started after an upgrade sees every old undecided failure in its initial listing;
the window (default 15 minutes, on the injected clock) closes the old ones with
``RetryWindowPassed`` instead of re-running them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from helmhive.api.reasons import Reason
from helmhive.controller.runtime import OperatorConfig
from helmhive.policy.agentjob.failed import DEFAULT_RETRY_WINDOW, decide_failed_requeue, failed_at
from helmhive.policy.agentjob.life import NOT_RERUN, Step, apply_merge_patch, parse_agent_job

ENDED = dt.datetime(2026, 3, 1, 11, 0, tzinfo=dt.UTC)
RETRYABLE = ["AgentCrashed", "AgentUnresponsive", "Interrupted", "RunnerLost"]


def _ended(
    reason: str = "AgentCrashed",
    *,
    completed_at: str | None = "2026-03-01T11:00:00Z",
    transition: str | None = "2026-03-01T11:00:00Z",
    kind: str = "review-probe",
    filesystem: str = "read",
    attempts: int = 0,
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = []
    for ctype in ("Running", "Succeeded", "Ready"):
        cond = {"type": ctype, "status": "False", "reason": reason, "message": "the agent exited with exit code 70"}
        if transition is not None:
            cond["lastTransitionTime"] = transition
        conditions.append(cond)
    result: dict[str, Any] = {"outcome": reason, "startedAt": "2026-03-01T10:59:00Z"}
    if completed_at is not None:
        result["completedAt"] = completed_at
    return {
        "metadata": {"namespace": "team", "name": "job", "uid": "u1", "resourceVersion": "7", "generation": 1},
        "spec": {"jobKind": kind, "workspace": "payments"},
        "status": {
            "profile": {
                "name": "probe",
                "revision": "probe-1",
                "hash": "sha256:x",
                "snapshot": {"filesystem": filesystem},
            },
            "observedGeneration": 1,
            "attempts": attempts,
            "assignment": {"runner": "pool-a-0", "provider": "reference"},
            "result": result,
            "conditions": conditions,
        },
    }


def _closed_messages(body: dict[str, Any], patch: dict[str, Any]) -> dict[str, str]:
    after = apply_merge_patch(body["status"], patch)
    return {c["type"]: c["message"] for c in after["conditions"]}


def test_the_default_window_is_fifteen_minutes_and_the_operator_setting_defaults_to_it() -> None:
    assert dt.timedelta(minutes=15) == DEFAULT_RETRY_WINDOW
    assert OperatorConfig().retry_window == DEFAULT_RETRY_WINDOW
    assert OperatorConfig(retry_window_seconds=60).retry_window == dt.timedelta(minutes=1)


@pytest.mark.parametrize("reason", RETRYABLE)
@pytest.mark.parametrize(
    "after",
    [dt.timedelta(0), dt.timedelta(minutes=14, seconds=59), DEFAULT_RETRY_WINDOW],
    ids=["at-once", "inside", "exactly-at-the-bound"],
)
def test_a_failure_within_the_window_is_requeued(reason: str, after: dt.timedelta) -> None:
    outcome = decide_failed_requeue(parse_agent_job(_ended(reason)), now=ENDED + after)
    assert outcome is not None and outcome.requeued and outcome.retry.reason is Reason.RETRY_ALLOWED


@pytest.mark.parametrize("reason", RETRYABLE)
def test_an_old_failure_is_closed_with_the_window_verdict_once(reason: str) -> None:
    body = _ended(reason)
    now = ENDED + dt.timedelta(hours=3)
    outcome = decide_failed_requeue(parse_agent_job(body), now=now)
    assert outcome is not None and not outcome.requeued
    assert outcome.retry.reason is Reason.RETRY_WINDOW_PASSED and outcome.failure.value == reason
    assert outcome.patch.step is Step.CLOSE and set(outcome.patch.status) == {"conditions"}
    verdict = f"{NOT_RERUN}failed 3h ago, outside the 15m re-run window (RetryWindowPassed)"
    messages = _closed_messages(body, outcome.patch.status)
    assert messages["Succeeded"] == messages["Ready"] == f"the agent exited with exit code 70{verdict}"
    # Idempotent: the closed job's later events (even much later) write nothing.
    closed = {**body, "status": apply_merge_patch(body["status"], outcome.patch.status)}
    for later in (now, now + dt.timedelta(days=7)):
        assert decide_failed_requeue(parse_agent_job(closed), now=later) is None


def test_one_second_past_the_bound_is_outside() -> None:
    now = ENDED + DEFAULT_RETRY_WINDOW + dt.timedelta(seconds=1)
    outcome = decide_failed_requeue(parse_agent_job(_ended()), now=now)
    assert outcome is not None and outcome.retry.reason is Reason.RETRY_WINDOW_PASSED
    assert outcome.retry.message == "failed 15m1s ago, outside the 15m re-run window (RetryWindowPassed)"


def test_the_window_is_the_callers_setting() -> None:
    body = parse_agent_job(_ended())
    now = ENDED + dt.timedelta(minutes=20)
    assert decide_failed_requeue(body, now=now).retry.reason is Reason.RETRY_WINDOW_PASSED  # type: ignore[union-attr]
    wide = decide_failed_requeue(body, now=now, window=dt.timedelta(hours=1))
    assert wide is not None and wide.requeued
    narrow = decide_failed_requeue(body, now=ENDED + dt.timedelta(seconds=90), window=dt.timedelta(minutes=1))
    assert narrow is not None and narrow.retry.message == (
        "failed 1m30s ago, outside the 1m re-run window (RetryWindowPassed)"
    )
    week = decide_failed_requeue(body, now=ENDED + dt.timedelta(days=7, hours=2))
    assert week is not None and week.retry.message.startswith("failed 7d2h ago,")


def test_the_condition_time_stands_in_for_a_missing_completed_at() -> None:
    body = _ended(completed_at=None, transition="2026-03-01T10:00:00Z")
    assert failed_at(parse_agent_job(body)) == ENDED - dt.timedelta(hours=1)
    outcome = decide_failed_requeue(parse_agent_job(body), now=ENDED)
    assert outcome is not None and outcome.retry.message.startswith("failed 1h ago,")
    # completedAt wins when both are there.
    recent = _ended(completed_at="2026-03-01T11:00:00Z", transition="2026-03-01T09:00:00Z")
    assert decide_failed_requeue(parse_agent_job(recent), now=ENDED + dt.timedelta(minutes=1)).requeued  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("completed_at", "transition"),
    [(None, None), ("yesterday", None), ("2026-03-01T11:00:00", None), ("", "not a time")],
    ids=["missing", "unreadable", "no-time-zone", "both-unreadable"],
)
def test_a_failure_without_a_readable_time_fails_closed(completed_at: str | None, transition: str | None) -> None:
    body = _ended(completed_at=completed_at, transition=transition)
    assert failed_at(parse_agent_job(body)) is None
    outcome = decide_failed_requeue(parse_agent_job(body), now=ENDED)
    assert outcome is not None and not outcome.requeued and outcome.retry.reason is Reason.RETRY_WINDOW_PASSED
    assert "has no time" in outcome.retry.message and "(RetryWindowPassed)" in outcome.retry.message
    closed = {**body, "status": apply_merge_patch(body["status"], outcome.patch.status)}
    assert decide_failed_requeue(parse_agent_job(closed), now=ENDED) is None


def test_a_failure_stamped_after_now_counts_as_recent() -> None:
    outcome = decide_failed_requeue(parse_agent_job(_ended()), now=ENDED - dt.timedelta(minutes=2))
    assert outcome is not None and outcome.requeued


def test_a_job_that_may_not_be_rerun_anyway_keeps_its_own_verdict_when_old() -> None:
    later = ENDED + dt.timedelta(days=2)
    writer = decide_failed_requeue(parse_agent_job(_ended(kind="implementation-probe", filesystem="write")), now=later)
    assert writer is not None and writer.retry.reason is Reason.MAY_HAVE_SIDE_EFFECTS
    spent = decide_failed_requeue(parse_agent_job(_ended(attempts=1)), now=later)
    assert spent is not None and spent.retry.reason is Reason.RETRY_LIMIT_REACHED

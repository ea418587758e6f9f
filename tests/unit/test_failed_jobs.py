"""The operator's step for jobs their runner ended with an infrastructure failure: re-queue once, or say why not."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from helmhive.api.reasons import Reason
from helmhive.policy.agentjob.failed import decide_failed_requeue, decide_pending_requeue
from helmhive.policy.agentjob.life import NOT_RERUN, Step, apply_merge_patch, parse_agent_job
from helmhive.policy.change.jobs import JobState, view_stage_job

# Five minutes after the failures `_ended` writes (11:00): inside the default 15-minute re-run window.
NOW = dt.datetime(2026, 3, 1, 11, 5, tzinfo=dt.UTC)
BINDING = {"name": "probe", "revision": "probe-1", "hash": "sha256:x", "snapshot": {"filesystem": "read"}}
RETRYABLE = ["AgentCrashed", "AgentUnresponsive", "Interrupted", "RunnerLost"]
FINAL = ["OutputContractViolated", "Cancelled", "TimedOut", "AgentFailed:AuthRequired", "Completed"]


def _ended(
    reason: str,
    *,
    kind: str = "review-probe",
    filesystem: str = "read",
    started: bool = True,
    attempts: int = 0,
    message: str = "the agent exited with exit code 70",
    succeeded: str = "False",
    **spec: Any,
) -> dict[str, Any]:
    conditions = [
        {
            "type": t,
            "status": succeeded,
            "reason": reason,
            "message": message,
            "lastTransitionTime": "2026-03-01T11:00:00Z",
        }
        for t in ("Running", "Succeeded", "Ready")
    ]
    conditions.append({"type": "Routed", "status": "True", "reason": "Routed", "message": "placed on pool-a-0"})
    result: dict[str, Any] = {"outcome": reason, "completedAt": "2026-03-01T11:00:00Z", "summary": "half done"}
    if started:
        result["startedAt"] = "2026-03-01T10:59:00Z"
    return {
        "metadata": {"namespace": "team", "name": "job", "uid": "u1", "resourceVersion": "7", "generation": 1},
        "spec": {"jobKind": kind, "workspace": "payments", **spec},
        "status": {
            "profile": {**BINDING, "snapshot": {"filesystem": filesystem}},
            "observedGeneration": 1,
            "attempts": attempts,
            "assignment": {"runner": "pool-a-0", "provider": "reference"},
            "routing": {"attempts": 0},
            "session": {"binding": "b1", "mode": "fresh"},
            "result": result,
            "conditions": conditions,
        },
    }


@pytest.mark.parametrize("reason", RETRYABLE)
def test_a_read_only_job_ended_by_an_infrastructure_failure_is_requeued_once(reason: str) -> None:
    body = _ended(reason)
    outcome = decide_failed_requeue(parse_agent_job(body), now=NOW)
    assert outcome is not None and outcome.requeued and outcome.failure.value == reason
    assert outcome.retry.reason is Reason.RETRY_ALLOWED
    assert outcome.patch.step is Step.REQUEUE
    after = apply_merge_patch(body["status"], outcome.patch.status)
    # The same shape as the lost-runner re-queue: only the binding (and observedGeneration) kept.
    assert set(after) == {"profile", "observedGeneration", "attempts", "conditions"}
    assert after["attempts"] == 1 and after["profile"]["revision"] == "probe-1"
    routed, reconciling = after["conditions"]
    assert (routed["type"], routed["status"], routed["reason"]) == ("Routed", "Unknown", reason)
    assert (reconciling["type"], reconciling["status"], reconciling["reason"]) == ("Reconciling", "True", reason)
    assert "the agent exited with exit code 70; re-queued: " in routed["message"]
    assert "it is read-only" in routed["message"]
    assert outcome.patch.conditional("7")["metadata"] == {"resourceVersion": "7"}
    # The re-queued job awaits routing again, and the step has nothing more to say about it.
    requeued = {**body, "status": after}
    assert parse_agent_job(requeued).needs_routing
    assert decide_failed_requeue(parse_agent_job(requeued), now=NOW) is None


def test_a_job_that_never_started_may_run_again_even_if_it_would_write() -> None:
    body = _ended("Interrupted", kind="implementation-probe", filesystem="write", started=False)
    outcome = decide_failed_requeue(parse_agent_job(body), now=NOW)
    assert outcome is not None and outcome.requeued and "it never started" in outcome.retry.message


@pytest.mark.parametrize("reason", RETRYABLE)
@pytest.mark.parametrize(("kind", "filesystem"), [("implementation-probe", "write"), ("review-probe", "write")])
def test_a_started_job_that_may_have_written_is_closed_with_the_verdict(
    reason: str, kind: str, filesystem: str
) -> None:
    body = _ended(reason, kind=kind, filesystem=filesystem)
    outcome = decide_failed_requeue(parse_agent_job(body), now=NOW)
    assert outcome is not None and not outcome.requeued
    assert outcome.retry.reason is Reason.MAY_HAVE_SIDE_EFFECTS
    assert outcome.patch.step is Step.CLOSE and set(outcome.patch.status) == {"conditions"}
    after = apply_merge_patch(body["status"], outcome.patch.status)
    by_type = {c["type"]: c for c in after["conditions"]}
    for ctype in ("Succeeded", "Ready"):
        assert by_type[ctype]["status"] == "False" and by_type[ctype]["reason"] == reason  # the runner's ending
        assert by_type[ctype]["message"].startswith("the agent exited with exit code 70; not re-run: the job started")
        assert "side effects" in by_type[ctype]["message"]
        assert by_type[ctype]["lastTransitionTime"] == "2026-03-01T11:00:00Z"
    assert by_type["Running"] == body["status"]["conditions"][0]  # untouched
    assert after["result"] == body["status"]["result"] and after["assignment"] == body["status"]["assignment"]
    # Idempotent: the verdict is recorded, so the next event of the same ended job writes nothing.
    closed = {**body, "status": after}
    assert decide_failed_requeue(parse_agent_job(closed), now=NOW) is None
    assert not decide_pending_requeue(parse_agent_job(closed))


def test_a_job_already_rerun_once_is_closed_with_the_retry_limit() -> None:
    body = _ended("AgentCrashed", attempts=1)
    outcome = decide_failed_requeue(parse_agent_job(body), now=NOW)
    assert outcome is not None and not outcome.requeued and outcome.retry.reason is Reason.RETRY_LIMIT_REACHED
    message = outcome.patch.status["conditions"][1]["message"]
    assert message.endswith(f"{NOT_RERUN}already re-run 1 time(s); at most 1 automatic re-run")


def test_a_cancelled_request_is_not_rerun() -> None:
    body = _ended("AgentUnresponsive", cancel=True)
    outcome = decide_failed_requeue(parse_agent_job(body), now=NOW)
    assert outcome is not None and not outcome.requeued and outcome.retry.reason is Reason.NOT_RETRYABLE
    assert "not re-run: spec.cancel is set" in outcome.patch.status["conditions"][1]["message"]


@pytest.mark.parametrize("reason", FINAL)
def test_other_endings_are_left_as_the_runner_wrote_them(reason: str) -> None:
    body = _ended(reason, succeeded="True" if reason == "Completed" else "False")
    assert decide_failed_requeue(parse_agent_job(body), now=NOW) is None
    assert not decide_pending_requeue(parse_agent_job(body))


def test_jobs_still_running_deleted_or_already_decided_are_left_alone() -> None:
    running = _ended("AgentCrashed", succeeded="Unknown")
    assert decide_failed_requeue(parse_agent_job(running), now=NOW) is None
    deleting = _ended("AgentCrashed")
    deleting["metadata"]["deletionTimestamp"] = "2026-03-01T11:30:00Z"
    assert decide_failed_requeue(parse_agent_job(deleting), now=NOW) is None
    # The lost-runner step writes its own verdict with every RunnerLost it ends a job with.
    lost = _ended("RunnerLost", message="runner pool-a-0 went Offline; not re-run: already re-run 1 time(s)")
    assert decide_failed_requeue(parse_agent_job(lost), now=NOW) is None


def test_a_long_runner_message_is_shortened_so_the_verdict_always_fits() -> None:
    body = _ended("AgentCrashed", kind="implementation-probe", filesystem="write", message="x" * 1024)
    outcome = decide_failed_requeue(parse_agent_job(body), now=NOW)
    assert outcome is not None
    message = outcome.patch.status["conditions"][1]["message"]
    assert len(message) <= 1024 and NOT_RERUN in message
    closed = {**body, "status": apply_merge_patch(body["status"], outcome.patch.status)}
    assert decide_failed_requeue(parse_agent_job(closed), now=NOW) is None


def test_a_governed_job_awaiting_its_rerun_counts_as_running_for_its_change() -> None:
    change = {"change": {"name": "fix", "stage": "planning", "iteration": 1}}
    pending = _ended("AgentCrashed", kind="change-planning", **change)
    assert decide_pending_requeue(parse_agent_job(pending))
    assert view_stage_job(pending).state is JobState.RUNNING  # type: ignore[union-attr]
    spent = _ended("AgentCrashed", kind="change-planning", attempts=1, **change)
    assert view_stage_job(spent).state is JobState.FAILED  # type: ignore[union-attr]
    outcome = decide_failed_requeue(parse_agent_job(spent), now=NOW)
    assert outcome is not None and not outcome.requeued
    closed = {**spent, "status": apply_merge_patch(spent["status"], outcome.patch.status)}
    view = view_stage_job(closed)
    assert view is not None and view.state is JobState.FAILED and "not re-run" in view.message

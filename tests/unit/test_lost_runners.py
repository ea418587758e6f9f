"""Lost runners: which runner holds a job, when a runner counts as lost, and the job's status afterwards."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from helmhive.policy.agentjob.life import decide_held_runner
from helmhive.policy.agentjob.lost import (
    LostVerdict,
    RunnerLiveness,
    build_lost_job_status,
    build_runner_liveness,
    decide_runner_lost,
)
from helmhive.policy.agentjob.retry import MAX_AUTOMATIC_RETRIES

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
EARLIER = "2026-03-01T11:00:00Z"


def _cond(ctype: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": "", "lastTransitionTime": EARLIER}


def _job(
    kind: str = "review-probe",
    *,
    started: bool = True,
    attempts: int = 0,
    succeeded: str | None = None,
    assignment: dict[str, Any] | None = None,
    filesystem: str | None = None,
) -> dict[str, Any]:
    conditions = [_cond("Routed", "True", "Routed")]
    result: dict[str, Any] = {}
    if started:
        conditions.append(_cond("Running", "True", "Started"))
        result = {"outcome": "Started", "startedAt": EARLIER}
    if succeeded is not None:
        conditions.append(_cond("Succeeded", succeeded, "Completed" if succeeded == "True" else "Pending"))
    status: dict[str, Any] = {
        "observedGeneration": 1,
        "attempts": attempts,
        "profile": {"name": "p", "revision": "p-1", "snapshot": {"filesystem": filesystem or "read"}},
        "assignment": {"runner": "claude-0"} if assignment is None else assignment,
        "routing": {"candidates": []},
        "conditions": conditions,
    }
    if result:
        status["result"] = result
    return {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "metadata": {"name": "j", "namespace": "team", "generation": 1, "resourceVersion": "42"},
        "spec": {"jobKind": kind},
        "status": status,
    }


def _conds(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in body["status"]["conditions"]}


# Which runner holds a job --------------------------------------------------------------------------


@pytest.mark.parametrize("started", [True, False], ids=["running", "assigned-not-started"])
@pytest.mark.parametrize("succeeded", [None, "Unknown"], ids=["no-succeeded", "succeeded-unknown"])
def test_an_assigned_unfinished_job_is_held_on_its_runner(started: bool, succeeded: str | None) -> None:
    assert decide_held_runner(_job(started=started, succeeded=succeeded)) == ("team", "claude-0")


def test_the_runner_namespace_comes_from_the_assignment_when_it_names_one() -> None:
    job = _job(assignment={"runner": "claude-0", "runnerNamespace": "runners"})
    assert decide_held_runner(job) == ("runners", "claude-0")


@pytest.mark.parametrize("succeeded", ["True", "False"])
def test_a_finished_job_is_held_on_no_runner(succeeded: str) -> None:
    assert decide_held_runner(_job(succeeded=succeeded)) is None


@pytest.mark.parametrize("assignment", [{}, {"runner": ""}], ids=["no-assignment", "empty-runner"])
def test_a_job_without_a_runner_is_held_on_none(assignment: dict[str, Any]) -> None:
    assert decide_held_runner(_job(assignment=assignment)) is None
    assert decide_held_runner({"metadata": {"name": "j", "namespace": "team"}}) is None


# When a runner counts as lost ----------------------------------------------------------------------


def test_a_missing_runner_is_lost() -> None:
    assert decide_runner_lost(None) == "its runner no longer exists"


def test_an_offline_runner_is_lost_with_its_name() -> None:
    message = decide_runner_lost(RunnerLiveness(namespace="team", name="claude-0", reported_status="Offline"))
    assert message is not None and "claude-0 went Offline" in message


@pytest.mark.parametrize("reported", ["Online", "NeedsAttention", None])
def test_a_runner_that_is_not_offline_is_not_lost(reported: str | None) -> None:
    assert decide_runner_lost(RunnerLiveness(namespace="team", name="claude-0", reported_status=reported)) is None


def test_liveness_reads_only_metadata_and_the_derived_status() -> None:
    body = {"metadata": {"name": "claude-0", "namespace": "team"}, "spec": {"bad": 1}, "status": {"report": "x"}}
    assert build_runner_liveness(body) == RunnerLiveness(namespace="team", name="claude-0", reported_status=None)
    body["status"] = {"reportedStatus": "Offline"}
    assert build_runner_liveness(body).key == ("team", "claude-0")
    assert build_runner_liveness(body).reported_status == "Offline"


# The job's status once its runner is lost ---------------------------------------------------------------

MESSAGE = "runner claude-0 went Offline (its Lease expired) while the job was assigned to it"


@pytest.mark.parametrize("kind", ["implementation-probe", "change-implementation"])
def test_a_started_job_that_may_have_written_ends_and_is_not_rerun(kind: str) -> None:
    job = _job(kind, filesystem="write")
    before = copy.deepcopy(job)
    update = build_lost_job_status(job=job, message=MESSAGE, now=NOW)
    assert job == before, "the input is not mutated"
    assert update.verdict is LostVerdict.ENDED
    body = update.body
    assert body["metadata"]["resourceVersion"] == "42", "the write is conditional on what was read"
    conds = _conds(body)
    for ctype in ("Succeeded", "Ready", "Running"):
        assert (conds[ctype]["status"], conds[ctype]["reason"]) == ("False", "RunnerLost"), ctype
        assert conds[ctype]["lastTransitionTime"] == "2026-03-01T12:00:00Z"
    for ctype in ("Succeeded", "Ready"):
        assert conds[ctype]["message"].startswith(MESSAGE + "; not re-run: ")
        assert "side effects" in conds[ctype]["message"]
    assert conds["Running"]["message"] == MESSAGE
    assert body["status"]["result"] == {
        "outcome": "RunnerLost",
        "startedAt": EARLIER,
        "completedAt": "2026-03-01T12:00:00Z",
        "summary": "",
    }
    assert body["status"]["assignment"] == {"runner": "claude-0"}, "a job that may have written keeps its history"
    assert body["status"]["attempts"] == 0


def test_a_read_only_job_is_requeued_once_with_only_its_binding_kept() -> None:
    update = build_lost_job_status(job=_job("review-probe"), message=MESSAGE, now=NOW)
    assert update.verdict is LostVerdict.REQUEUED
    status = update.body["status"]
    assert set(status) == {"profile", "observedGeneration", "attempts", "conditions"}
    assert status["attempts"] == 1
    assert status["profile"]["revision"] == "p-1"
    routed, reconciling = status["conditions"]
    assert (routed["type"], routed["status"], routed["reason"]) == ("Routed", "Unknown", "RunnerLost")
    assert (reconciling["type"], reconciling["status"], reconciling["reason"]) == ("Reconciling", "True", "RunnerLost")
    assert routed["message"].startswith(MESSAGE + "; re-queued: RunnerLost: it is read-only")
    assert routed["observedGeneration"] == 1
    assert update.body["metadata"]["resourceVersion"] == "42"


def test_a_requeued_job_lost_again_is_not_rerun_a_second_time() -> None:
    job = _job("review-probe", attempts=MAX_AUTOMATIC_RETRIES)
    update = build_lost_job_status(job=job, message=MESSAGE, now=NOW)
    assert update.verdict is LostVerdict.ENDED
    assert "not re-run" in _conds(update.body)["Succeeded"]["message"]
    assert "already re-run 1 time(s)" in _conds(update.body)["Succeeded"]["message"]


def test_a_writing_job_that_never_started_is_requeued_without_a_running_condition() -> None:
    update = build_lost_job_status(
        job=_job("implementation-probe", started=False, filesystem="write"), message=MESSAGE, now=NOW
    )
    assert update.verdict is LostVerdict.REQUEUED
    assert "never started" in _conds(update.body)["Routed"]["message"]
    assert "Running" not in _conds(update.body)


def test_an_unknown_job_kind_ends_and_says_why() -> None:
    update = build_lost_job_status(job=_job("no-such-kind"), message=MESSAGE, now=NOW)
    assert update.verdict is LostVerdict.ENDED
    assert _conds(update.body)["Succeeded"]["message"] == f"{MESSAGE}; not re-run: the job kind is unknown"


# The re-run window: a loss long ago is not re-run -------------------------------------------------------

WINDOW = dt.timedelta(minutes=15)


def _runner(last_heartbeat: str | None) -> RunnerLiveness:
    status: dict[str, Any] = {"reportedStatus": "Offline"}
    if last_heartbeat is not None:
        status["lastHeartbeatTime"] = last_heartbeat
    return build_runner_liveness({"metadata": {"name": "claude-0", "namespace": "team"}, "status": status})


def test_liveness_reads_the_last_heartbeat_and_distrusts_an_unreadable_one() -> None:
    assert _runner("2026-03-01T11:59:00Z").last_heartbeat == dt.datetime(2026, 3, 1, 11, 59, tzinfo=dt.UTC)
    assert _runner("yesterday").last_heartbeat is None
    assert _runner(None).last_heartbeat is None


@pytest.mark.parametrize("heartbeat", ["2026-03-01T11:45:00Z", "2026-03-01T11:59:48Z", "2026-03-01T12:00:05Z"])
def test_a_loss_within_the_window_is_rerun(heartbeat: str) -> None:
    """Exactly at the bound, a moment ago, and a heartbeat after the operator's clock (skew) are inside."""
    update = build_lost_job_status(job=_job(), message=MESSAGE, now=NOW, runner=_runner(heartbeat), window=WINDOW)
    assert update.verdict is LostVerdict.REQUEUED


def test_a_loss_older_than_the_window_ends_with_retry_window_passed() -> None:
    runner = _runner("2026-03-01T09:00:00Z")  # three hours before NOW: the operator was down meanwhile
    update = build_lost_job_status(job=_job(), message=MESSAGE, now=NOW, runner=runner, window=WINDOW)
    assert update.verdict is LostVerdict.ENDED
    succeeded = _conds(update.body)["Succeeded"]
    assert (succeeded["status"], succeeded["reason"]) == ("False", "RunnerLost")
    assert succeeded["message"] == (
        f"{MESSAGE}; not re-run: its runner last renewed its Lease 3h ago, outside the 15m re-run window "
        "(RetryWindowPassed)"
    )
    assert update.body["status"]["attempts"] == 0


def test_a_loss_without_a_time_counts_as_seen_now() -> None:
    """A deleted Runner (None) or one with no heartbeat time: the operator sees the loss as it happens."""
    for runner in (None, _runner(None)):
        update = build_lost_job_status(job=_job(), message=MESSAGE, now=NOW, runner=runner, window=WINDOW)
        assert update.verdict is LostVerdict.REQUEUED


def test_the_window_never_turns_a_job_that_may_not_rerun_into_one_that_may() -> None:
    job = _job("implementation-probe", filesystem="write")
    runner = _runner("2026-03-01T09:00:00Z")
    update = build_lost_job_status(job=job, message=MESSAGE, now=NOW, runner=runner, window=WINDOW)
    assert update.verdict is LostVerdict.ENDED
    assert "side effects" in _conds(update.body)["Succeeded"]["message"]
    assert "RetryWindowPassed" not in _conds(update.body)["Succeeded"]["message"]


def test_the_event_summary_says_why_an_ended_job_is_not_rerun() -> None:
    runner = _runner("2026-03-01T09:00:00Z")
    ended = build_lost_job_status(job=_job(), message=MESSAGE, now=NOW, runner=runner, window=WINDOW)
    assert ended.summary.startswith("ended; not re-run: its runner last renewed its Lease 3h ago")
    requeued = build_lost_job_status(job=_job(), message=MESSAGE, now=NOW, runner=_runner(None), window=WINDOW)
    assert requeued.summary == "re-queued"

"""The chaos run's invariant checks (``benchmarks/chaos_invariants.py``) catch what they are for.

The short chaos run (``tests/operator/test_chaos_short.py``) passes when nothing is violated, so
each check is shown here failing on a made-up history: a job moved to a second runner without a
re-queue, a runner over its slots, a job never ended, an assignment without its record, a
runner transition without its record, a leaked canary; and passing on the documented re-queue.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from chaos_invariants import (
    JobEvent,
    RunnerEvent,
    check_job_audit,
    check_job_history,
    check_over_commit,
    check_runner_audit,
    check_settled,
    sweep_canary,
)


def ev(
    name: str,
    rv: int,
    runner: str | None = None,
    *,
    attempts: int = 0,
    finished: bool = False,
    routed: tuple[str, str] = ("True", "Assigned"),
    reason: str = "",
    relisted: bool = False,
) -> JobEvent:
    return JobEvent(
        name=name,
        uid=f"uid-{name}",
        resource_version=str(rv),
        runner=runner,
        attempts=attempts,
        finished=finished,
        succeeded_reason=reason,
        routed_status=routed[0],
        routed_reason=routed[1],
        relisted=relisted,
    )


def invariants(events: list[JobEvent], concurrency: int = 2) -> list[str]:
    return [v.invariant for v in check_job_history(events, concurrency=concurrency)[0]]


def test_a_job_moved_to_another_runner_without_a_requeue_is_a_double_assignment() -> None:
    assert invariants([ev("a", 1), ev("a", 2, "r0"), ev("a", 3, "r1")]) == ["double-assignment"]
    assert invariants([ev("a", 1, "r0"), ev("a", 2, None)]) == ["double-assignment"]


def test_the_documented_requeue_may_move_a_job_once() -> None:
    requeue = [
        ev("a", 1, "r0"),
        ev("a", 2, None, attempts=1, routed=("Unknown", "RunnerLost")),
        ev("a", 3, "r1", attempts=1),
    ]
    violations, requeues, _ = check_job_history(requeue, concurrency=1)
    assert (violations, requeues) == ([], 1)
    unexplained = [ev("a", 1, "r0"), ev("a", 2, None, attempts=1, routed=("Unknown", "Completed"))]
    assert invariants(unexplained) == ["requeue-without-reason"]
    assert invariants([*requeue, ev("a", 4, None, attempts=2, routed=("Unknown", "RunnerLost"))]) == [
        "re-run-too-often"
    ]
    # A watch gap (a re-list) may hide the re-queue step: no reason can be asked of it.
    assert (
        invariants(
            [ev("a", 1, "r0"), ev("a", 9, None, attempts=1, routed=("False", "NoEligibleRunner"), relisted=True)]
        )
        == []
    )


def test_finished_jobs_stay_finished_and_attempts_never_go_down() -> None:
    assert invariants([ev("a", 1, "r0", finished=True, reason="Completed"), ev("a", 2, "r0")]) == ["unfinished-again"]
    assert invariants([ev("a", 1, None, attempts=1), ev("a", 2, None)]) == ["attempts-decreased"]


def test_a_runner_over_its_concurrency_is_an_over_commit_and_a_finished_job_frees_its_slot() -> None:
    full = [ev("a", 1, "r0"), ev("b", 2, "r0")]
    assert invariants([*full, ev("c", 3, "r0")]) == ["over-commit"]
    assert invariants([*full, ev("a", 3, "r0", finished=True, reason="Completed"), ev("c", 4, "r0")]) == []
    _, _, peak = check_job_history(full, concurrency=2)
    assert peak == 2
    listed = [job("a", "r0"), job("b", "r0"), job("c", "r0")]
    assert [v.invariant for v in check_over_commit(listed, concurrency=2, when="now")] == ["over-commit"]


def test_a_relist_is_judged_as_one_snapshot() -> None:
    """A watch gap hid two jobs finishing; the re-list brings a new job's assignment before them."""
    full = [ev("a", 1, "r0"), ev("b", 2, "r0")]
    relist = [
        ev("c", 9, "r0", relisted=True),  # listed first: for a moment a, b and c all look held
        ev("a", 7, "r0", finished=True, reason="RunnerLost", relisted=True),
        ev("b", 8, "r0", finished=True, reason="RunnerLost", relisted=True),
    ]
    assert invariants([*full, *relist]) == []
    _, _, peak = check_job_history([*full, *relist], concurrency=2)
    assert peak == 2
    # A re-list that really holds three is still an over-commit, reported once, after the list.
    still = [ev("c", 9, "r0", relisted=True), ev("d", 10, "r0", relisted=True)]
    violations = check_job_history([ev("a", 1, "r0"), *still, ev("e", 11, None)], concurrency=2)[0]
    assert [v.invariant for v in violations] == ["over-commit"]
    assert "after a re-list" in violations[0].detail


def job(name: str, runner: str | None, conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conditions or []}
    if runner:
        status["assignment"] = {"runner": runner}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"}, "status": status}


def test_every_job_must_end_with_a_named_outcome() -> None:
    done = job("a", "r0", [{"type": "Succeeded", "status": "True", "reason": "Completed"}])
    closed = job("b", None, [{"type": "Routed", "status": "False", "reason": "NoEligibleRunner"}])
    waiting = job("c", None, [{"type": "Routed", "status": "False", "reason": "WaitingForCapacity"}])
    running = job("d", "r0", [{"type": "Routed", "status": "True", "reason": "Assigned"}])
    assert [v.detail.split()[1] for v in check_settled([done, closed, waiting, running], bound=60)] == ["c", "d"]


def record(
    action: str, name: str, *, uid: str = "", runner: str = "", before: str = "", after: str = ""
) -> dict[str, Any]:
    spec: dict[str, Any] = {"action": action, "object": {"name": name, "uid": uid}, "details": {"runner": runner}}
    spec |= {"before": {"value": before}} if before else {}
    spec |= {"after": {"value": after}} if after else {}
    return {"spec": spec}


def test_every_assignment_needs_a_job_routed_record_naming_its_runner() -> None:
    history = [
        ev("a", 1, "r0"),
        ev("a", 2, None, attempts=1, routed=("Unknown", "RunnerLost")),
        ev("a", 3, "r1", attempts=1),
    ]
    both = [record("JobRouted", "a", uid="uid-a", runner="r0"), record("JobRouted", "a", uid="uid-a", runner="r1")]
    assert check_job_audit(history, both) == []
    missing = check_job_audit(history, both[:1])
    assert [v.invariant for v in missing] == ["audit-job-routed"] and "r1 at attempt 1" in missing[0].detail


def test_job_routed_decisions_are_read_from_routing_batches() -> None:
    history = [
        ev("a", 1, "r0"),
        ev("a", 2, None, attempts=1, routed=("Unknown", "RunnerLost")),
        ev("a", 3, "r1", attempts=1),
    ]
    batch = {
        "spec": {
            "action": "RoutingDecisions",
            "object": {"kind": "Namespace", "name": "team"},
            "decisions": [
                {k: v for k, v in record("JobRouted", "a", uid="uid-a", runner=r)["spec"].items()} for r in ("r0", "r1")
            ],
        }
    }
    assert check_job_audit(history, [batch]) == []
    batch["spec"]["decisions"].pop()
    missing = check_job_audit(history, [batch])
    assert [v.invariant for v in missing] == ["audit-job-routed"] and "r1 at attempt 1" in missing[0].detail


def test_every_runner_transition_and_registration_needs_its_record() -> None:
    history = [
        RunnerEvent(name="r0", reported_status="Online", registered_at="2026-12-01T10:00:00Z"),
        RunnerEvent(name="r0", reported_status="Offline", registered_at="2026-12-01T10:00:00Z"),
        RunnerEvent(name="r0", reported_status="Online", registered_at="2026-12-01T10:01:00.5Z"),
    ]
    records = [
        record("RunnerRegistered", "r0", after="2026-12-01T10:00:00+00:00"),
        record("RunnerStatusChanged", "r0", before="Online", after="Offline"),
    ]
    found = check_runner_audit(history, records)
    assert sorted(v.invariant for v in found) == ["audit-runner-registered", "audit-runner-status"]
    records += [
        record("RunnerStatusChanged", "r0", before="Offline", after="Online"),
        record("RunnerRegistered", "r0", after="2026-12-01T10:01:00.500000Z"),
    ]
    assert check_runner_audit(history, records) == []


def test_the_canary_anywhere_is_a_leak() -> None:
    found = sweep_canary("hh-canary-x", {"operator log": "ok", "events/e1": "token hh-canary-x here"})
    assert [v.detail for v in found] == ["the canary credential appears in events/e1"]

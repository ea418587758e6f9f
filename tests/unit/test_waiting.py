"""Waiting for a reference that does not exist yet: the deadline, the reasons, and the scheduler's data."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from helmhive.api.common import JobKind
from helmhive.api.reasons import Reason
from helmhive.policy.agentjob.life import decide_needs_binding
from helmhive.policy.waiting import (
    DEFAULT_REFERENCE_WAIT,
    WAITING_REASONS,
    DeadlineHeap,
    MissingReference,
    Reference,
    ReferenceKind,
    WaitingRoom,
    build_bound_conditions,
    build_unbound_conditions,
    decide_reference_wait,
    decide_wait_deadline,
    missing_profile,
    missing_profile_binding,
    missing_workspace,
    parse_timestamp,
    pending_profile_revision,
)

CREATED = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
LIMIT = dt.timedelta(minutes=10)
WORKSPACE = missing_workspace(namespace="team", name="payments")


# -- the deadline ---------------------------------------------------------------------------------


def test_the_default_wait_is_ten_minutes_and_the_operators_default() -> None:
    from helmhive.controller.runtime import OperatorConfig

    assert dt.timedelta(minutes=10) == DEFAULT_REFERENCE_WAIT
    assert OperatorConfig().reference_wait == DEFAULT_REFERENCE_WAIT


def test_the_deadline_is_creation_plus_the_limit_whatever_now_is() -> None:
    for now in (CREATED, CREATED + dt.timedelta(minutes=3), CREATED + dt.timedelta(hours=5)):
        assert decide_wait_deadline(created_at=CREATED, now=now, limit=LIMIT) == CREATED + LIMIT


def test_an_object_without_a_creation_time_gets_the_whole_limit_from_now() -> None:
    now = CREATED + dt.timedelta(minutes=7)
    assert decide_wait_deadline(created_at=None, now=now, limit=LIMIT) == now + LIMIT


def test_a_naive_creation_time_is_read_as_utc() -> None:
    naive = CREATED.replace(tzinfo=None)
    assert decide_wait_deadline(created_at=naive, now=CREATED, limit=LIMIT) == CREATED + LIMIT


@pytest.mark.parametrize(
    ("elapsed", "waiting"),
    [
        pytest.param(dt.timedelta(0), True, id="at-creation"),
        pytest.param(dt.timedelta(minutes=9, seconds=59), True, id="a-second-before"),
        pytest.param(dt.timedelta(minutes=10), False, id="at-the-deadline"),
        pytest.param(dt.timedelta(days=2), False, id="long-after"),
    ],
)
def test_waits_before_the_deadline_and_fails_closed_from_it(elapsed: dt.timedelta, waiting: bool) -> None:
    decision = decide_reference_wait(missing=WORKSPACE, created_at=CREATED, now=CREATED + elapsed, limit=LIMIT)
    assert decision.waiting is waiting
    assert decision.deadline == CREATED + LIMIT
    assert decision.reason == (Reason.WAITING_FOR_WORKSPACE if waiting else Reason.WORKSPACE_NOT_FOUND)
    assert "workspace payments does not exist in team" in decision.message
    assert "2026-06-01T12:10:00Z" in decision.message


def test_the_final_message_says_how_long_it_waited() -> None:
    decision = decide_reference_wait(missing=WORKSPACE, created_at=CREATED, now=CREATED + LIMIT, limit=LIMIT)
    assert decision.message == (
        "workspace payments does not exist in team (waited 600s after creation, until 2026-06-01T12:10:00Z)"
    )


def test_a_zero_limit_fails_closed_at_once() -> None:
    decision = decide_reference_wait(missing=WORKSPACE, created_at=CREATED, now=CREATED, limit=dt.timedelta(0))
    assert not decision.waiting
    assert decision.reason == Reason.WORKSPACE_NOT_FOUND


def test_a_restart_neither_extends_nor_resets_the_wait() -> None:
    """The deadline depends on the object, not on when the operator first saw it."""
    first = decide_reference_wait(missing=WORKSPACE, created_at=CREATED, now=CREATED, limit=LIMIT)
    after_restart = decide_reference_wait(
        missing=WORKSPACE, created_at=CREATED, now=CREATED + dt.timedelta(minutes=9), limit=LIMIT
    )
    assert first.deadline == after_restart.deadline
    assert first.message == after_restart.message  # the same status: nothing to write again


# -- what is missing, and its reasons -----------------------------------------------------------


@pytest.mark.parametrize(
    ("missing", "kind", "name", "waiting", "final", "message"),
    [
        pytest.param(
            missing_workspace(namespace="team", name="payments"),
            ReferenceKind.WORKSPACE,
            "payments",
            Reason.WAITING_FOR_WORKSPACE,
            Reason.WORKSPACE_NOT_FOUND,
            "workspace payments does not exist in team",
            id="workspace",
        ),
        pytest.param(
            missing_profile_binding(namespace="team", workspace="payments", job_kind=JobKind.CONNECTION_TEST),
            ReferenceKind.WORKSPACE,
            "payments",
            Reason.WAITING_FOR_PROFILE,
            Reason.PROFILE_NOT_FOUND,
            "workspace payments names no active profile for connection-test",
            id="no-binding-in-the-workspace",
        ),
        pytest.param(
            missing_profile(namespace="team", name="quick-review"),
            ReferenceKind.PROFILE,
            "quick-review",
            Reason.WAITING_FOR_PROFILE,
            Reason.PROFILE_NOT_FOUND,
            "profile quick-review does not exist in team",
            id="profile",
        ),
        pytest.param(
            pending_profile_revision(namespace="team", name="quick-review"),
            ReferenceKind.PROFILE,
            "quick-review",
            Reason.WAITING_FOR_PROFILE,
            Reason.PROFILE_NOT_FOUND,
            "profile quick-review has no revision for its current spec yet",
            id="revision-not-written-yet",
        ),
    ],
)
def test_each_missing_reference_names_what_wakes_it_and_its_two_reasons(
    missing: MissingReference, kind: ReferenceKind, name: str, waiting: Reason, final: Reason, message: str
) -> None:
    assert missing.reference == Reference(kind=kind, namespace="team", name=name)
    assert (missing.waiting_reason, missing.final_reason, missing.message) == (waiting, final, message)
    assert missing.waiting_reason.value in WAITING_REASONS
    assert missing.final_reason.value not in WAITING_REASONS


def test_the_waiting_reasons_are_exactly_the_two() -> None:
    assert {"WaitingForWorkspace", "WaitingForProfile"} == WAITING_REASONS


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-06-01T12:00:00Z", CREATED),
        ("2026-06-01T14:00:00+02:00", CREATED),
        (CREATED.replace(tzinfo=None), CREATED),
        ("", None),
        ("yesterday", None),
        (None, None),
        (17, None),
    ],
)
def test_parse_timestamp(raw: Any, expected: dt.datetime | None) -> None:
    assert parse_timestamp(raw) == expected


# -- which jobs still need binding -----------------------------------------------------------------


def routed(status: str, reason: str) -> dict[str, Any]:
    return {"type": "Routed", "status": status, "reason": reason, "message": ""}


@pytest.mark.parametrize(
    ("body", "needs"),
    [
        pytest.param({"metadata": {}}, True, id="new"),
        pytest.param(
            {"metadata": {}, "status": {"conditions": [routed("False", "WaitingForWorkspace")]}}, True, id="w-ws"
        ),
        pytest.param(
            {"metadata": {}, "status": {"conditions": [routed("False", "WaitingForProfile")]}}, True, id="w-p"
        ),
        pytest.param({"metadata": {}, "status": {"conditions": [routed("Unknown", "RunnerLost")]}}, True, id="requeue"),
        pytest.param(
            {"metadata": {}, "status": {"conditions": [routed("False", "WorkspaceNotFound")]}}, False, id="ws"
        ),
        pytest.param({"metadata": {}, "status": {"conditions": [routed("False", "ProfileNotFound")]}}, False, id="pnf"),
        pytest.param({"metadata": {}, "status": {"conditions": [routed("False", "ProfileNotValid")]}}, False, id="pnv"),
        pytest.param({"metadata": {}, "status": {"conditions": [routed("False", "InvalidSpec")]}}, False, id="spec"),
        pytest.param({"metadata": {}, "status": {"profile": {"name": "p"}}}, False, id="bound"),
        pytest.param({"metadata": {"deletionTimestamp": "2026-06-01T12:00:00Z"}}, False, id="deleted"),
    ],
)
def test_decide_needs_binding(body: dict[str, Any], needs: bool) -> None:
    assert decide_needs_binding(body) is needs


def test_a_waiting_job_is_not_routed() -> None:
    """Routing needs a profile binding; a waiting job has none, whatever its conditions say."""
    from helmhive.policy.agentjob.life import decide_needs_routing

    for reason in sorted(WAITING_REASONS):
        assert not decide_needs_routing({"metadata": {}, "status": {"conditions": [routed("False", reason)]}})


# -- the job's conditions while it waits, and once it is bound --------------------------------------


def test_unbound_conditions_set_routed_and_ready_false_with_one_reason() -> None:
    update = build_unbound_conditions(
        [{"type": "Other", "status": "True", "reason": "X", "message": ""}],
        reason=Reason.WAITING_FOR_WORKSPACE,
        message="workspace payments does not exist in team; waiting until …",
        generation=1,
        now=CREATED,
    )
    assert update.changed
    by_type = {c["type"]: c for c in update.conditions}
    assert set(by_type) == {"Other", "Routed", "Ready"}
    for ctype in ("Routed", "Ready"):
        assert (by_type[ctype]["status"], by_type[ctype]["reason"]) == ("False", "WaitingForWorkspace")
        assert by_type[ctype]["observedGeneration"] == 1
        assert by_type[ctype]["lastTransitionTime"] == "2026-06-01T12:00:00Z"


def test_unbound_conditions_unchanged_when_deciding_the_same_again() -> None:
    first = build_unbound_conditions(
        None, reason=Reason.WAITING_FOR_PROFILE, message="m", generation=1, now=CREATED
    ).conditions
    again = build_unbound_conditions(
        first, reason=Reason.WAITING_FOR_PROFILE, message="m", generation=1, now=CREATED + LIMIT
    )
    assert not again.changed
    assert again.conditions == first


def test_failing_closed_after_waiting_keeps_the_transition_time_and_changes_the_reason() -> None:
    waiting = build_unbound_conditions(
        None, reason=Reason.WAITING_FOR_WORKSPACE, message="m", generation=1, now=CREATED
    ).conditions
    failed = build_unbound_conditions(
        waiting, reason=Reason.WORKSPACE_NOT_FOUND, message="m2", generation=1, now=CREATED + LIMIT
    )
    assert failed.changed
    assert {(c["reason"], c["lastTransitionTime"]) for c in failed.conditions} == {
        ("WorkspaceNotFound", "2026-06-01T12:00:00Z")
    }


def test_bound_conditions_drop_only_the_waiting_ones() -> None:
    other = {"type": "Other", "status": "True", "reason": "X", "message": ""}
    waiting = build_unbound_conditions(
        [other], reason=Reason.WAITING_FOR_PROFILE, message="m", generation=1, now=CREATED
    ).conditions
    assert build_bound_conditions(waiting) == [other]
    assert build_bound_conditions([other]) is None
    assert build_bound_conditions(None) is None
    lost = [routed("Unknown", "RunnerLost")]
    assert build_bound_conditions(lost) is None


# -- the scheduler's heap --------------------------------------------------------------------------


def at(minutes: float) -> dt.datetime:
    return CREATED + dt.timedelta(minutes=minutes)


def test_heap_pops_what_is_due_earliest_first() -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    heap.set("c", at(3))
    heap.set("a", at(1))
    heap.set("b", at(2))
    assert heap.next_at() == at(1)
    assert heap.pop_due(at(0)) == []
    assert heap.pop_due(at(2)) == ["a", "b"]
    assert len(heap) == 1
    assert heap.next_at() == at(3)
    assert heap.pop_due(at(10)) == ["c"]
    assert heap.next_at() is None
    assert len(heap) == 0


def test_heap_setting_a_key_again_replaces_its_time_earlier_or_later() -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    heap.set("job", at(10))
    heap.set("job", at(1))  # woken: look at it now
    assert heap.when("job") == at(1)
    assert heap.pop_due(at(1)) == ["job"]
    heap.set("job", at(1))
    heap.set("job", at(10))  # decided again: next look at its deadline
    assert heap.pop_due(at(5)) == []
    assert heap.next_at() == at(10)
    assert heap.pop_due(at(10)) == ["job"]
    assert heap.pop_due(at(100)) == []


def test_heap_discard() -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    heap.set("a", at(1))
    heap.set("b", at(2))
    heap.discard("a")
    heap.discard("never-set")
    assert "a" not in heap
    assert "b" in heap
    assert heap.next_at() == at(2)
    assert heap.pop_due(at(5)) == ["b"]


def test_heap_ties_pop_in_the_order_they_were_set() -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    for key in ("x", "y", "z"):
        heap.set(key, at(1))
    assert heap.pop_due(at(1)) == ["x", "y", "z"]


def test_heap_compares_naive_and_aware_times() -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    heap.set("naive", at(2).replace(tzinfo=None))
    heap.set("aware", at(1))
    assert heap.pop_due(at(2)) == ["aware", "naive"]


def test_heap_stays_bounded_when_keys_are_set_over_and_over() -> None:
    heap: DeadlineHeap[int] = DeadlineHeap()
    for round_ in range(200):
        for key in range(10):
            heap.set(key, at(round_))
    assert len(heap) == 10
    assert len(heap._heap) <= 2 * 10 + 64 + 1
    assert heap.pop_due(at(1000)) == list(range(10))


# -- the waiting room -----------------------------------------------------------------------------


def ref(kind: ReferenceKind, name: str, namespace: str = "team") -> Reference:
    return Reference(kind=kind, namespace=namespace, name=name)


def test_waiting_room_finds_waiters_by_reference_and_forgets_them_everywhere() -> None:
    room: WaitingRoom[tuple[str, str]] = WaitingRoom()
    ws, prof = ref(ReferenceKind.WORKSPACE, "payments"), ref(ReferenceKind.PROFILE, "quick-review")
    room.expect(("team", "job-a"), ws)
    room.expect(("team", "job-a"), prof)
    room.expect(("team", "job-b"), ws)
    assert sorted(room.waiters(ws)) == [("team", "job-a"), ("team", "job-b")]
    assert room.waiters(prof) == [("team", "job-a")]
    assert room.references(("team", "job-a")) == {ws, prof}
    assert len(room) == 2
    room.forget(("team", "job-a"))
    assert room.waiters(prof) == []
    assert room.waiters(ws) == [("team", "job-b")]
    room.forget(("team", "job-b"))
    room.forget(("team", "never"))
    assert len(room) == 0
    assert room._by_reference == {}


def test_waiting_room_keeps_kinds_and_namespaces_apart() -> None:
    room: WaitingRoom[str] = WaitingRoom()
    room.expect("j", ref(ReferenceKind.WORKSPACE, "same"))
    assert room.waiters(ref(ReferenceKind.PROFILE, "same")) == []
    assert room.waiters(ref(ReferenceKind.WORKSPACE, "same", namespace="other")) == []
    assert room.waiters(ref(ReferenceKind.WORKSPACE, "same")) == ["j"]

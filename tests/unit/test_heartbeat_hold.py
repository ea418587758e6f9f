"""The heartbeat hold, pure: after the operator lost the API server, a stale Lease is not Offline yet.

:func:`helmhive.policy.runners.state.decide_heartbeat_hold` (how long the hold lasts, on a monotonic
clock), :func:`decide_runner_status` with a :class:`HeartbeatHold` (what a held runner looks
like), routing's answer when every runner that could take a job is held (wait, never fail closed
for it), and :class:`helmhive.controller.kube.contact.ApiContact` on an injected clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
import socket
from collections.abc import Callable

from routing_builders import BOUND_AT, runner
from test_routing import route
from test_runner_status import GRACE, NAME, NOW, derive, lease, report

from helmhive.api.reasons import Reason
from helmhive.api.runner import ReportedStatus, RunnerSpec, build_report_digest
from helmhive.controller.kube.contact import ApiContact
from helmhive.policy.routing.route import RouteOutcome
from helmhive.policy.runners.state import (
    HeartbeatHold,
    LeaseView,
    PoolFacts,
    RunnerDerived,
    decide_heartbeat_hold,
    decide_runner_status,
)

STALE = 60.0  # seconds since the last renewal: far past a 20 s Lease and its grace


def test_the_hold_lasts_while_contact_is_lost_and_one_lease_plus_grace_after_it_returns() -> None:
    assert decide_heartbeat_hold(contact=False, returned_at=0, now=500, lease_duration_s=20, grace_s=2) == math.inf
    assert decide_heartbeat_hold(contact=True, returned_at=100, now=110, lease_duration_s=20, grace_s=2) == 12
    assert decide_heartbeat_hold(contact=True, returned_at=100, now=122, lease_duration_s=20, grace_s=2) is None


def _held(stored: ReportedStatus | None = ReportedStatus.ONLINE, until: dt.datetime | None = None) -> HeartbeatHold:
    return HeartbeatHold(until=until if until is not None else NOW + dt.timedelta(seconds=5), stored=stored)


def test_a_runner_whose_only_fault_is_heartbeat_age_is_held_not_offline() -> None:
    plain = derive(the_report=report(), the_lease=lease(age=STALE))
    assert plain.reported_status is ReportedStatus.OFFLINE and plain.online.reason == Reason.HEARTBEAT_STALE

    held = derive_with(_held(), age=STALE)
    assert held.reported_status is ReportedStatus.ONLINE, "the stored status is kept: no flip, nothing audited"
    assert (held.online.status, held.online.reason) == (None, Reason.HEARTBEAT_HELD)
    assert (held.schedulable.status, held.schedulable.reason) == (False, Reason.HEARTBEAT_HELD)
    assert held.review_at == NOW + dt.timedelta(seconds=5, microseconds=1), "derived again when the hold ends"

    unknown_end = derive_with(_held(until=None), age=STALE)  # contact still lost: no end known yet
    assert unknown_end.online.reason == Reason.HEARTBEAT_HELD

    over = derive_with(_held(until=NOW - dt.timedelta(seconds=1)), age=STALE)
    assert over.reported_status is ReportedStatus.OFFLINE and over.online.reason == Reason.HEARTBEAT_STALE


def test_the_hold_never_covers_a_missing_lease_another_holder_or_a_runner_already_offline() -> None:
    assert derive_with(_held(), the_lease=None).online.reason == Reason.LEASE_MISSING
    other = derive_with(_held(), the_lease=lease(age=STALE, holder="someone-else"))
    assert other.reported_status is ReportedStatus.OFFLINE
    already = derive_with(_held(stored=ReportedStatus.OFFLINE), age=STALE)
    assert already.reported_status is ReportedStatus.OFFLINE and already.online.reason == Reason.HEARTBEAT_STALE
    fresh = derive_with(_held(), age=1.0)
    assert fresh.reported_status is ReportedStatus.ONLINE and fresh.online.reason == Reason.HEARTBEAT_FRESH


_DEFAULT = object()


def derive_with(
    hold: HeartbeatHold, *, age: float = 1.0, the_lease: LeaseView | object | None = _DEFAULT
) -> RunnerDerived:
    """A runner with a current, confirmed report, derived under ``hold``."""
    the_report = report()
    chosen = lease(age=age) if the_lease is _DEFAULT else the_lease
    assert chosen is None or isinstance(chosen, LeaseView)
    if chosen is not None:
        chosen = dataclasses.replace(chosen, digest=build_report_digest(the_report))
    return decide_runner_status(
        name=NAME,
        spec=RunnerSpec.model_validate({"poolRef": {"name": "pool-a"}}),
        report=the_report,
        pool=PoolFacts(credential_generation=1),
        lease=chosen,
        now=NOW,
        grace=GRACE,
        hold=hold,
    )


def test_routing_waits_for_held_runners_instead_of_failing_closed() -> None:
    held = [
        runner("a", schedulable=False, reason="HeartbeatHeld"),
        runner("b", schedulable=False, reason="HeartbeatHeld"),
    ]
    decision = route(held)
    assert decision.outcome is RouteOutcome.WAITING and decision.reason is Reason.WAITING_FOR_CAPACITY
    assert "held (HeartbeatHeld" in decision.message and "a, b" in decision.message
    assert decision.capacity_blocked == frozenset({("team", "a"), ("team", "b")})
    assert decision.retry_after == 2.0

    # A runner that is really Offline is no held runner: the job waits for a runner that can take it
    # (no backoff: the runner coming back re-decides it), and fails closed at the deadline.
    dead = route([runner("a", schedulable=False, reason="HeartbeatStale")])
    assert dead.outcome is RouteOutcome.WAITING and dead.waits_for_runner
    assert dead.capacity_blocked == frozenset() and dead.retry_after is None
    assert "NotSchedulable/HeartbeatStale" in dead.message
    gone = route([runner("a", schedulable=False, reason="HeartbeatStale")], now=BOUND_AT + dt.timedelta(seconds=900))
    assert gone.reason is Reason.NO_ELIGIBLE_RUNNER, "a runner that stays Offline fails the job closed at the deadline"

    late = route(held, now=BOUND_AT + dt.timedelta(seconds=900))
    assert late.outcome is RouteOutcome.FAILED and late.reason is Reason.CAPACITY_DEADLINE_EXCEEDED

    mixed = route([*held, runner("c")])
    assert mixed.outcome is RouteOutcome.ASSIGNED and mixed.choice is not None and mixed.choice.runner == "c"


def test_contact_is_lost_after_failures_outlast_the_threshold_and_returns_with_the_lease_watch() -> None:
    clock = [100.0]
    contact = ApiContact(monotonic=lambda: clock[0], lost_after_s=2.0, watch_wait_s=30.0)
    returned: list[float] = []
    contact.on_return(lambda: returned.append(clock[0]))
    assert contact.hold_left(lease_duration_s=5, grace_s=2) == 7, "the operator's start counts as a return"
    clock[0] = 108.0
    contact.succeeded()
    assert contact.hold_left(lease_duration_s=5, grace_s=2) is None
    clock[0] = 109.0
    contact.failed()  # one second after the last success: a blip, not a gap
    assert contact.contact and contact.losses == 0
    clock[0] = 111.0
    contact.failed()
    assert not contact.contact and contact.hold_left(lease_duration_s=5, grace_s=2) == math.inf
    contact.watched()  # a stale event while reads fail proves nothing
    assert not contact.contact
    clock[0] = 130.0
    contact.succeeded()  # reads work again, but the Lease watch has not spoken yet
    assert not contact.contact and returned == []
    clock[0] = 131.0
    contact.watched()
    assert contact.contact and returned == [131.0] and contact.losses == 1
    clock[0] = 134.0
    assert contact.hold_left(lease_duration_s=5, grace_s=2) == 4.0


def test_without_any_lease_event_contact_returns_at_the_bound_so_dead_runners_are_not_held_forever() -> None:
    clock = [0.0]
    contact = ApiContact(monotonic=lambda: clock[0], lost_after_s=2.0, watch_wait_s=30.0)
    clock[0] = 5.0
    contact.failed()
    clock[0] = 50.0
    contact.succeeded()
    clock[0] = 79.0
    contact.succeeded()
    assert not contact.contact
    clock[0] = 81.0
    contact.succeeded()
    assert contact.contact and contact.returned_at == 80.0
    assert contact.hold_left(lease_duration_s=5, grace_s=2) == 6.0


def test_a_probe_that_hangs_loses_contact_after_the_threshold_not_after_the_clients_retries() -> None:
    """A server that accepts connections and never answers (etcd stopping under a live kube-apiserver
    looked like this): the client's own retries made one probe take 12 s, past a 5 s Lease. The
    probe loop counts an unanswered read as failed once it has waited ``lost_after_s``: contact is
    lost while the first read still waits (its read timeout is 120 s here), with no retry."""
    import asyncio
    import threading

    from kubernetes import client

    from helmhive.controller.kube.contact import run_contact_probe
    from helmhive.controller.kube.door import Kube

    held: list[socket.socket] = []

    def accept(server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])  # keep it open, never answer

    async def scenario(port: int) -> tuple[ApiContact, int]:
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{port}"
        contact = ApiContact(lost_after_s=0.5)
        lost = asyncio.Event()
        contact.failed = _then(contact.failed, lambda: None if contact.contact else lost.set())  # type: ignore[method-assign]
        task = asyncio.create_task(
            run_contact_probe(
                contact, Kube(client.ApiClient(configuration)), interval_s=0.2, request_timeout=(2.0, 120.0)
            )
        )
        await asyncio.wait_for(lost.wait(), timeout=30)  # the read itself waits 120 s
        connections = len(held)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return contact, connections

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        threading.Thread(target=accept, args=(server,), daemon=True).start()
        contact, connections = asyncio.run(scenario(server.getsockname()[1]))
        for conn in held:
            conn.close()
    assert not contact.contact and contact.losses == 1
    assert connections == 1, f"lost only after the client retried ({connections} connections)"


def _then(first: Callable[[], None], after: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        after()

    return both

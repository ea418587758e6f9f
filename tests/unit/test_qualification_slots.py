"""A probe never takes a slot a job waits for: the operator's own job store, router and wake-ups, without an API server.

:func:`helmhive.controller.runners.qualification.decide_runner_qualification` reads the runner's
held slots from the real :class:`~helmhive.policy.routing.job_store.JobStore` and the waiting jobs
from the real :class:`~helmhive.controller.router.engine.Router`; the freed slot reaches the pool's
loop through the real :class:`~helmhive.controller.runners.wakes.RunnerWakes`. Nothing here needs
the API (the cluster test covers the writes).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from test_qualification import schedulable_derivation

from helmhive.api.qualification import ProbeKind, QualificationSpec
from helmhive.api.reasons import Reason
from helmhive.api.runner import ReportedStatus, RunnerSpec, RunnerStatus
from helmhive.controller.router.capacity import _Waiting
from helmhive.controller.router.engine import Router, RouterSettings
from helmhive.controller.runners.derived import ParsedRunner
from helmhive.controller.runners.qualification import decide_runner_qualification
from helmhive.controller.runners.wakes import RunnerWakes
from helmhive.controller.runtime import Runtime
from helmhive.policy.routing.route import RouteOutcome, RoutingDecision
from helmhive.policy.runners.state import ConditionVerdict, PoolFacts, RunnerDerived

NOW = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
KEY = ("team", "pool-a-0")
SPEC = QualificationSpec(probes=[ProbeKind.CONNECTION_TEST], every_seconds=3600)


def _runner(concurrency: int = 1) -> ParsedRunner:
    report: dict[str, Any] = {
        "provider": "anthropic",
        "adapter": {"type": "acp", "name": "agent", "version": "1"},
        "authentication": {"state": "Authenticated", "verifiedAt": "2026-06-01T11:59:00Z"},
        "environmentFingerprint": "sha256:x",
        "concurrency": concurrency,
        "podName": KEY[1],
        "reportedAt": "2026-06-01T11:59:00Z",
        "registeredAt": "2026-06-01T11:50:00Z",
    }
    return ParsedRunner(
        name=KEY[1],
        namespace=KEY[0],
        uid="u-1",
        resource_version="1",
        generation=1,
        spec=RunnerSpec.model_validate({"poolRef": {"name": "pool-a"}}),
        status=RunnerStatus.model_validate({"report": report}),
        owner_uids=frozenset(),
        control_state_set_by=None,
    )


def _job(name: str, version: int, *, finished: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Succeeded", "status": "True", "reason": "Completed"}] if finished else []
    return {
        "metadata": {"name": name, "namespace": "team", "resourceVersion": str(version)},
        "spec": {"jobKind": "connection-test"},
        "status": {"assignment": {"runner": KEY[1], "runnerNamespace": "team"}, "conditions": conditions},
    }


def test_a_due_probe_waits_for_a_free_slot_nobody_waits_for() -> None:
    runtime = Runtime(kube=None)  # type: ignore[arg-type]  # no API calls here
    router = Router(runtime, RouterSettings())
    runtime.slot_waited_for = router.waited_for
    wakes = RunnerWakes()
    woken: list[str] = []
    wakes.attach(("team", "pool-a"), lambda: woken.append("pool-a"))
    wakes.runner_changed(namespace="team", name=KEY[1], pool="pool-a")
    wakes.take(("team", "pool-a"))
    store = runtime.job_store.store
    store.on_release = wakes.slot_freed
    facts = PoolFacts(qualification=SPEC, credential_generation=0)

    def decide() -> Any:
        return decide_runner_qualification(runtime, _runner(), schedulable_derivation(), facts, NOW)

    # A user job holds the runner's only slot: the probe may not start, and asks for the slot.
    store.observe("ADDED", _job("user-a", 1))
    busy = decide()
    assert busy.start is None and busy.wants_slot
    wakes.wake_on_free_slot(namespace="team", name=KEY[1])
    # Another job waits for a slot on this runner: when the first ends, the slot is that job's.
    router.waiting[("team", "user-b")] = _Waiting(blocked=frozenset({KEY}), since=1.0, timer=None)
    woken.clear()
    store.observe("MODIFIED", _job("user-a", 2, finished=True))
    assert woken == ["pool-a"] and wakes.take(("team", "pool-a")) == {KEY[1]}  # the freed slot woke the loop
    assert runtime.slot_waited_for(KEY)
    still = decide()
    assert still.start is None and still.wants_slot
    # Nobody waits any more, and the slot is free: the probe starts.
    del router.waiting[("team", "user-b")]
    started = decide()
    assert started.start is not None and started.start.kind is ProbeKind.CONNECTION_TEST
    assert not started.wants_slot


def test_a_runner_that_is_not_otherwise_schedulable_is_not_probed() -> None:
    runtime = Runtime(kube=None)  # type: ignore[arg-type]
    offline = schedulable_derivation()
    offline = RunnerDerived(
        reported_status=ReportedStatus.OFFLINE,
        effective_control_state=offline.effective_control_state,
        online=ConditionVerdict(status=False, reason=Reason.HEARTBEAT_STALE),
        authenticated=offline.authenticated,
        schedulable=ConditionVerdict(status=False, reason=Reason.HEARTBEAT_STALE),
        heartbeat_time=NOW,
    )
    decision = decide_runner_qualification(runtime, _runner(), offline, PoolFacts(qualification=SPEC), NOW)
    assert decision is not None and decision.start is None


def test_a_pool_without_probes_costs_nothing() -> None:
    runtime = Runtime(kube=None)  # type: ignore[arg-type]
    assert decide_runner_qualification(runtime, _runner(), schedulable_derivation(), PoolFacts(), NOW) is None


def test_a_freed_slot_goes_to_a_waiting_user_job_before_a_probe_and_its_end_wakes_the_probe() -> None:
    router = Router(Runtime(kube=None), RouterSettings())  # type: ignore[arg-type]
    unblocked: list[tuple[str, str]] = []
    router.on_unblocked = unblocked.append
    waiting = RoutingDecision(
        outcome=RouteOutcome.WAITING,
        reason=Reason.WAITING_FOR_CAPACITY,
        message="busy",
        capacity_blocked=frozenset({KEY}),
    )
    router._wait(("team", "probe"), waiting, probe=True)  # the probe waited first
    assert not router.waited_for(KEY)  # a waiting probe is not a user job waiting
    router._wait(("team", "user"), waiting)
    assert router.waited_for(KEY)
    router._capacity_freed(KEY)
    assert router.waiting[("team", "user")].woken_by == KEY  # the user job takes the slot
    assert router.waiting[("team", "probe")].woken_by is None
    router._stop_waiting(("team", "user"))  # it was assigned: the probe's pool loop hears of it
    assert unblocked == [KEY]
    router._stop_waiting(("team", "probe"))
    assert unblocked == [KEY]  # a probe that stops waiting frees nothing for another probe

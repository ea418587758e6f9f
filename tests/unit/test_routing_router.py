"""The router's bookkeeping without an API server: counts, the work queue, wake-ups, the rate limit.

These exercise :class:`helmhive.controller.router.engine.Router` on plain dicts standing in for Kopf's
indexes; nothing here talks to a cluster (the cluster tests cover the writes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Any

import pytest

from helmhive.api.reasons import Reason
from helmhive.controller.router.engine import RateLimiter, Router, RouterSettings, _Waiting
from helmhive.controller.runtime import Runtime
from helmhive.policy.routing.inputs import parse_queued_job
from helmhive.policy.routing.route import RouteOutcome, RoutingDecision


def router() -> Router:
    made = Router(Runtime(kube=None), RouterSettings())  # type: ignore[arg-type]  # no API calls here
    made.bind(
        {
            "routing_runners": {},
            "routing_pools": {},
            "routing_namespaces": {},
            "routing_memory": {},
            "routing_sessions": {},
        }
    )
    made.jobs_by_runner = {("runners", "r1"): {("team", "a"), ("team", "b")}}  # the job store's view
    return made


def job(name: str, *, runner: str | None = None, finished: bool = False, waiting: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"profile": {"name": "p"}}
    conditions = []
    if runner:
        status["assignment"] = {"runner": runner, "runnerNamespace": "runners"}
    if finished:
        conditions.append({"type": "Succeeded", "status": "True", "reason": "Completed"})
    if waiting:
        conditions.append({"type": "Routed", "status": "False", "reason": "WaitingForCapacity"})
    status["conditions"] = conditions
    return {"metadata": {"name": name, "namespace": "team", "resourceVersion": "1"}, "spec": {}, "status": status}


def test_active_jobs_are_the_index_plus_this_processes_unseen_assignments_counted_once() -> None:
    r = router()
    r._reserve(("team", "b"), ("runners", "r1"))  # written, and already in the index
    r._reserve(("team", "c"), ("runners", "r1"))  # written, not in the index yet
    r._reserve(("team", "d"), ("runners", "r2"))
    assert r.active_jobs([("runners", "r1"), ("runners", "r2"), ("runners", "r3")]) == {
        ("runners", "r1"): 3,
        ("runners", "r2"): 1,
    }
    # The job's watch event shows its assignment: the reservation goes, the index counts it.
    r.observe_job("MODIFIED", job("d", runner="r2"))
    assert r.pending == {("team", "b"): ("runners", "r1"), ("team", "c"): ("runners", "r1")}
    assert r.active_jobs([("runners", "r2")]) == {}  # (this fake index does not update itself)


def test_a_key_is_handled_by_one_worker_at_a_time_and_redone_if_it_changed_meanwhile() -> None:
    r = router()
    key = ("team", "a")
    r.enqueue(key, "event")
    r.enqueue(key, "event")
    assert list(r.queued) == [key]
    r.queued.clear()
    r.processing.add(key)
    r.enqueue(key, "event")
    r.enqueue(key, "backoff")
    r.enqueue(key, "wake")
    assert not r.queued and r.dirty == {key: "backoff"}
    r._done(key)
    assert r.queued == {key: "backoff"}
    assert not r.processing


def test_a_finishing_job_wakes_the_job_waiting_longest_on_its_runner() -> None:
    r = router()
    r.observe_job(None, job("a", runner="r1"))
    assert r.holding[("team", "a")] == ("runners", "r1")
    r.waiting[("team", "late")] = _Waiting(blocked=frozenset({("runners", "r1")}), since=20.0, timer=None)
    r.waiting[("team", "early")] = _Waiting(blocked=frozenset({("runners", "r1")}), since=10.0, timer=None)
    r.waiting[("team", "other")] = _Waiting(blocked=frozenset({("runners", "r9")}), since=1.0, timer=None)
    r.queued.clear()
    r.observe_job("MODIFIED", job("a", runner="r1", finished=True))
    assert list(r.queued.items()) == [(("team", "early"), "wake")]
    assert ("team", "a") not in r.holding


def test_each_freed_slot_wakes_a_different_job() -> None:
    r = router()
    r1 = ("runners", "r1")
    for name in ("a", "b"):
        r.observe_job(None, job(name, runner="r1"))
    r.waiting[("team", "early")] = _Waiting(blocked=frozenset({r1}), since=10.0, timer=None)
    r.waiting[("team", "late")] = _Waiting(blocked=frozenset({r1}), since=20.0, timer=None)
    r.queued.clear()
    # Two slots free before either woken job is re-decided: both jobs are woken, not one twice.
    r.observe_job("MODIFIED", job("a", runner="r1", finished=True))
    r.observe_job("MODIFIED", job("b", runner="r1", finished=True))
    assert list(r.queued.items()) == [(("team", "early"), "wake"), (("team", "late"), "wake")]
    assert r._take_wake(("team", "early")) == r1
    assert r._take_wake(("team", "early")) is None, "a wake-up is used once"


async def test_a_woken_job_with_nothing_to_route_passes_its_slot_on() -> None:
    r = router()
    r1 = ("runners", "r1")
    r.observe_job(None, job("a", runner="r1"))
    # "gone" is waiting in memory but its body was dropped (it was bound and routed elsewhere).
    r.waiting[("team", "gone")] = _Waiting(blocked=frozenset({r1}), since=1.0, timer=None)
    r.waiting[("team", "next")] = _Waiting(blocked=frozenset({r1}), since=2.0, timer=None)
    r.queued.clear()
    r.observe_job("MODIFIED", job("a", runner="r1", finished=True))
    assert list(r.queued) == [("team", "gone")]
    r.queued.clear()
    await r.route(("team", "gone"), "wake")
    assert ("team", "gone") not in r.waiting, "it no longer takes wake-ups"
    assert list(r.queued.items()) == [(("team", "next"), "wake")]
    assert r.waiting[("team", "next")].woken_by == r1


def test_jobs_that_await_a_decision_are_queued_and_others_forgotten() -> None:
    r = router()
    r.observe_job(None, job("new"))
    r.observe_job(None, job("waiting", waiting=True))
    r.observe_job(None, job("assigned", runner="r1"))
    assert list(r.queued) == [("team", "new"), ("team", "waiting")]
    assert set(r.bodies) == {("team", "new"), ("team", "waiting")}
    r.observe_job("DELETED", job("new"))
    assert ("team", "new") not in r.bodies


def test_settings_come_from_the_environment() -> None:
    settings = RouterSettings.from_env(
        {"HELMHIVE_ROUTING_QPS": "5", "HELMHIVE_ROUTING_BURST": "7", "HELMHIVE_ROUTING_CAPACITY_DEADLINE_SECONDS": "60"}
    )
    assert (settings.qps, settings.burst, settings.policy.capacity_deadline_seconds) == (5.0, 7, 60.0)
    assert RouterSettings.from_env({}) == RouterSettings()  # the defaults (QPS 200, burst 400) are the same


@pytest.mark.asyncio
async def test_the_token_bucket_allows_a_burst_then_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bucket's clock is injected; its waits are recorded and move that clock (by a nanosecond
    # more than asked, as a real sleep never ends early), so what is asserted is how long the
    # bucket asked to wait, not how long a loaded machine took.
    now = [100.0]
    waits: list[float] = []
    yield_now = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds + 1e-9
        await yield_now(0)  # still a suspension point, as a real sleep is

    monkeypatch.setattr(asyncio, "sleep", sleep)
    bucket = RateLimiter(rate=50.0, burst=3, clock=lambda: now[0])
    for _ in range(3):
        await bucket.take()
    assert waits == []  # the burst is served at once
    await asyncio.gather(*(bucket.take() for _ in range(5)))
    assert waits == pytest.approx([1 / 50.0] * 5)  # five more tokens at 50 per second: one wait each
    assert now[0] - 100.0 == pytest.approx(5 / 50.0)  # 0.1 s in all


def test_a_review_knows_the_implementations_provider_before_the_index_does() -> None:
    r = router()
    r.implementations_written[("team", "ch", 1)] = "anthropic"
    review = job("review")
    review["spec"] = {
        "workspace": "shop",
        "jobKind": "change-review",
        "request": {"title": "t", "prompt": "p"},
        "change": {"name": "ch", "stage": "review"},
    }
    review["status"]["profile"] = {
        "name": "p",
        "revision": "p-1",
        "hash": "sha256:0",
        "boundAt": "2026-06-01T12:00:00Z",
        "snapshot": {
            "envelope": "change-review",
            "tools": ["read"],
            "filesystem": "read",
            "network": "disabled",
            "outputContract": {"format": "structured"},
            "session": {"policy": "fresh"},
            "memory": {"enabled": False},
            "requiredLabels": {},
            "requiredCapabilities": [],
            "providerMappings": [{"provider": "anthropic"}],
            "allowModelOverride": False,
            "instructions": "",
            "purpose": "p",
        },
    }
    parsed = parse_queued_job(review)
    assert parsed is not None
    assert r.decide(parsed, attempts=0).avoided_provider == "anthropic"
    # Once the implementation's own event shows its assignment, the index has it.
    implementation = job("impl", runner="r1")
    implementation["spec"] = {"change": {"name": "ch", "stage": "implementation"}}
    implementation["status"]["assignment"]["provider"] = "anthropic"
    r.observe_job("MODIFIED", implementation)
    assert r.implementations_written == {}


async def test_durations_come_from_the_injected_monotonic_clock() -> None:
    ticks = iter([100.0, 250.0, 900.0])
    r = Router(Runtime(kube=None), RouterSettings(), monotonic=lambda: next(ticks))  # type: ignore[arg-type]
    assert r.bucket.stamp == 100.0, "the token bucket reads the same clock"
    r.audits.mark(("team", "a"))
    assert r.audits.audited == {("team", "a"): 250.0}
    waiting = RoutingDecision(
        outcome=RouteOutcome.WAITING, reason=Reason.WAITING_FOR_CAPACITY, message="m", retry_after=60.0
    )
    r._wait(("team", "b"), waiting)
    r._wait(("team", "b"), waiting)  # still waiting: keeps when it started (no further clock read)
    assert r.waiting[("team", "b")].since == 900.0
    r._stop_waiting(("team", "b"))


def test_a_runner_event_is_parsed_once_for_the_index_the_views_and_the_wake_ups() -> None:
    """The routing index and the event handler read one parse per resourceVersion; a new version, or a
    runner deleted and created again, is parsed anew."""
    import copy

    from test_routing_inputs import runner_body

    r = router()
    body = runner_body()
    body["metadata"]["resourceVersion"] = "7"
    first = r.runner_facts(body)
    assert first is not None and first.schedulable is True
    assert r.runner_facts(copy.deepcopy(body)) is first, "the same version is not parsed again"
    held = runner_body(conditions=[{"type": "Schedulable", "status": "False", "reason": "Held",
                                    "lastTransitionTime": "2026-06-01T12:01:00Z"}])  # fmt: skip
    held["metadata"]["resourceVersion"] = "8"
    second = r.runner_facts(held)
    assert second is not None and (second.schedulable, second.schedulable_reason) == (False, "Held")
    r.observe_runner(held)
    assert r.schedulable == {("runners", "p-0"): False}
    r.forget_runner(("runners", "p-0"))
    assert r.schedulable == {}, "a deleted runner's schedulability goes with it"
    again = r.runner_facts(held)
    assert again is not second and again == second, "parsed anew after the deletion"
    unversioned = runner_body()
    assert r.runner_facts(unversioned) is not r.runner_facts(unversioned), "no version: nothing to key a cache on"


def test_a_runner_event_changes_the_topology_only_when_it_changes_what_routing_sees() -> None:
    """A runner's periodic report (a new ``reportedAt``) leaves the cached runner views alone; a change
    routing reads (a capability, its Schedulable condition), its first sight and its deletion do not."""
    from test_routing_inputs import pool, runner_body

    r = router()
    r.pools = {"runners": [pool(namespace="runners", generation=1)]}
    body = runner_body()
    assert r.runner_view_changed(body, deleted=False), "first seen"
    assert not r.runner_view_changed(body, deleted=False), "the same object again"
    reported = runner_body()
    reported["status"]["report"] |= {"reportedAt": "2026-06-01T12:00:30Z"}
    assert not r.runner_view_changed(reported, deleted=False), "a report that changes nothing routing reads"
    more = runner_body()
    more["status"]["report"] |= {"capabilities": ["diff-review", "workspace-write"]}
    assert r.runner_view_changed(more, deleted=False)
    held = runner_body(conditions=[{"type": "Schedulable", "status": "False", "reason": "Held",
                                    "lastTransitionTime": "2026-06-01T12:01:00Z"}])  # fmt: skip
    assert r.runner_view_changed(held, deleted=False)
    assert not r.runner_view_changed(held, deleted=False)
    assert r.runner_view_changed(held, deleted=True), "gone"
    assert r.runner_view_changed(held, deleted=False), "seen again after its deletion"
    unreadable = {**held, "spec": {"poolRef": {}}}
    assert r.runner_view_changed(unreadable, deleted=False), "an unusable spec drops it from the views"


# Waiting for a runner (GitOps order: the job is decided before its pool's runner registers) -----------

RUNNER_WAIT = RoutingDecision(
    outcome=RouteOutcome.WAITING,
    reason=Reason.WAITING_FOR_CAPACITY,
    message="no runner is eligible yet: no runner is registered; waiting for one until 2026-06-01T12:15:00Z",
    capacity_deadline=dt.datetime(2026, 6, 1, 12, 15, tzinfo=dt.UTC),
)


def _bound(name: str, namespace: str = "runners") -> dict[str, Any]:
    """An AgentJob in ``namespace``, bound at queue time to a profile mapped to provider anthropic."""
    return {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1",
                     "generation": 1},
        "spec": {"workspace": "shop", "jobKind": "connection-test", "request": {"title": "t", "prompt": "p"}},
        "status": {
            "profile": {
                "name": "p",
                "revision": "p-1",
                "hash": "sha256:0",
                "boundAt": "2026-06-01T12:00:00Z",
                "snapshot": {
                    "envelope": "connection-test",
                    "tools": [],
                    "filesystem": "none",
                    "network": "disabled",
                    "outputContract": {"format": "text"},
                    "session": {"policy": "fresh"},
                    "memory": {"enabled": False},
                    "requiredLabels": {},
                    "requiredCapabilities": [],
                    "providerMappings": [{"provider": "anthropic"}],
                    "allowModelOverride": False,
                    "instructions": "",
                    "purpose": "p",
                },
            },
        },
    }  # fmt: skip


class _StatusWrites:
    """The one API call routing makes for a decision: a conditional PUT of the job's status subresource.

    As the API server does, it keeps the rest of the stored job and answers with the whole job.
    """

    def __init__(self, *jobs: dict[str, Any]) -> None:
        self.stored = {(j["metadata"]["namespace"], j["metadata"]["name"]): j for j in jobs}
        self.written: list[dict[str, Any]] = []

    async def replace_status(self, kind: Any, name: str, body: dict[str, Any], *, namespace: str) -> dict[str, Any]:
        before = self.stored[(namespace, name)]
        assert body["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "a stale write"
        version = str(int(before["metadata"]["resourceVersion"]) + 1)
        after = {**before, "metadata": {**before["metadata"], "resourceVersion": version}, "status": body["status"]}
        self.stored[(namespace, name)] = after
        self.written.append(after)
        return after


def _routed(body: dict[str, Any]) -> tuple[str, str, str]:
    routed = next(c for c in body["status"]["conditions"] if c["type"] == "Routed")
    return routed["status"], routed["reason"], routed["message"]


async def _route_queued(r: Router) -> list[str]:
    """Decide every queued job once, as the workers would; the triggers handled."""
    triggers = []
    while r.queued:
        key, trigger = await r._next()
        triggers.append(trigger)
        try:
            await r.route(key, trigger)
        finally:
            r._done(key)
    return triggers


async def test_a_job_decided_before_its_runner_registered_is_routed_when_the_runner_becomes_schedulable() -> None:
    from test_routing_inputs import pool, runner_body

    kube = _StatusWrites(_bound("hello"))
    clock = dt.datetime(2026, 6, 1, 12, 0, 5, tzinfo=dt.UTC)
    r = Router(Runtime(kube=kube, clock=lambda: clock), RouterSettings())  # type: ignore[arg-type]
    r.bind({"routing_runners": {}, "routing_pools": {}, "routing_namespaces": {}, "routing_memory": {},
            "routing_sessions": {}})  # fmt: skip
    key = ("runners", "hello")
    try:
        # Applied together with its RunnerPool: the pool is indexed, its runner not registered yet.
        r.pools = {"runners": [pool(namespace="runners", generation=1)]}
        r.fleet_changed()
        r.observe_job(None, _bound("hello"))
        assert await _route_queued(r) == ["event"]
        (waiting,) = kube.written
        assert _routed(waiting)[:2] == ("False", "WaitingForCapacity")
        assert "no runner is registered" in _routed(waiting)[2]
        assert "nextAttemptAt" not in waiting["status"]["routing"]
        assert r.waiting[key].for_runner and r.waiting[key].timer is None, "no timer: events end the wait"
        assert r.runtime.deadlines.when(("AgentJobRouting", *key)) == dt.datetime(2026, 6, 1, 12, 15, tzinfo=dt.UTC)

        # Its own watch event re-decides it: still waiting, nothing written again.
        r.observe_job("MODIFIED", waiting)
        assert await _route_queued(r) == ["event"]
        assert len(kube.written) == 1

        # The runner registers (not schedulable yet): re-decided, still waiting, and the message says why.
        registering = runner_body(conditions=[{"type": "Schedulable", "status": "False", "reason": "NeverReported",
                                               "lastTransitionTime": "2026-06-01T12:00:06Z"}])  # fmt: skip
        registering["metadata"]["resourceVersion"] = "10"
        facts = r.runner_facts(registering)
        assert facts is not None
        r.runners = {"runners": [facts]}
        if r.runner_view_changed(registering, deleted=False):  # as the Runner event handler does
            r.fleet_changed()
        r.observe_runner(registering)
        assert await _route_queued(r) == ["wake"]
        registered = kube.written[-1]
        assert len(kube.written) == 2 and _routed(registered)[:2] == ("False", "WaitingForCapacity")
        assert "(closest: NotSchedulable/NeverReported)" in _routed(registered)[2]
        r.observe_job("MODIFIED", registered)  # its own watch event: the same wait, nothing written
        assert await _route_queued(r) == ["event"]
        assert len(kube.written) == 2

        # It is Online and Schedulable: the job is woken and assigned to it.
        online = runner_body()
        online["metadata"]["resourceVersion"] = "11"
        facts = r.runner_facts(online)
        assert facts is not None
        r.runners = {"runners": [facts]}
        if r.runner_view_changed(online, deleted=False):
            r.fleet_changed()
        r.observe_runner(online)
        assert await _route_queued(r) == ["wake"]
        assigned = kube.written[-1]
        assert _routed(assigned)[:2] == ("True", "Assigned")
        assert assigned["status"]["assignment"]["runner"] == "p-0"
        assert key not in r.waiting
        assert r.runtime.deadlines.when(("AgentJobRouting", *key)) is None, "its deadline went with the wait"
    finally:
        await r.runtime.deadlines.stop()


async def test_a_job_waiting_for_a_runner_fails_closed_at_its_deadline() -> None:
    now = [dt.datetime(2026, 6, 1, 12, 0, 5, tzinfo=dt.UTC)]
    kube = _StatusWrites(_bound("hello"))
    r = Router(Runtime(kube=kube, clock=lambda: now[0]), RouterSettings())  # type: ignore[arg-type]
    r.bind({"routing_runners": {}, "routing_pools": {}, "routing_namespaces": {}, "routing_memory": {},
            "routing_sessions": {}})  # fmt: skip
    key = ("runners", "hello")
    try:
        r.observe_job(None, _bound("hello"))
        await _route_queued(r)
        assert r.runtime.deadlines.when(("AgentJobRouting", *key)) == dt.datetime(2026, 6, 1, 12, 15, tzinfo=dt.UTC)
        queued = asyncio.Event()
        enqueue = r.enqueue

        def enqueue_and_tell(job: tuple[str, str], trigger: str) -> None:
            enqueue(job, trigger)
            queued.set()

        r.enqueue = enqueue_and_tell  # type: ignore[method-assign]
        now[0] = dt.datetime(2026, 6, 1, 12, 15, tzinfo=dt.UTC)  # the clock the scheduler reads
        r.runtime.deadlines.poke()
        await asyncio.wait_for(queued.wait(), timeout=30)
        assert await _route_queued(r) == ["deadline"]
        status, reason, message = _routed(kube.written[-1])
        assert (status, reason) == ("False", "NoEligibleRunner")
        assert "until the deadline 2026-06-01T12:15:00Z" in message
        assert key not in r.waiting
    finally:
        await r.runtime.deadlines.stop()


async def test_a_runner_wait_has_no_timer_and_its_deadline_is_one_entry_of_the_operators_scheduler() -> None:
    r = router()
    key = ("team", "a")
    try:
        r._wait(key, RUNNER_WAIT)
        assert r.waiting[key].timer is None and r.waiting[key].for_runner
        assert r.runtime.deadlines.when(("AgentJobRouting", *key)) == RUNNER_WAIT.capacity_deadline
        # Busy runners now: a wait for a slot, on its backoff timer, without the runner deadline.
        busy = dataclasses.replace(RUNNER_WAIT, capacity_blocked=frozenset({("runners", "r1")}), retry_after=60.0)
        r._wait(key, busy)
        assert r.waiting[key].timer is not None and not r.waiting[key].for_runner
        assert r.runtime.deadlines.when(("AgentJobRouting", *key)) is None
        r._wait(key, RUNNER_WAIT)
        assert r.waiting[key].timer is None
        r._stop_waiting(key)
        assert r.runtime.deadlines.when(("AgentJobRouting", *key)) is None
    finally:
        await r.runtime.deadlines.stop()


async def test_fleet_changes_wake_the_jobs_waiting_for_a_runner_and_only_those() -> None:
    r = router()
    try:
        r._wait(("team", "no-runner"), RUNNER_WAIT)
        r._wait(("other", "no-runner"), RUNNER_WAIT)
        r.waiting[("team", "busy")] = _Waiting(blocked=frozenset({("runners", "r1")}), since=1.0, timer=None)
        r.fleet_changed(namespace="team")  # that namespace's labels changed: only its jobs see other pools
        assert list(r.queued.items()) == [(("team", "no-runner"), "wake")]
        r.queued.clear()
        r.fleet_changed()  # a pool or a runner's view changed
        assert set(r.queued) == {("team", "no-runner"), ("other", "no-runner")}
        assert all(trigger == "wake" for trigger in r.queued.values())
    finally:
        await r.runtime.deadlines.stop()

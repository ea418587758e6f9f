"""The router's audit batching and its Runner Events, on a fake of the project's own API wrapper.

The fake stands in for :class:`helmhive.controller.kube.door.Kube` only (records kept in a dict,
errors raised on demand); the cluster tests (``tests/operator/test_routing_audit_batches.py``)
cover the real API server. Time is injected: no test sleeps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from typing import Any

import pytest

from helmhive.controller.kube.door import Conflict, Unavailable
from helmhive.controller.router.audits import RouterAudits, ensure_routing_recorded
from helmhive.controller.router.settings import RateLimiter
from helmhive.controller.runtime import Runtime
from helmhive.policy.audit.routing import build_routing_batch, build_routing_decisions, iter_routing_decisions

NOW = dt.datetime(2026, 12, 2, 1, 0, tzinfo=dt.UTC)


class FakeKube:
    """AuditRecords by (namespace, name), Events as written; ``fail`` makes the next creates raise."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        self.creates: list[str] = []
        self.fail: list[Exception] = []
        self.events: list[dict[str, Any]] = []
        self.patches: list[dict[str, Any]] = []
        self.reads: list[str] = []

    async def create(self, kind: Any, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self.creates.append(name)
        if self.fail:
            raise self.fail.pop(0)
        if (str(namespace), name) in self.records:
            raise Conflict(409, "exists")
        self.records[(str(namespace), name)] = body
        return body

    async def list(self, kind: Any, namespace: str | None = None, *, label_selector: str | None = None) -> list[Any]:
        self.reads.append(f"list {label_selector}")
        return [
            r for (ns, _), r in self.records.items() if ns == namespace and label_selector in r["metadata"]["labels"]
        ]

    async def list_page(
        self,
        kind: Any,
        *,
        limit: int,
        continue_token: str | None = None,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> dict[str, Any]:
        """Pages of ``limit`` records matching ``key=value`` and ``key in (a,b)`` terms; the token is an offset."""
        self.reads.append(f"page {namespace} {label_selector} {continue_token}")
        if self.fail:
            raise self.fail.pop(0)
        terms = re.findall(r"([\w./-]+)(?:=([\w-]+)| in \(([^)]*)\))", label_selector)
        matching = [
            r
            for (ns, _), r in sorted(self.records.items())
            if ns == namespace
            and all(r["metadata"]["labels"].get(k) in ([eq] if eq else within.split(",")) for k, eq, within in terms)
        ]
        start = int(continue_token or 0)
        more = start + limit < len(matching)
        return {"metadata": {"continue": str(start + limit) if more else ""}, "items": matching[start : start + limit]}

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.reads.append(f"get {name}")
        return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}}

    async def post_event(self, **kwargs: Any) -> str:
        self.events.append(kwargs)
        return f"event-{len(self.events)}"

    async def patch_event_series(self, name: str, **kwargs: Any) -> None:
        self.patches.append({"name": name, **kwargs})


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def assigned(i: int, *, namespace: str = "team", runner: str = "r0", attempt: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": f"job-{i}", "namespace": namespace, "uid": f"uid-{namespace}-{i}"},
        "spec": {"workspace": "shop"},
        "status": {
            "attempts": attempt,
            "profile": {"revision": "p-1"},
            "routing": {"decidedAt": "2026-12-02T00:59:59Z"},
            "assignment": {"runner": runner, "runnerNamespace": "runners", "provider": "anthropic", "model": "m"},
            "conditions": [{"type": "Routed", "status": "True", "reason": "Assigned", "message": "ok"}],
        },
    }


def audits(kube: FakeKube, clock: Clock, *, now: Any = lambda: NOW) -> RouterAudits:
    runtime = Runtime(kube=kube, clock=now)  # type: ignore[arg-type]  # the fake wrapper
    bucket = RateLimiter(rate=1e6, burst=10**6, clock=clock)
    return RouterAudits(
        runtime, bucket=bucket, workers=4, recovery_seconds=600, monotonic=clock, linger_seconds=0, retry_seconds=0
    )


def decisions(kube: FakeKube) -> list[dict[str, Any]]:
    return [d["spec"] for d in iter_routing_decisions(kube.records.values())]


def test_a_burst_is_written_as_a_few_bounded_batches_per_namespace() -> None:
    kube, clock = FakeKube(), Clock()
    a = audits(kube, clock)
    for i in range(250):
        a.record(assigned(i), runner=None)
    for i in range(3):
        a.record(assigned(i, namespace="other"), runner=None)
    assert kube.creates == []  # nothing is written on the routing path
    assert asyncio.run(a.flush()) is True
    assert sorted(len(r["spec"]["decisions"]) for r in kube.records.values()) == [3, 50, 100, 100]
    assert {ns for ns, _ in kube.records} == {"team", "other"}
    assert sorted(d["object"]["name"] for d in decisions(kube) if d["object"]["namespace"] == "team") == sorted(
        f"job-{i}" for i in range(250)
    )


def test_a_failed_create_is_retried_as_the_same_record_and_a_409_counts_as_written() -> None:
    kube, clock = FakeKube(), Clock()
    a = audits(kube, clock)
    for i in range(3):
        a.record(assigned(i), runner=None)
    kube.fail = [Unavailable(504, "timeout")]
    assert asyncio.run(a.flush()) is False
    first = kube.creates[0]
    a.record(assigned(9), runner=None)  # a later decision goes in a batch of its own
    kube.fail = [Conflict(409, "exists")]  # the first try had reached the API server after all
    assert asyncio.run(a.flush()) is True
    assert kube.creates[1] == first
    assert [len(r["spec"]["decisions"]) for r in kube.records.values()] == [1]
    assert a.failed == []


def test_recovery_queues_only_the_decisions_no_record_holds() -> None:
    kube, clock = FakeKube(), Clock()
    held = build_routing_batch(namespace="team", entries=build_routing_decisions(job=assigned(1), now=NOW), now=NOW)
    kube.records[("team", held["metadata"]["name"])] = held
    a = audits(kube, clock)

    async def run() -> None:
        a.recover(("team", "job-1"), assigned(1))  # recorded before the crash
        a.recover(("team", "job-2"), assigned(2))  # cut off by it
        old = assigned(3)
        old["status"]["routing"] = {"decidedAt": "2026-12-01T00:00:00Z"}
        a.recover(("team", "job-3"), old)
        await asyncio.gather(*a.background)
        await a.flush()

    asyncio.run(run())
    names = sorted(d["object"]["name"] for d in decisions(kube))
    assert names == ["job-1", "job-2"]  # job-2 written once; job-3 is older than the window
    assert kube.reads == [
        "page team helmhive.dev/audit-action=RoutingDecisions,helmhive.dev/audit-hour in (2026120200,2026120201) None"
    ]  # one LIST of the namespace's batches of the window's hours, not one per job


def test_a_restart_over_many_jobs_lists_each_namespaces_batches_once_and_keeps_only_keys() -> None:
    """After a restart every recently decided job is checked: one labelled LIST per job made 10,000
    LISTs (and held each job's entries until its turn). Now one paginated LIST per namespace, diffed
    in memory; a crash cut off the last 30 decisions of each namespace."""
    kube, clock = FakeKube(), Clock()
    for namespace in ("team", "other"):
        entries = [
            e for i in range(270) for e in build_routing_decisions(job=assigned(i, namespace=namespace), now=NOW)
        ]
        for batch in [entries[i : i + 100] for i in range(0, len(entries), 100)]:
            record = build_routing_batch(namespace=namespace, entries=batch, now=NOW)
            kube.records[(namespace, record["metadata"]["name"])] = record
    stale = build_routing_batch(namespace="team", entries=build_routing_decisions(job=assigned(299), now=NOW),
                                now=NOW - dt.timedelta(hours=5))  # fmt: skip  # an hour outside the window
    kube.records[("team", stale["metadata"]["name"])] = stale
    before = len(kube.records)
    a = audits(kube, clock)

    async def run() -> int:
        for i in range(300):
            a.recover(("team", f"job-{i}"), assigned(i))
            a.recover(("other", f"job-{i}"), assigned(i, namespace="other"))
        tasks = len(a.background)
        await asyncio.gather(*a.background)
        await a.flush()
        return tasks

    assert asyncio.run(run()) == 2  # one worker per namespace, not one task per job
    pages = [r for r in kube.reads if r.startswith("page")]
    assert len(kube.reads) == len(pages) == 2 and a.recovery.lists == 2  # 3 batches a namespace: one page each
    assert not a.recovery.checks and not a.recovery.workers
    assert {len(keys) for keys in a.recovery.held.values()} == {270}  # the window's keys, not the stale batch's
    written = list(kube.records.values())[before:]  # in creation order
    recovered = sorted((d["object"]["namespace"], d["object"]["name"]) for r in written for d in r["spec"]["decisions"])
    expected = sorted((ns, f"job-{i}") for ns in ("team", "other") for i in range(270, 300))
    assert recovered == expected  # job-299 too: its only batch is outside the listed hours (twice, never zero)


def test_the_recovery_list_is_paginated_and_retried_and_later_decisions_are_not_looked_up() -> None:
    kube, clock = FakeKube(), Clock()
    now = [NOW]
    for i in range(120):
        record = build_routing_batch(
            namespace="team", entries=build_routing_decisions(job=assigned(i), now=NOW), now=NOW
        )
        kube.records[("team", record["metadata"]["name"])] = record
    a = audits(kube, clock, now=lambda: now[0])
    kube.fail = [Unavailable(503, "restarting")]

    async def run() -> None:
        a.recover(("team", "job-1"), assigned(1))
        await asyncio.gather(*a.background)
        later = assigned(200)
        later["status"]["routing"] = {"decidedAt": "2026-12-02T01:00:05Z"}  # after the LIST
        now[0] = NOW + dt.timedelta(seconds=10)
        a.recover(("team", "job-200"), later)
        await asyncio.gather(*a.background)
        await a.flush()

    asyncio.run(run())
    pages = [r.rsplit(" ", 1)[1] for r in kube.reads]
    assert pages == ["None", "None", "50", "100"]  # refused once, then 120 batches in pages of 50
    assert [d["object"]["name"] for d in decisions(kube)[120:]] == ["job-200"]  # no second LIST for it


def test_the_lost_runner_step_writes_an_unrecorded_run_before_it_is_cleared() -> None:
    kube = FakeKube()
    job = assigned(4, attempt=1, runner="r7")
    asyncio.run(ensure_routing_recorded(kube, job, now=NOW))  # type: ignore[arg-type]
    asyncio.run(ensure_routing_recorded(kube, job, now=NOW))  # type: ignore[arg-type]  # already there: no write
    assert [(d["attempt"], d["details"]["runner"]) for d in decisions(kube)] == [(1, "r7")]
    assert len(kube.creates) == 1


def test_assignments_make_one_event_per_runner_whose_count_is_patched_at_most_every_interval() -> None:
    kube, clock = FakeKube(), Clock()
    a = audits(kube, clock)
    for i in range(3):
        a.record(assigned(i, runner="r0"), runner=("runners", "r0"))
    a.record(assigned(3, runner="r1"), runner=("runners", "r1"))
    asyncio.run(a.events.flush())
    assert sorted((e["involved"]["metadata"]["name"], e["count"]) for e in kube.events) == [("r0", 3), ("r1", 1)]
    assert {e["involved"]["metadata"]["uid"] for e in kube.events} == {"uid-r0", "uid-r1"}
    assert all(e["reason"] == "JobsRouted" and e.get("event_type", "Normal") == "Normal" for e in kube.events)
    a.record(assigned(4, runner="r0"), runner=("runners", "r0"))
    asyncio.run(a.events.flush())
    assert kube.patches == []  # within the interval: counted, not written
    clock.t += 30
    asyncio.run(a.events.flush())
    assert [(p["name"], p["count"]) for p in kube.patches] == [("event-1", 4)]
    assert len(kube.events) == 2  # no per-job Event


@pytest.mark.parametrize("reason", ["ModelNotAdvertised", "NoEligibleMapping"])
def test_a_failed_decision_gets_a_warning_event_on_its_job(reason: str) -> None:
    kube, clock = FakeKube(), Clock()
    a = audits(kube, clock)
    failed = {
        "metadata": {"name": "bad", "namespace": "team", "uid": "uid-bad"},
        "status": {
            "routing": {"consideredRunners": 2},
            "conditions": [{"type": "Routed", "status": "False", "reason": reason, "message": f"no: {reason}"}],
        },
    }

    async def run() -> None:
        a.record(failed, runner=None)
        await asyncio.gather(*a.background)
        await a.flush()

    asyncio.run(run())
    assert [(e["event_type"], e["reason"], e["involved"]["metadata"]["name"]) for e in kube.events] == [
        ("Warning", "JobRoutingFailed", "bad")
    ]
    assert [d["action"] for d in decisions(kube)] == ["JobRoutingFailed"]


def test_a_decision_both_recorded_and_recovered_by_one_process_is_written_once() -> None:
    """Whichever comes second adds nothing: the router's record after a recovery check, or the reverse."""
    kube, clock = FakeKube(), Clock()
    a = audits(kube, clock)

    async def run() -> None:
        a.record(assigned(1), runner=None)  # routed here; its watch event comes back after a forget
        a.forget(("team", "job-1"))
        a.recover(("team", "job-1"), assigned(1))
        a.recover(("team", "job-2"), assigned(2))  # recovered first, then recorded by the router
        await asyncio.gather(*a.background)
        a.record(assigned(2), runner=None)
        await a.flush()

    asyncio.run(run())
    assert sorted(d["object"]["name"] for d in decisions(kube)) == ["job-1", "job-2"]

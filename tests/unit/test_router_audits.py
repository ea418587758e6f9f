"""The router's audit batching and its Runner Events, on a fake of the project's own API wrapper.

The fake stands in for :class:`helmhive.controller.kube.Kube` only (records kept in a dict,
errors raised on demand); the cluster tests (``tests/operator/test_routing_audit_batches.py``)
cover the real API server. Time is injected: no test sleeps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from helmhive.controller.kube import Conflict, Unavailable
from helmhive.controller.router_audits import RouterAudits, ensure_routing_recorded
from helmhive.controller.router_settings import TokenBucket
from helmhive.controller.runtime import Runtime
from helmhive.policy.routing_audit import build_routing_batch, build_routing_decisions, iter_routing_decisions

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


def audits(kube: FakeKube, clock: Clock) -> RouterAudits:
    runtime = Runtime(kube=kube, clock=lambda: NOW)  # type: ignore[arg-type]  # the fake wrapper
    bucket = TokenBucket(rate=1e6, burst=10**6, clock=clock)
    return RouterAudits(runtime, bucket=bucket, workers=4, recovery_seconds=600, monotonic=clock, linger_seconds=0)


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
    assert len(kube.reads) == 2


def test_a_restart_queues_its_recovery_checks_for_a_few_workers_holding_only_each_jobs_identity() -> None:
    """After a restart every recently decided job is checked: 10,000 tasks, each with a copy of its
    whole job, held hundreds of MiB. Now ``workers`` tasks take them from a queue of names and uids."""
    kube, clock = FakeKube(), Clock()
    a = audits(kube, clock)
    jobs = 500

    async def run() -> tuple[int, list[dict[str, Any]]]:
        for i in range(jobs):
            a.recover(("team", f"job-{i}"), assigned(i))
        tasks, held = len(a.background), [job for _, job, _ in a.recovering]
        await asyncio.gather(*a.background)
        await a.flush()
        return tasks, held

    tasks, held = asyncio.run(run())
    assert tasks == 4  # the workers, not one task per job
    assert len(held) == jobs and all(set(job) == {"metadata"} for job in held)
    assert held[7] == {"metadata": {"name": "job-7", "namespace": "team", "uid": "uid-team-7"}}
    assert len(kube.reads) == jobs and not a.recovering and a.recovery_workers == 0
    assert sorted(d["object"]["name"] for d in decisions(kube)) == sorted(f"job-{i}" for i in range(jobs))


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

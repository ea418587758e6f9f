"""The pure decisions of the operator's AgentJob watch: events, re-list deletions, coalescing, backoff."""

from __future__ import annotations

import asyncio
from typing import Any

from helmhive.api.kubeerrors import KubeError
from helmhive.controller.heap import rss_mib, trim_heap
from helmhive.controller.job_store_sync import JobStoreSync
from helmhive.controller.jobs.watch import JobWatch
from helmhive.controller.runtime import JobEvents
from helmhive.policy.agentjob.watch import (
    PendingEvents,
    WatchStepKind,
    build_deleted_body,
    decide_rewatch_delay,
    decide_vanished,
    decide_watch_event,
)
from helmhive.policy.routing.job_store import JobStore


def job(name: str, version: int, *, runner: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"profile": {"name": "p"}, "conditions": []}
    if runner:
        status["assignment"] = {"runner": runner, "runnerNamespace": "runners", "provider": "anthropic"}
    return {"metadata": {"name": name, "namespace": "team", "resourceVersion": str(version)}, "status": status}


def test_a_watch_event_is_a_change_a_bookmark_an_expiry_or_an_error() -> None:
    changed = decide_watch_event({"type": "MODIFIED", "object": job("a", 7)})
    assert (changed.kind, changed.event_type, changed.resource_version) == (WatchStepKind.OBJECT, "MODIFIED", "7")
    bookmark = decide_watch_event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    assert (bookmark.kind, bookmark.resource_version, bookmark.body) == (WatchStepKind.BOOKMARK, "9", None)
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 1 (40)"}
    expired = decide_watch_event({"type": "ERROR", "object": gone})
    assert expired.kind is WatchStepKind.EXPIRED and "too old" in expired.message
    other = decide_watch_event({"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "boom"}})
    assert other.kind is WatchStepKind.ERROR and "boom" in other.message
    assert decide_watch_event({"type": "ADDED", "object": {}}).kind is WatchStepKind.ERROR  # no object: not a change


def test_a_relist_finds_the_jobs_deleted_meanwhile_but_not_those_changed_after_it() -> None:
    held = {("team", "a"): 10, ("team", "b"): 11, ("team", "c"): 30, ("team", "d"): None}
    assert decide_vanished(held, [("team", "a")], 20) == [("team", "b"), ("team", "d")]
    assert decide_vanished(held, [("team", "a")], None) == [("team", "b"), ("team", "c"), ("team", "d")]
    assert decide_vanished({}, [("team", "a")], 20) == []


def test_a_vanished_job_leaves_the_store_and_frees_its_slot() -> None:
    store = JobStore()
    store.begin_listing()
    store.add_listed([job("a", 10, runner="r1"), job("b", 11, runner="r1")])
    store.finish_listing()
    # A re-list at version 20 shows only a: b was deleted while nobody watched.
    (gone,) = decide_vanished(store.versions(), [("team", "a")], 20)
    assert store.observe("DELETED", build_deleted_body(gone, "20"))
    assert set(store.held_on(("runners", "r1"))) == {("team", "a")}
    assert store.facts(("team", "b")) is None


def test_coalescing_keeps_the_newest_copy_and_every_deletion() -> None:
    pending = PendingEvents()
    key = ("team", "a")
    assert pending.add(key, None, job("a", 1)) is True  # schedule it
    assert pending.add(key, "MODIFIED", job("a", 2)) is False  # already scheduled
    assert pending.add(key, "MODIFIED", job("a", 3)) is False
    assert [(t, b["metadata"]["resourceVersion"]) for t, b in pending.take(key)] == [("MODIFIED", "3")]
    assert pending.done(key) is False  # nothing came meanwhile

    assert pending.add(key, "MODIFIED", job("a", 4)) is True
    pending.add(key, "DELETED", job("a", 5))
    pending.add(key, "ADDED", job("a", 6))  # created again under its name
    pending.add(key, "MODIFIED", job("a", 7))
    taken = [(t, b["metadata"]["resourceVersion"]) for t, b in pending.take(key)]
    assert taken == [("DELETED", "5"), ("MODIFIED", "7")]


def test_a_job_is_never_scheduled_twice_while_its_steps_run() -> None:
    pending = PendingEvents()
    key = ("team", "a")
    assert pending.add(key, None, job("a", 1))
    events = pending.take(key)
    assert len(events) == 1 and len(pending) == 0
    assert pending.add(key, "MODIFIED", job("a", 2)) is False, "running: the worker takes it when done"
    assert pending.done(key) is True, "more came meanwhile: schedule it again"
    assert [t for t, _ in pending.take(key)] == ["MODIFIED"]
    assert pending.done(key) is False
    assert pending.add(key, "MODIFIED", job("a", 3)) is True, "idle again"


def test_the_backoff_doubles_up_to_a_short_cap_with_jitter() -> None:
    assert decide_rewatch_delay(0, jitter=0.999) < 0.5 and decide_rewatch_delay(0, jitter=0.0) == 0.25
    assert decide_rewatch_delay(1, jitter=0.0) == 0.5
    assert all(
        1.0 <= decide_rewatch_delay(n, jitter=0.0) <= decide_rewatch_delay(n, jitter=0.99) <= 2.0 for n in range(2, 100)
    )


def test_after_an_outage_the_steps_wait_for_contact_and_kopfs_runner_watch() -> None:
    """The gate of :class:`JobWatch`: open once Kopf's indexes are filled, closed by an outage, reopened
    by a Runner event once contact is back, or at the bound after the watch is back."""
    contact = [False]

    async def scenario() -> list[bool]:
        watch = JobWatch(JobStoreSync(), JobEvents(), in_contact=lambda: contact[0], reopen_after_s=0.2)
        seen = [watch.ready.is_set()]
        watch.kopf_indexed()
        seen.append(watch.ready.is_set())
        watch._lost(KubeError(0, "refused"))
        seen.append(watch.ready.is_set())
        watch.runners_seen()  # Kopf's Runner watch spoke, but contact is not back: a stale view
        seen.append(watch.ready.is_set())
        contact[0] = True
        watch.runners_seen()
        seen.append(watch.ready.is_set())
        watch._back()  # the outage is over
        watch._lost(KubeError(0, "refused again"))  # a second outage, and no Runner event comes
        seen.append(watch.ready.is_set())
        watch._back()
        await asyncio.wait_for(watch.ready.wait(), 5)
        seen.append(watch.ready.is_set())
        return seen

    assert asyncio.run(scenario()) == [False, True, False, False, True, False, True]


def test_the_heap_is_trimmed_once_the_steps_have_taken_every_listed_job() -> None:
    """After a LIST the watch returns the listing's freed memory to the OS, but only when no listed job
    waits for or runs its steps any more (trimming earlier would leave the rest of the burst's garbage)."""
    dispatched: list[str] = []
    trimmed_after: list[int] = []
    frozen_after: list[int] = []

    def freeze() -> int:
        frozen_after.append(len(dispatched))
        return 7

    async def scenario() -> None:
        events = JobEvents()

        async def step(event_type: str | None, body: Any) -> None:
            await asyncio.sleep(0.01)  # the steps take a while: the trim must wait for them
            dispatched.append(body["metadata"]["name"])

        events.subscribe("slow", step)
        watch = JobWatch(
            JobStoreSync(page_size=500),
            events,
            trim=lambda: bool(trimmed_after.append(len(dispatched))),
            freeze=freeze,
        )
        watch.ready.set()
        workers = [asyncio.create_task(watch._worker()) for _ in range(4)]
        await watch._listed_page([job(f"j{i}", i) for i in range(40)])
        await asyncio.wait_for(watch._trim_after_listing(), 10)
        await asyncio.wait_for(watch._trim_after_listing(), 10)  # nothing pending: at once
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    asyncio.run(scenario())
    assert trimmed_after == [40, 40]
    assert frozen_after == [40], "the start-up is frozen once, after the first listing passed the steps"


def test_trimming_the_heap_is_safe_and_reports_whether_the_c_library_did() -> None:
    garbage = [bytes(200_000) for _ in range(50)]
    del garbage
    assert isinstance(trim_heap(), bool)  # glibc: True; another C library: False, never an error
    rss = rss_mib()
    assert rss is not None and rss > 1

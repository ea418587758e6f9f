"""The operator's own AgentJob watch against the real API server: resume, 410 and re-list, outages.

The first two tests drive :class:`helmhive.controller.jobs.watch.JobWatch` in this process with the
operator's own ``Kube`` door (no operator runs; the jobs' assignments are written by the test);
a recording step stands in for the operator's steps. The last runs the real operator and
simulated runners and stops the real kube-apiserver (:class:`harness.outage.ApiServerOutage`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from held_jobs import Fleet, assign_job, create_profile, get_job, job_manifest, make_fleet
from kubernetes import client
from simulated_runner import GROUP, VERSION

from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess
from harness.outage import ApiServerOutage
from harness.wait import wait_for
from helmhive.controller.job_store_sync import JobStoreSync
from helmhive.controller.jobs.watch import JobWatch
from helmhive.controller.kube.door import Kube as OperatorKube
from helmhive.controller.runtime import JobEvents

Seen = list[tuple[str | None, str]]


def _create(kube: Kube, namespace: str, name: str) -> None:
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentjobs", job_manifest(name, profile="p", kind="review-probe")
    )


def _recorder(namespace: str) -> tuple[JobEvents, Seen]:
    seen: Seen = []
    events = JobEvents()

    async def record(event_type: str | None, body: Mapping[str, Any]) -> None:
        if body["metadata"]["namespace"] == namespace:  # other tests' jobs share the cluster
            seen.append((event_type, str(body["metadata"]["name"])))

    events.subscribe("record", record)
    return events, seen


async def _until(check: Any, what: str, limit: float = 60.0) -> None:
    """Poll ``check`` (the watch's state and the recorder are plain data, no event to await)."""
    try:
        async with asyncio.timeout(limit):
            while not check():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def _held(sync: JobStoreSync, namespace: str) -> set[str]:
    return {name for _, name in sync.store.held_on((namespace, "r1"))}


@pytest.mark.parametrize("resume", ["last-seen", "too-old"])
def test_a_job_deleted_while_the_watch_was_down_leaves_the_store(
    kube: Kube, api_client: client.ApiClient, crds: list[str], namespace: str, resume: str
) -> None:
    """Resumed from where it stopped, the watch delivers the deletion; from a version the server no
    longer has (it answers 410 Gone), the watch lists again and the re-list delivers it."""
    for name in ("a", "b", "c"):
        _create(kube, namespace, name)
    for name in ("a", "b"):
        assign_job(kube, namespace, name, "r1")
    door = OperatorKube(api_client)
    sync = JobStoreSync(page_size=2)  # pages of two: the LIST follows continue tokens
    events, seen = _recorder(namespace)

    async def scenario() -> tuple[set[str], set[str], int, str | None]:
        first = JobWatch(sync, events, workers=4)
        first.ready.set()
        first.start(door)
        await _until(lambda: {n for t, n in seen if t is None} >= {"a", "b", "c"}, "the listed jobs")
        await asyncio.wait_for(sync.synced.wait(), 10)
        before = _held(sync, namespace)
        stopped_at = first.resource_version
        await first.stop()
        # The watch is down: b is deleted, d is created.
        delete = kube.custom.delete_namespaced_custom_object
        await asyncio.to_thread(delete, GROUP, VERSION, namespace, "agentjobs", "b")
        await asyncio.to_thread(_create, kube, namespace, "d")
        second = JobWatch(sync, events, workers=4)
        second.ready.set()
        second.start(door, resource_version=stopped_at if resume == "last-seen" else "1")
        await _until(lambda: ("DELETED", "b") in seen and any(n == "d" for _, n in seen), "b's deletion and d")
        after = _held(sync, namespace)
        await second.stop()
        return before, after, second.lists, stopped_at

    before, after, lists, stopped_at = asyncio.run(scenario())
    assert stopped_at, "the first watch saw a resourceVersion to resume from"
    assert before == {"a", "b"}, "the LIST found both jobs holding r1's slots"
    assert after == {"a"}, "b's slot on r1 is free: it left the store"
    assert sync.store.facts((namespace, "b")) is None
    assert sync.store.facts((namespace, "d")) is not None
    if resume == "too-old":
        assert lists == 1, "the server answered 410 and the watch listed again"
        assert (None, "d") in seen, "the re-list delivers what it found as listed jobs"
    else:
        assert lists == 0, "resumed from its last version: no LIST"
        assert seen.count(("DELETED", "b")) == 1


def test_steps_wait_for_the_gate_and_run_one_at_a_time_per_job(
    kube: Kube, api_client: client.ApiClient, crds: list[str], namespace: str
) -> None:
    """No step runs before Kopf's indexes are filled (the gate); then one job's steps never overlap."""
    for i in range(6):
        _create(kube, namespace, f"j{i}")
    sync = JobStoreSync(page_size=2)
    running: set[str] = set()
    overlaps: list[str] = []
    seen: list[str] = []
    last_runner: dict[str, str | None] = {}
    events = JobEvents()

    async def slow(event_type: str | None, body: Mapping[str, Any]) -> None:
        if body["metadata"]["namespace"] != namespace:
            return
        name = str(body["metadata"]["name"])
        if name in running:
            overlaps.append(name)
        running.add(name)
        await asyncio.sleep(0.05)
        running.discard(name)
        seen.append(name)
        last_runner[name] = ((body.get("status") or {}).get("assignment") or {}).get("runner")

    events.subscribe("slow", slow)

    async def scenario() -> tuple[list[str], bool]:
        watch = JobWatch(sync, events, workers=8)
        watch.start(OperatorKube(api_client))
        await asyncio.sleep(1.0)
        before_gate = list(seen)
        listed_first_page = len(sync.store) >= 2
        watch.ready.set()
        await _until(lambda: {f"j{i}" for i in range(6)} <= set(seen), "every job's steps")
        for _ in range(5):  # changes to one job while its steps run
            await asyncio.to_thread(assign_job, kube, namespace, "j0", "r1")
            await asyncio.to_thread(assign_job, kube, namespace, "j0", "r2")
        await _until(lambda: last_runner.get("j0") == "r2" and not running, "j0's newest copy to reach its steps")
        await watch.stop()
        return before_gate, listed_first_page

    before_gate, listed_first_page = asyncio.run(scenario())
    assert before_gate == [], "no step ran before the gate opened"
    assert listed_first_page, "the store was filled regardless"
    assert overlaps == [], "one job's steps never ran concurrently"
    assert 2 <= seen.count("j0") <= 11, "never more steps than events (1 listed, 10 changes)"


# The real operator through an API-server restart -----------------------------------------------


@pytest.fixture
def fleet(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> Iterator[Fleet]:
    fleet = make_fleet(kube, service_account_identity, namespace, name="watch", replicas=1, slots=4, renew_seconds=2)
    try:
        create_profile(kube, namespace, "review", "review-probe")
        yield fleet
    finally:
        fleet.stop()


def _assigned(kube: Kube, namespace: str, name: str) -> Any:
    return (get_job(kube, namespace, name).get("status") or {}).get("assignment")


def _job(kube: Kube, namespace: str, name: str) -> None:
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentjobs", job_manifest(name, profile="review", kind="review-probe")
    )


@pytest.mark.timeout(300)
def test_the_watch_survives_an_api_server_restart(
    fleet: Fleet, kube: Kube, namespace: str, outage: ApiServerOutage, operator: OperatorProcess
) -> None:
    _job(kube, namespace, "before")
    wait_for(lambda: _assigned(kube, namespace, "before"), timeout=120, describe="job before to be assigned")

    outage.stop()
    outage.start()
    _job(kube, namespace, "after")
    wait_for(lambda: _assigned(kube, namespace, "after"), timeout=120, describe="job after to be assigned")

    records = [r for r in operator.log_records() if "agentjob watch" in str(r.get("message", ""))]
    lost = [r for r in records if "lost the API server" in str(r["message"])]
    back = [r for r in records if "agentjob watch: back after" in str(r["message"])]
    assert len(lost) == 1, f"one warning for the outage, not one per attempt: {records}"
    assert back, f"the watch said it is back: {records}"
    after_outage = records[records.index(lost[0]) :]
    reopened = [r for r in after_outage if "the agentjob steps run" in str(r["message"])]
    assert reopened, f"the steps ran again after the outage: {records}"
    assert not [r for r in records if r.get("exc_info") or "Traceback" in str(r)], "no stack trace"

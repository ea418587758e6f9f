"""The router's audit batching, its recovery after a restart and its Events, through the real door.

:class:`~helmhive.controller.router.audits.RouterAudits` and
:func:`~helmhive.controller.router.recovery.ensure_routing_recorded` run in the test process on
:class:`helmhive.controller.kube.door.Kube`, authenticated as the operator's own ServiceAccount
(the ``helmhive-audit-trail`` admission policy lets nobody else write AuditRecords), against the
real API server. The jobs are real AgentJobs whose status holds a decision as routing writes it,
and the runners are real Runners. Every fact is read back from the API server: the records and
Events it holds, the creates it answered (``apiserver_request_total``), and the reads it served,
with their user and label selector (its audit log, :class:`harness.audit.ApiAuditLog`, so these
tests need the local control plane).

A failure is a real refusal. The router starts on a door whose token belongs to a ServiceAccount
that RBAC allows nothing (403), and the test swaps in the operator's door at the moment it names.
The operator's clock and the monotonic clock are injected, so no test sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from held_jobs import job_manifest
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.aio import run_closing
from harness.audit import ApiAuditLog
from harness.cluster import ClusterHandle
from harness.kube import IdentityFactory
from harness.kube import Kube as AdminKube
from harness.metrics import scrape_apiserver
from harness.wait import wait_for
from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.controller.kube.door import Kube
from helmhive.controller.router.audits import RouterAudits, ensure_routing_recorded
from helmhive.controller.router.settings import RateLimiter
from helmhive.controller.runtime import Runtime
from helmhive.deploy.manifests import OperatorIdentity
from helmhive.policy.audit.routing import build_routing_batch, build_routing_decisions, iter_routing_decisions

AGENTJOB = kind_by_name("AgentJob")
AUDIT = kind_by_name("AuditRecord")
RUNNER = kind_by_name("Runner")
ROUTING = "helmhive.dev/audit-action=RoutingDecisions"
NOW = dt.datetime(2026, 12, 2, 1, 0, tzinfo=dt.UTC)
DECIDED = "2026-12-02T00:59:59Z"
REFUSED = "router-without-rights"  # a ServiceAccount that RBAC allows nothing


# Doors and namespaces ------------------------------------------------------------------------------


@pytest.fixture
def door(helmhive_install: OperatorIdentity, service_account_identity: IdentityFactory) -> Kube:
    """The operator's door, with a real token of the operator's ServiceAccount."""
    who = service_account_identity(helmhive_install.namespace, helmhive_install.service_account, create=False)
    return Kube(who.api_client())


@pytest.fixture
def refusing(namespace: str, service_account_identity: IdentityFactory) -> Kube:
    """A door the API server refuses (403): its ServiceAccount has no RBAC at all."""
    return Kube(service_account_identity(namespace, REFUSED).api_client())


@pytest.fixture
def other_namespace(core_v1: client.CoreV1Api) -> Iterator[str]:
    """A second fresh namespace, deleted afterwards."""
    body = client.V1Namespace(
        metadata=client.V1ObjectMeta(generate_name="t-router-audits-other-", labels={"helmhive.dev/test": "true"})
    )
    name: str = core_v1.create_namespace(body).metadata.name
    yield name
    with contextlib.suppress(ApiException):
        core_v1.delete_namespace(name)


class Clock:
    """The injected monotonic clock."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def audits(kube: Kube, clock: Clock, *, now: Callable[[], dt.datetime] = lambda: NOW) -> RouterAudits:
    runtime = Runtime(kube=kube, clock=now)
    bucket = RateLimiter(rate=1e6, burst=10**6, clock=clock)
    return RouterAudits(
        runtime, bucket=bucket, workers=4, recovery_seconds=600, monotonic=clock, linger_seconds=0, retry_seconds=0
    )


# Real jobs, runners and records ----------------------------------------------------------------------


def _assigned_status(*, namespace: str, runner: str, attempt: int, decided: str) -> dict[str, Any]:
    return {
        "attempts": attempt,
        "routing": {"decidedAt": decided},
        "assignment": {
            "runner": runner,
            "runnerNamespace": namespace,
            "pool": "pool",
            "provider": "anthropic",
            "model": "m",
            "modelSource": "mapping",
            "mappingIndex": 0,
            "assignedAt": decided,
        },
        "conditions": [
            {"type": "Routed", "status": "True", "reason": "Assigned", "message": "ok", "lastTransitionTime": decided}
        ],
    }


async def create_job(door: Kube, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """Create AgentJob ``name`` and write ``status`` as routing would; the job as the API server answered."""
    await door.create(AGENTJOB, job_manifest(name, profile="review", kind="review-probe"), namespace=namespace)
    return await door.patch_status(AGENTJOB, name, {"status": status}, namespace=namespace)


async def create_assigned(
    door: Kube, namespace: str, numbers: Iterable[int], *, runner: str = "r0", attempt: int = 0, decided: str = DECIDED
) -> dict[int, dict[str, Any]]:
    """Jobs ``job-<i>`` assigned to ``runner`` (decided at ``decided``), by number."""
    numbers = list(numbers)
    limit = asyncio.Semaphore(16)

    async def one(i: int) -> dict[str, Any]:
        status = _assigned_status(namespace=namespace, runner=runner, attempt=attempt, decided=decided)
        async with limit:
            return await create_job(door, namespace, f"job-{i}", status)

    return dict(zip(numbers, await asyncio.gather(*(one(i) for i in numbers)), strict=True))


async def create_batches(door: Kube, records: Sequence[dict[str, Any]]) -> set[str]:
    """Create ``records`` (batches written before the crash) as the operator; their names."""
    limit = asyncio.Semaphore(16)

    async def one(record: dict[str, Any]) -> None:
        async with limit:
            await door.create(AUDIT, record, namespace=record["metadata"]["namespace"])

    await asyncio.gather(*(one(r) for r in records))
    return {r["metadata"]["name"] for r in records}


def routing_records(kube: AdminKube, namespace: str) -> list[dict[str, Any]]:
    """The namespace's ``RoutingDecisions`` batches, read from the API server."""
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, AUDIT.plural, label_selector=ROUTING
    )["items"]
    return items


def decisions(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"] for d in iter_routing_decisions(records)]


def operator_events(core_v1: client.CoreV1Api, namespace: str) -> list[Any]:
    """The namespace's Events written by the operator's door (its ``source.component``)."""
    listed = core_v1.list_namespaced_event(namespace).items
    return [e for e in listed if e.source is not None and e.source.component == "helmhive-operator"]


# What the API server saw ---------------------------------------------------------------------------------


def _creates(api_client: client.ApiClient) -> Counter[str]:
    series = scrape_apiserver(api_client).series("apiserver_request_total", verb="POST", resource=AUDIT.plural)
    counts: Counter[str] = Counter()
    for sample in series:
        counts[sample.labels["code"]] += int(sample.value)
    return counts


def expect_creates(api_client: client.ApiClient, before: Counter[str], expected: dict[str, int]) -> None:
    """The API server answered exactly ``expected`` AuditRecord creates (by status code) since ``before``.

    Only these tests write AuditRecords on the session's cluster. Polled: a request is counted as
    its handler finishes, which may be just after the client has its answer.
    """

    def counted() -> bool:
        answered = _creates(api_client) - before
        assert answered == expected, dict(answered)
        return True

    wait_for(counted, timeout=10, describe=f"AuditRecord creates answered {expected}")


@dataclass(frozen=True)
class Read:
    """One read of AuditRecords the API server served (its audit log's event)."""

    user: str
    namespace: str
    verb: str
    query: dict[str, str]
    code: int


def record_reads(cluster: ClusterHandle, kube: AdminKube, namespaces: Sequence[str], users: set[str]) -> list[Read]:
    """The reads of AuditRecords in ``namespaces`` by ``users``, in the order they were received.

    An event is logged as its request ends, so an admin read with a selector of its own is sent
    first and waited for: every read that ended before it is logged by then.
    """
    log = ApiAuditLog.of(cluster)
    marker = f"helmhive.dev/test-sentinel={uuid.uuid4().hex}"
    kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespaces[0], AUDIT.plural, label_selector=marker)

    def logged() -> list[dict[str, Any]]:
        events = [e for e in log.events() if (e.get("objectRef") or {}).get("resource") == AUDIT.plural]
        assert any(dict(parse_qsl(urlsplit(e["requestURI"]).query)).get("labelSelector") == marker for e in events)
        return events

    events = wait_for(logged, timeout=30, describe="the sentinel read in the API server's audit log")
    reads = [
        (
            e["requestReceivedTimestamp"],
            Read(
                user=e["user"]["username"],
                namespace=e["objectRef"].get("namespace", ""),
                verb=e["verb"],
                query=dict(parse_qsl(urlsplit(e["requestURI"]).query)),
                code=int((e.get("responseStatus") or {}).get("code", 0)),
            ),
        )
        for e in events
        if e["user"]["username"] in users and e["objectRef"].get("namespace") in namespaces
    ]
    return [read for _, read in sorted(reads, key=lambda pair: pair[0])]


@contextlib.contextmanager
def operator_door_after_first_refusal(runtime: Runtime, door: Kube) -> Iterator[list[str]]:
    """Swap ``door`` into ``runtime`` when recovery logs its first refused LIST (before it retries).

    The refusal is the API server's; the swap stands for the API server answering again. Yields
    the refusals logged.
    """
    refusals: list[str] = []

    class Swap(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "batches not listed" in record.getMessage():
                refusals.append(record.getMessage())
                runtime.kube = door

    handler = Swap(logging.WARNING)
    logger = logging.getLogger("helmhive.routing")
    logger.addHandler(handler)
    try:
        yield refusals
    finally:
        logger.removeHandler(handler)


# The tests ------------------------------------------------------------------------------------------------


def test_a_burst_is_written_as_a_few_bounded_batches_per_namespace(
    kube: AdminKube, door: Kube, namespace: str, other_namespace: str
) -> None:
    namespaces = (namespace, other_namespace)

    async def scenario() -> tuple[list[dict[str, Any]], bool]:
        team = await create_assigned(door, namespace, range(250))
        other = await create_assigned(door, other_namespace, range(3))
        a = audits(door, Clock())
        for job in [*team.values(), *other.values()]:
            a.record(job, runner=None)
        unflushed = await asyncio.to_thread(lambda: [r for ns in namespaces for r in routing_records(kube, ns)])
        return unflushed, await a.flush()

    unflushed, flushed = run_closing(scenario(), door)
    assert unflushed == []  # nothing is written on the routing path
    assert flushed is True
    records = {ns: routing_records(kube, ns) for ns in namespaces}
    assert sorted(len(r["spec"]["decisions"]) for held in records.values() for r in held) == [3, 50, 100, 100]
    assert {ns for ns, held in records.items() if held} == {namespace, other_namespace}
    assert all(d["object"]["namespace"] == ns for ns, held in records.items() for d in decisions(held))
    assert sorted(d["object"]["name"] for d in decisions(records[namespace])) == sorted(f"job-{i}" for i in range(250))


def test_a_failed_create_is_retried_as_the_same_record_and_a_409_counts_as_written(
    api_client: client.ApiClient, kube: AdminKube, door: Kube, refusing: Kube, namespace: str
) -> None:
    """The first try is refused (403); before the retry, its record is put there as the operator, for a first
    try that had reached the API server after all (a create whose answer was lost: no door can make the API
    server commit a create and then lose its answer on demand)."""
    before = _creates(api_client)

    async def scenario() -> tuple[bool, list[dict[str, Any]], str, bool, list[dict[str, Any]]]:
        jobs = await create_assigned(door, namespace, [0, 1, 2, 9])
        a = audits(refusing, Clock())
        for i in range(3):
            a.record(jobs[i], runner=None)
        refused = await a.flush()
        after_refusal = await asyncio.to_thread(routing_records, kube, namespace)
        (first,) = a.failed
        a.record(jobs[9], runner=None)  # a later decision goes in a batch of its own
        await door.create(AUDIT, copy.deepcopy(first), namespace=namespace)
        a.runtime.kube = door
        retried = await a.flush()
        return refused, after_refusal, first["metadata"]["name"], retried, a.failed

    refused, after_refusal, first, retried, failed = run_closing(scenario(), door, refusing)
    assert refused is False and after_refusal == []
    assert retried is True
    # The stand-in and job-9's batch created; the retry, under the first try's name, answered 409.
    expect_creates(api_client, before, {"201": 2, "409": 1})
    records = routing_records(kube, namespace)
    assert sorted(len(r["spec"]["decisions"]) for r in records) == [1, 3]
    held = {r["metadata"]["name"]: sorted(d["object"]["name"] for d in r["spec"]["decisions"]) for r in records}
    assert held.pop(first) == ["job-0", "job-1", "job-2"]
    assert list(held.values()) == [["job-9"]]
    assert failed == []


def test_recovery_queues_only_the_decisions_no_record_holds(
    cluster: ClusterHandle,
    kube: AdminKube,
    door: Kube,
    namespace: str,
    helmhive_install: OperatorIdentity,
) -> None:
    async def scenario() -> None:
        jobs = await create_assigned(door, namespace, [1, 2])
        jobs |= await create_assigned(door, namespace, [3], decided="2026-12-01T00:00:00Z")
        held = build_routing_batch(namespace=namespace, entries=build_routing_decisions(job=jobs[1], now=NOW), now=NOW)
        await create_batches(door, [held])
        a = audits(door, Clock())
        a.recover((namespace, "job-1"), jobs[1])  # recorded before the crash
        a.recover((namespace, "job-2"), jobs[2])  # cut off by it
        a.recover((namespace, "job-3"), jobs[3])
        await asyncio.gather(*a.background)
        await a.flush()

    run_closing(scenario(), door)
    names = sorted(d["object"]["name"] for d in decisions(routing_records(kube, namespace)))
    assert names == ["job-1", "job-2"]  # job-2 written once; job-3 is older than the window
    reads = record_reads(cluster, kube, [namespace], {helmhive_install.username})
    selector = f"{ROUTING},helmhive.dev/audit-hour in (2026120200,2026120201)"
    assert [(r.verb, r.query) for r in reads] == [
        ("list", {"limit": "50", "labelSelector": selector})
    ]  # one LIST of the namespace's batches of the window's hours, not one per job


def test_a_restart_over_many_jobs_lists_each_namespaces_batches_once_and_keeps_only_keys(
    cluster: ClusterHandle,
    kube: AdminKube,
    door: Kube,
    namespace: str,
    other_namespace: str,
    helmhive_install: OperatorIdentity,
) -> None:
    """After a restart every recently decided job is checked: one labelled LIST per job made 10,000
    LISTs (and held each job's entries until its turn). Now one paginated LIST per namespace, diffed
    in memory; a crash cut off the last 30 decisions of each namespace."""
    namespaces = (namespace, other_namespace)

    async def scenario() -> tuple[int, RouterAudits, set[str]]:
        jobs = {ns: await create_assigned(door, ns, range(300)) for ns in namespaces}
        batches = []
        for ns in namespaces:
            entries = [e for i in range(270) for e in build_routing_decisions(job=jobs[ns][i], now=NOW)]
            batches += [
                build_routing_batch(namespace=ns, entries=entries[i : i + 100], now=NOW)
                for i in range(0, len(entries), 100)
            ]
        # job-299's only batch, built in an hour outside the window.
        last = build_routing_decisions(job=jobs[namespace][299], now=NOW)
        stale = build_routing_batch(namespace=namespace, entries=last, now=NOW - dt.timedelta(hours=5))
        seeded = await create_batches(door, [*batches, stale])
        a = audits(door, Clock())
        for i in range(300):
            for ns in namespaces:
                a.recover((ns, f"job-{i}"), jobs[ns][i])
        tasks = len(a.background)
        await asyncio.gather(*a.background)
        await a.flush()
        return tasks, a, seeded

    tasks, a, seeded = run_closing(scenario(), door)
    assert tasks == 2  # one worker per namespace, not one task per job
    reads = record_reads(cluster, kube, namespaces, {helmhive_install.username})
    # 3 batches a namespace: one page each.
    assert sorted((r.namespace, r.verb, "continue" in r.query) for r in reads) == sorted(
        (ns, "list", False) for ns in namespaces
    )
    assert a.recovery.lists == 2
    assert not a.recovery.checks and not a.recovery.workers
    assert {len(keys) for keys in a.recovery.held.values()} == {270}  # the window's keys, not the stale batch's
    written = [r for ns in namespaces for r in routing_records(kube, ns) if r["metadata"]["name"] not in seeded]
    recovered = sorted((d["object"]["namespace"], d["object"]["name"]) for d in decisions(written))
    expected = sorted((ns, f"job-{i}") for ns in namespaces for i in range(270, 300))
    assert recovered == expected  # job-299 too: its only batch is outside the listed hours (twice, never zero)


def test_the_recovery_list_is_paginated_and_retried_and_later_decisions_are_not_looked_up(
    cluster: ClusterHandle,
    kube: AdminKube,
    door: Kube,
    refusing: Kube,
    namespace: str,
    helmhive_install: OperatorIdentity,
) -> None:
    now = [NOW]

    async def scenario() -> tuple[list[str], set[str]]:
        jobs = await create_assigned(door, namespace, range(120))
        seeded = await create_batches(
            door,
            [
                build_routing_batch(namespace=namespace, entries=build_routing_decisions(job=job, now=NOW), now=NOW)
                for job in jobs.values()
            ],
        )
        (later,) = (await create_assigned(door, namespace, [200], decided="2026-12-02T01:00:05Z")).values()
        a = audits(refusing, Clock(), now=lambda: now[0])
        with operator_door_after_first_refusal(a.runtime, door) as refusals:
            a.recover((namespace, "job-1"), jobs[1])
            await asyncio.gather(*a.background)
        now[0] = NOW + dt.timedelta(seconds=10)
        a.recover((namespace, "job-200"), later)  # decided after the LIST
        await asyncio.gather(*a.background)
        await a.flush()
        return refusals, seeded

    refusals, seeded = run_closing(scenario(), door, refusing)
    assert len(refusals) == 1 and "403" in refusals[0], refusals
    refused_user = f"system:serviceaccount:{namespace}:{REFUSED}"
    reads = record_reads(cluster, kube, [namespace], {helmhive_install.username, refused_user})
    operator = helmhive_install.username
    # Refused once, then 120 batches in pages of 50.
    assert [(r.user, r.code, r.query.get("limit"), "continue" in r.query) for r in reads] == [
        (refused_user, 403, "50", False),
        (operator, 200, "50", False),
        (operator, 200, "50", True),
        (operator, 200, "50", True),
    ]
    written = [r for r in routing_records(kube, namespace) if r["metadata"]["name"] not in seeded]
    assert [d["object"]["name"] for d in decisions(written)] == ["job-200"]  # no second LIST for it


def test_the_lost_runner_step_writes_an_unrecorded_run_before_it_is_cleared(
    api_client: client.ApiClient, kube: AdminKube, door: Kube, namespace: str
) -> None:
    before = _creates(api_client)

    async def scenario() -> None:
        (job,) = (await create_assigned(door, namespace, [4], attempt=1, runner="r7")).values()
        await ensure_routing_recorded(door, job, now=NOW)
        await ensure_routing_recorded(door, job, now=NOW)  # already there: no write

    run_closing(scenario(), door)
    assert [(d["attempt"], d["details"]["runner"]) for d in decisions(routing_records(kube, namespace))] == [(1, "r7")]
    expect_creates(api_client, before, {"201": 1})


def test_assignments_make_one_event_per_runner_whose_count_is_patched_at_most_every_interval(
    core_v1: client.CoreV1Api, door: Kube, namespace: str
) -> None:
    clock = Clock()
    runner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Runner", "spec": {"poolRef": {"name": "pool"}}}

    async def scenario() -> tuple[dict[str, str], list[Any], list[Any]]:
        uids = {
            name: (await door.create(RUNNER, {**runner, "metadata": {"name": name}}, namespace=namespace))["metadata"][
                "uid"
            ]
            for name in ("r0", "r1")
        }
        jobs = await create_assigned(door, namespace, [0, 1, 2, 4], runner="r0")
        jobs |= await create_assigned(door, namespace, [3], runner="r1")
        a = audits(door, clock)
        for i in range(3):
            a.record(jobs[i], runner=(namespace, "r0"))
        a.record(jobs[3], runner=(namespace, "r1"))
        await a.events.flush()
        first = await asyncio.to_thread(operator_events, core_v1, namespace)
        a.record(jobs[4], runner=(namespace, "r0"))
        await a.events.flush()
        within = await asyncio.to_thread(operator_events, core_v1, namespace)
        clock.t += 30
        await a.events.flush()
        return uids, first, within

    uids, first, within = run_closing(scenario(), door)
    last = operator_events(core_v1, namespace)
    assert sorted((e.involved_object.name, e.count) for e in first) == [("r0", 3), ("r1", 1)]
    assert {e.involved_object.uid for e in first} == {uids["r0"], uids["r1"]}
    assert all(e.reason == "JobsRouted" and e.type == "Normal" for e in first)
    name = {e.involved_object.name: e.metadata.name for e in first}

    def written(events: list[Any]) -> dict[str, tuple[int, str]]:
        return {e.metadata.name: (e.count, e.metadata.resource_version) for e in events}

    assert written(within) == written(first)  # within the interval: counted, not written
    assert written(last).keys() == written(first).keys()  # the same two Events: no per-job Event
    patched = {n: count for n, (count, version) in written(last).items() if written(first)[n][1] != version}
    assert patched == {name["r0"]: 4}  # one patch, of the runner's first Event


@pytest.mark.parametrize("reason", ["ModelNotAdvertised", "NoEligibleMapping"])
def test_a_failed_decision_gets_a_warning_event_on_its_job(
    reason: str, core_v1: client.CoreV1Api, kube: AdminKube, door: Kube, namespace: str
) -> None:
    routed = {"type": "Routed", "status": "False", "reason": reason, "message": f"no: {reason}"}
    status = {"routing": {"consideredRunners": 2}, "conditions": [{**routed, "lastTransitionTime": DECIDED}]}

    async def scenario() -> None:
        failed = await create_job(door, namespace, "bad", status)
        a = audits(door, Clock())
        a.record(failed, runner=None)
        await asyncio.gather(*a.background)
        await a.flush()

    run_closing(scenario(), door)
    assert [(e.type, e.reason, e.involved_object.name) for e in operator_events(core_v1, namespace)] == [
        ("Warning", "JobRoutingFailed", "bad")
    ]
    assert [d["action"] for d in decisions(routing_records(kube, namespace))] == ["JobRoutingFailed"]


def test_a_decision_both_recorded_and_recovered_by_one_process_is_written_once(
    kube: AdminKube, door: Kube, namespace: str
) -> None:
    """Whichever comes second adds nothing: the router's record after a recovery check, or the reverse."""

    async def scenario() -> None:
        jobs = await create_assigned(door, namespace, [1, 2])
        a = audits(door, Clock())
        a.record(jobs[1], runner=None)  # routed here; its watch event comes back after a forget
        a.forget((namespace, "job-1"))
        a.recover((namespace, "job-1"), jobs[1])
        a.recover((namespace, "job-2"), jobs[2])  # recovered first, then recorded by the router
        await asyncio.gather(*a.background)
        a.record(jobs[2], runner=None)
        await a.flush()

    run_closing(scenario(), door)
    assert sorted(d["object"]["name"] for d in decisions(routing_records(kube, namespace))) == ["job-1", "job-2"]

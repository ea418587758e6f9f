"""The operator's AgentJob store: jobs by runner and implementations by change, in any event order.

The LIST that fills :class:`helmhive.policy.routing.job_store.JobStore` and Kopf's watch are independent,
so a job's copies arrive out of order; the store keeps the newest by resourceVersion, never
counts a job twice, and a deleted job never comes back.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from helmhive.policy.routing.job_store import JobStore, build_job_facts

RUNNER = ("runners", "r1")
OTHER = ("runners", "r2")


def job(
    name: str,
    version: int | str | None,
    *,
    runner: str | None = None,
    finished: bool = False,
    change: tuple[str, int] | None = None,
    provider: str = "anthropic",
) -> dict[str, Any]:
    status: dict[str, Any] = {"profile": {"name": "p"}, "conditions": []}
    if runner:
        status["assignment"] = {"runner": runner, "runnerNamespace": "runners", "provider": provider}
        status["conditions"].append({"type": "Routed", "status": "True", "reason": "Routed"})
    if finished:
        status["conditions"].append({"type": "Succeeded", "status": "True", "reason": "Completed"})
    spec: dict[str, Any] = {"jobKind": "implementation"}
    if change is not None:
        spec["change"] = {"name": change[0], "iteration": change[1], "stage": "implementation"}
    meta: dict[str, Any] = {"name": name, "namespace": "team"}
    if version is not None:
        meta["resourceVersion"] = str(version)
    return {"metadata": meta, "spec": spec, "status": status}


def held(store: JobStore, runner: tuple[str, str] = RUNNER) -> set[tuple[str, str]]:
    return set(store.held_on(runner))


def test_an_assigned_unfinished_job_is_held_on_its_runner_until_it_finishes() -> None:
    store = JobStore()
    store.observe(None, job("a", 10))
    assert held(store) == set() and len(store) == 1
    store.observe("MODIFIED", job("a", 11, runner="r1"))
    assert held(store) == {("team", "a")}
    store.observe("MODIFIED", job("a", 12, runner="r1", finished=True))
    assert held(store) == set()
    assert dict(store.jobs_by_runner) == {}  # no empty sets left behind
    assert dict(store.counts_by_runner) == {}  # nor zero counts


def test_a_job_moved_to_another_runner_is_counted_on_the_new_one_only() -> None:
    store = JobStore()
    store.observe("MODIFIED", job("a", 5, runner="r1"))
    store.observe("MODIFIED", job("a", 6, runner="r2"))
    assert held(store) == set() and held(store, OTHER) == {("team", "a")}


def test_an_event_older_than_the_listed_copy_is_ignored() -> None:
    """Kopf's watch may deliver an unassigned copy after the LIST showed the job assigned."""
    store = JobStore()
    store.begin_listing()
    assert store.add_listed([job("a", 20, runner="r1"), job("b", 21, runner="r1")]) == 2
    assert store.observe(None, job("a", 15)) is False  # Kopf's own listing, older
    assert store.observe("MODIFIED", job("b", 19)) is False
    store.finish_listing()
    assert held(store) == {("team", "a"), ("team", "b")}
    assert store.synced


def test_a_listed_copy_older_than_an_event_is_ignored() -> None:
    """The job finished (an event) before the LIST's older page, which still shows it running, arrived."""
    store = JobStore()
    store.begin_listing()
    store.observe("MODIFIED", job("a", 30, runner="r1", finished=True))
    assert store.add_listed([job("a", 25, runner="r1")]) == 0
    store.finish_listing()
    assert held(store) == set()


def test_a_job_deleted_during_the_list_does_not_come_back_from_an_older_page() -> None:
    store = JobStore()
    store.begin_listing()
    store.observe("MODIFIED", job("a", 40, runner="r1"))
    store.observe("DELETED", job("a", 41, runner="r1"))
    assert held(store) == set() and len(store) == 0
    assert store.add_listed([job("a", 40, runner="r1")]) == 0
    store.observe(None, job("a", 39, runner="r1"))  # an older event of the deleted job, late
    assert held(store) == set() and len(store) == 0
    # Re-created under the same name later: a newer version, so it counts again.
    store.observe("ADDED", job("a", 50, runner="r1"))
    store.finish_listing()
    assert held(store) == {("team", "a")}


def test_a_deleted_job_leaves_the_store_after_it_is_synced() -> None:
    store = JobStore()
    store.begin_listing()
    store.add_listed([job("a", 7, runner="r1", change=("c", 1))])
    store.finish_listing()
    assert store.implementation_provider(("team", "c", 1)) == "anthropic"
    store.observe("DELETED", job("a", 9, runner="r1", change=("c", 1)))
    assert held(store) == set() and len(store) == 0
    assert store.implementation_provider(("team", "c", 1)) is None


def test_a_stale_deletion_does_not_remove_a_newer_copy() -> None:
    store = JobStore()
    store.observe("MODIFIED", job("a", 60, runner="r1"))
    assert store.observe("DELETED", job("a", 55)) is False
    assert held(store) == {("team", "a")}


def test_implementation_providers_are_kept_per_change_and_iteration() -> None:
    store = JobStore()
    store.observe(None, job("impl-1", 3, runner="r1", change=("c", 1), provider="openai"))
    store.observe(None, job("impl-2", 4, runner="r2", change=("c", 2), provider="anthropic"))
    store.observe(None, job("plain", 5, runner="r2"))
    assert store.implementation_provider(("team", "c", 1)) == "openai"
    assert store.implementation_provider(("team", "c", 2)) == "anthropic"
    assert store.implementation_provider(("team", "c", 3)) is None
    # The provider stays known after the implementation finished (reviews avoid it).
    store.observe("MODIFIED", job("impl-1", 8, runner="r1", change=("c", 1), provider="openai", finished=True))
    assert store.implementation_provider(("team", "c", 1)) == "openai"
    assert held(store) == set()


def test_a_resource_version_that_is_not_an_integer_is_applied_as_newest() -> None:
    store = JobStore()
    store.observe("MODIFIED", job("a", 100, runner="r1"))
    store.observe("MODIFIED", job("a", "opaque", runner="r1", finished=True))
    assert held(store) == set()
    assert build_job_facts(job("a", None)).version is None


def test_the_store_keeps_slim_facts_not_objects() -> None:
    facts = build_job_facts(job("a", 12, runner="r1", change=("c", 2)))
    assert facts == (12, RUNNER, (("team", "c", 2), "anthropic"), None, None)
    body = job("b", 13, runner="r1")
    body["status"]["profile"]["revision"] = "p-1"
    assert build_job_facts(body) == (13, RUNNER, None, ("p", "p-1"), None)


@pytest.mark.parametrize("seed", range(40))
def test_any_interleaving_of_the_list_and_the_events_ends_in_the_newest_state(seed: int) -> None:
    """Each job's history is delivered by the watch in order and by the LIST as one snapshot, interleaved at random.

    Whatever the order, the synced store counts exactly the jobs whose newest copy holds a runner.
    """
    rng = random.Random(seed)
    histories: dict[str, list[tuple[str | None, dict[str, Any]]]] = {}
    version = itertools.count(1)
    for i in range(12):
        name = f"j{i}"
        steps: list[tuple[str | None, dict[str, Any]]] = [("ADDED", job(name, next(version)))]
        if rng.random() < 0.8:
            steps.append(("MODIFIED", job(name, next(version), runner=rng.choice(["r1", "r2"]))))
        if rng.random() < 0.4:
            steps.append(("MODIFIED", job(name, next(version), runner="r1", finished=True)))
        if rng.random() < 0.3:
            steps.append(("DELETED", steps[-1][1] | {"metadata": {**steps[-1][1]["metadata"]}}))
            steps[-1][1]["metadata"]["resourceVersion"] = str(next(version))
        histories[name] = steps
    # The LIST's snapshot: each job as it was at some point in its history (or not yet / no longer there).
    listed = []
    for steps in histories.values():
        cut = rng.randrange(len(steps) + 1)
        if cut and steps[cut - 1][0] != "DELETED":
            listed.append(steps[cut - 1][1])
    events = [(name, step) for name, steps in histories.items() for step in steps]
    # The watch delivers each job's events in order; jobs interleave at random, the LIST's pages anywhere.
    rng.shuffle(events)
    events.sort(key=lambda e: (e[0], int(e[1][1]["metadata"]["resourceVersion"])))
    queues = {name: [s for n, s in events if n == name] for name in histories}
    store = JobStore()
    pages = [listed[i : i + 3] for i in range(0, len(listed), 3)]
    store.begin_listing()
    while any(queues.values()) or pages:
        names = [n for n, q in queues.items() if q]
        if pages and (not names or rng.random() < 0.3):
            store.add_listed(pages.pop(0))
            continue
        event_type, body = queues[rng.choice(names)].pop(0)
        store.observe(event_type, body)
    store.finish_listing()
    expected: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for name, steps in histories.items():
        event_type, last = steps[-1]
        runner = build_job_facts(last).runner
        if event_type != "DELETED" and runner is not None:
            expected.setdefault(runner, set()).add(("team", name))
    assert {r: set(jobs) for r, jobs in store.jobs_by_runner.items()} == expected
    assert dict(store.counts_by_runner) == {r: len(jobs) for r, jobs in expected.items()}
    assert len(store) == sum(1 for steps in histories.values() if steps[-1][0] != "DELETED")


def bound(
    name: str, version: int, revision: str | None, *, finished: bool = False, namespace: str = "team"
) -> dict[str, Any]:
    body = job(name, version, finished=finished)
    body["metadata"]["namespace"] = namespace
    if revision is not None:
        body["status"]["profile"] = {"name": "p", "revision": revision}
    return body


def test_revisions_in_use_follow_each_unfinished_jobs_binding() -> None:
    store = JobStore()
    store.observe(None, bound("a", 1, "p-1"))
    store.observe(None, bound("b", 2, "p-2"))
    store.observe(None, bound("c", 3, None))  # not bound yet
    store.observe(None, bound("d", 4, "p-9", namespace="other"))
    assert store.revisions_in_use("team", "p") == {"p-1", "p-2"}
    assert store.revisions_in_use("team", "q") == set()
    assert store.revisions_in_use("other", "p") == {"p-9"}
    store.observe("MODIFIED", bound("a", 5, "p-1", finished=True))  # a finished job holds nothing
    assert store.revisions_in_use("team", "p") == {"p-2"}
    store.observe("MODIFIED", bound("b", 1, "p-2", finished=True))  # older copy: ignored
    assert store.revisions_in_use("team", "p") == {"p-2"}
    store.observe("DELETED", bound("b", 6, "p-2"))
    assert store.revisions_in_use("team", "p") == set()
    assert store._bindings == {("other", "p"): {("other", "d"): "p-9"}}  # nothing empty left behind


def _probe(name: str, version: int, *, runner: str | None = None, finished: bool = False) -> dict[str, Any]:
    body = job(name, version, runner=runner, finished=finished)
    body["metadata"]["labels"] = {
        "helmhive.dev/qualification": "r1",
        "helmhive.dev/qualification-probe": "connection-test",
    }
    body["metadata"]["annotations"] = {"helmhive.dev/qualification-round": "1"}
    return body


def test_the_store_tells_which_runner_freed_a_slot_and_whose_probe_changed() -> None:
    store = JobStore()
    released: list[tuple[str, str]] = []
    probed: list[tuple[str, str]] = []
    store.on_release, store.on_probe = released.append, probed.append
    store.observe("ADDED", job("user", 1, runner="r1"))
    store.observe("MODIFIED", job("user", 2, runner="r1"))  # still holds r1: nothing freed
    assert released == [] and probed == []
    store.observe("MODIFIED", job("user", 3, runner="r1", finished=True))
    assert released == [RUNNER]
    store.observe("ADDED", _probe("r1-q1-connection", 4))
    assert probed == [("team", "r1")]
    assert store.probes_of(("team", "r1"))["r1-q1-connection"].round == 1
    store.observe("MODIFIED", _probe("r1-q1-connection", 5, runner="r1"))
    store.observe("DELETED", _probe("r1-q1-connection", 6, runner="r1"))
    assert probed == [("team", "r1")] * 3
    assert released == [RUNNER, RUNNER]  # the probe held r1, and its deletion freed it
    assert store.probes_of(("team", "r1")) == {}

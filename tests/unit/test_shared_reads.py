"""Shared single-object reads (:class:`helmhive.controller.kube.shared_reads.SharedReads`).

The fetch here is an in-process object store whose GETs the test finishes one at a time, so
the order of "asked", "GET started" and "GET answered" is exact. The same class against the
real API server: ``tests/operator/test_shared_reads_cluster.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from helmhive.api.kinds import KindDef, kind_by_name
from helmhive.api.kubeerrors import NotFound
from helmhive.controller.kube.shared_reads import SharedReads

PROFILE = kind_by_name("Profile")
WORKSPACE = kind_by_name("Workspace")


class Store:
    """Objects by name, with a version; each GET waits until the test releases it."""

    def __init__(self) -> None:
        self.version = 1
        self.started: list[tuple[str, int]] = []  # (name, the version when the GET started)
        self.release: asyncio.Queue[None] = asyncio.Queue()
        self.missing: set[str] = set()

    async def fetch(self, kind: KindDef, name: str, namespace: str) -> dict[str, Any]:
        at = self.version  # a real GET reads the state of the moment it reaches the server
        self.started.append((name, at))
        await self.release.get()
        if name in self.missing:
            raise NotFound(404, f"{kind.plural} {name} not found")
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(at)}, "kind": kind.kind}


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_callers_that_ask_during_a_read_share_the_next_one_never_the_one_in_flight() -> None:
    store = Store()
    reads = SharedReads(store.fetch)
    first = asyncio.create_task(reads.get(PROFILE, "p", "ns"))
    await _settle()
    assert store.started == [("p", 1)]
    store.version = 2  # the profile changes while the first GET is in flight ...
    later = [asyncio.create_task(reads.get(PROFILE, "p", "ns")) for _ in range(5)]  # ... then five jobs ask
    await _settle()
    assert len(store.started) == 1, "no second GET while the first is in flight"
    store.release.put_nowait(None)
    assert (await first)["metadata"]["resourceVersion"] == "1"
    await _settle()
    assert store.started == [("p", 1), ("p", 2)], "the five share one GET, started after they asked"
    store.release.put_nowait(None)
    answers = await asyncio.gather(*later)
    assert {a["metadata"]["resourceVersion"] for a in answers} == {"2"}, "none got the copy from before they asked"
    assert (reads.asked, reads.sent) == (6, 2)


async def test_each_object_has_its_own_reads() -> None:
    store = Store()
    reads = SharedReads(store.fetch)
    tasks = [
        asyncio.create_task(reads.get(PROFILE, "p", "ns")),
        asyncio.create_task(reads.get(WORKSPACE, "p", "ns")),
        asyncio.create_task(reads.get(PROFILE, "p", "other")),
    ]
    await _settle()
    assert len(store.started) == 3
    for _ in tasks:
        store.release.put_nowait(None)
    kinds = {(a["kind"], a["metadata"]["namespace"]) for a in await asyncio.gather(*tasks)}
    assert kinds == {("Profile", "ns"), ("Workspace", "ns"), ("Profile", "other")}


async def test_an_error_reaches_every_caller_of_that_read_and_the_next_read_is_fresh() -> None:
    store = Store()
    store.missing.add("p")
    reads = SharedReads(store.fetch)
    callers = [asyncio.create_task(reads.get(PROFILE, "p", "ns")) for _ in range(3)]
    await _settle()
    store.release.put_nowait(None)
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(r, NotFound) for r in results)
    store.missing.clear()  # created meanwhile: the next caller's own read finds it
    again = asyncio.create_task(reads.get(PROFILE, "p", "ns"))
    await _settle()
    store.release.put_nowait(None)
    assert (await again)["metadata"]["name"] == "p"
    assert reads.sent == 2


async def test_a_cancelled_caller_does_not_cancel_the_read_the_others_wait_for() -> None:
    store = Store()
    reads = SharedReads(store.fetch)
    leaving = asyncio.create_task(reads.get(PROFILE, "p", "ns"))
    staying = asyncio.create_task(reads.get(PROFILE, "p", "ns"))
    await _settle()
    leaving.cancel()
    await _settle()
    store.release.put_nowait(None)
    assert (await staying)["metadata"]["name"] == "p"
    with pytest.raises(asyncio.CancelledError):
        await leaving


async def test_close_cancels_the_reads_in_flight() -> None:
    store = Store()
    reads = SharedReads(store.fetch)
    waiting = asyncio.create_task(reads.get(PROFILE, "p", "ns"))
    await _settle()
    await reads.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting

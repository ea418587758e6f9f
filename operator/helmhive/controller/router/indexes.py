"""The router's read side of Kopf's indexes and the AgentJob store: the fleet as a job's namespace sees it.

Owns (:class:`RouterIndexes`, between :class:`~helmhive.controller.router.capacity.Capacity`
and :class:`~helmhive.controller.router.engine.Router`): the index stores the routing handlers fill
(:mod:`helmhive.controller.router.handlers` hands them over once, :meth:`RouterIndexes.bind`), the
runner views per job namespace, cached until a runner, pool or namespace changes
(:meth:`RouterIndexes.changed_topology`; a Runner event changes them only when it changes what
routing sees of that runner, :meth:`RouterIndexes.runner_view_changed`: a runner's periodic
report alone does not, so a fleet of 1,000 reporting runners does not rebuild the views over
and over; such a change also re-decides the jobs waiting for a runner,
:meth:`RouterIndexes.fleet_changed`), and which provider a change's implementation ran on
(the operator's AgentJob store, :class:`~helmhive.policy.routing.job_store.JobStore`, or this process's
own write, known before its watch event). Jobs are not in Kopf's indexes: an index on a kind
with thousands of objects makes Kopf's start-up O(N²).

Pure reads of memory: no API call, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from helmhive.controller.router.capacity import Capacity
from helmhive.policy.memory.selection import NamedMemoryRecord
from helmhive.policy.routing.inputs import PoolServing, RunnerFacts, build_runner_view, build_runner_views
from helmhive.policy.routing.job_store import JobStore
from helmhive.policy.routing.prepared import RunnerSet
from helmhive.policy.routing.route import RunnerKey, RunnerView, SessionBindingView

__all__ = ["RouterIndexes"]


class RouterIndexes(Capacity):
    """Kopf's routing indexes and the runner views built from them (see the module docstring)."""

    def __init__(self, *, monotonic: Callable[[], float], job_store: JobStore) -> None:
        super().__init__(monotonic=monotonic)
        self.job_store = job_store
        self.jobs_by_runner = job_store.jobs_by_runner
        self.runner_counts = job_store.counts_by_runner
        # Empty until Kopf hands the indexes over.
        self.runners: Mapping[Any, Iterable[RunnerFacts]] = {}
        self.pools: Mapping[Any, Iterable[PoolServing]] = {}
        self.namespaces: Mapping[Any, Iterable[dict[str, str]]] = {}
        self.memory: Mapping[Any, Iterable[NamedMemoryRecord]] = {}
        self.sessions: Mapping[Any, Iterable[SessionBindingView]] = {}
        self.implementations_written: dict[tuple[str, str, int], str] = {}  # (namespace, change, iteration) -> provider
        self.topology = 0  # bumped when runners, pools or namespaces change
        self._views: dict[str, tuple[int, RunnerSet]] = {}
        self._runner_seen: dict[RunnerKey, RunnerView] = {}  # each runner's view when topology last took it in

    def bind(self, indexes: Mapping[str, Any]) -> None:
        """Take the Kopf indexes (the same objects for the operator's lifetime)."""
        self.runners = indexes["routing_runners"]
        self.pools = indexes["routing_pools"]
        self.namespaces = indexes["routing_namespaces"]
        self.memory = indexes["routing_memory"]
        self.sessions = indexes["routing_sessions"]

    def changed_topology(self) -> None:
        self.topology += 1

    def fleet_changed(self, *, namespace: str | None = None) -> None:
        """A runner's view, a pool or namespace ``namespace``'s labels changed (call after Kopf's index took it in).

        Drops the cached views and re-decides the jobs waiting for a runner: the change may make one
        eligible for them. A namespace's labels only change what its own jobs see (which pools serve
        it), so only those are re-decided.
        """
        self.changed_topology()
        self.wake_runner_waits(namespace)

    def runner_view_changed(self, body: Mapping[str, Any], *, deleted: bool) -> bool:
        """Whether a Runner event changes what routing sees of that runner (call after Kopf's index took it in).

        Compares the runner's view (:func:`~helmhive.policy.routing.fleet.build_runner_view`, all a
        decision reads of it) with its view when the cached views last took it in. The job's
        namespace enters a view only through its pool (whose own events change the topology), so one
        view per runner, built as if its pool served the job, tells. True when unsure: a runner seen
        for the first time, gone, or unreadable.
        """
        meta = body.get("metadata") or {}
        key: RunnerKey = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if deleted:
            self.forget_runner(key)
        facts = None if deleted else self.runner_facts(body)
        if facts is None:
            self._runner_seen.pop(key, None)
            return True
        pool = next((p for store in self.pools.values() for p in store if p.key == facts.pool_key), None)
        view = build_runner_view(runner=facts, pool=pool, serves_namespace=True)
        if self._runner_seen.get(key) == view:
            return False
        self._runner_seen[key] = view
        return True

    def runner_views(self, namespace: str) -> RunnerSet:
        """Every runner as seen by a job in ``namespace`` (cached until runners, pools or namespaces change).

        A :class:`~helmhive.policy.routing.prepared.RunnerSet`: it also keeps each runner's static
        checks per profile requirement, so they are computed once per fleet change, not per decision.
        """
        cached = self._views.get(namespace)
        if cached is not None and cached[0] == self.topology:
            return cached[1]
        pools = {p.key: p for store in self.pools.values() for p in store}
        labels = next(iter(self.namespaces.get(namespace, ())), None)
        facts = [r for store in self.runners.values() for r in store]
        views = RunnerSet(
            build_runner_views(runners=facts, pools=pools, job_namespace=namespace, namespace_labels=labels)
        )
        self._views[namespace] = (self.topology, views)
        return views

    def _implementation_provider(self, key: tuple[str, str, int]) -> str | None:
        indexed = self.job_store.implementation_provider(key)
        # The store learns of an implementation's assignment from its watch event; this process's own
        # write is known at once, so a review queued right behind it cannot miss it.
        return indexed or self.implementations_written.get(key)

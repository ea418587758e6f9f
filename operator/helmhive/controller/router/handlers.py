"""Routing's Kopf side: the indexes it reads and thin handlers that feed the :class:`Router`.

The routing engine (work queue, reservations, waiting and backoff, audit recovery) is
:mod:`helmhive.controller.router.engine`; this module only connects it to Kopf:

- **Indexes** (Kopf fills them before any handler runs, also after a restart): runners, runner
  pools, namespaces' labels, memory records by namespace and stored session bindings. Jobs by
  the runner they hold a slot on and each change's implementation provider are in the
  operator's AgentJob store instead (:mod:`helmhive.controller.job_store_sync`: one LIST, then
  the events of the operator's own AgentJob watch), which the router waits for before its first
  decision; Kopf's indexes on AgentJobs made a restart over 10,000 jobs O(N²).
- **AgentJob events** (from the operator's own AgentJob watch, :mod:`helmhive.controller.jobs.watch`,
  through ``Runtime.job_events``; Kopf does not watch AgentJobs): the
  router queues every job that awaits a decision (profile bound, no assignment, not failed
  closed), and notices a job finishing: the job waiting longest on that runner is re-decided at
  once.
- **Runner events** re-decide waiting jobs when a runner becomes schedulable; a change of what
  routing sees of a runner, of a pool or of a namespace drops the cached runner views and
  re-decides the jobs waiting for a runner (none could serve them yet: GitOps order, a runner
  registering or coming back). Events only: no waiting job is polled.

``Router``, ``RouterSettings``, ``RouterStats`` and ``RateLimiter`` are re-exported from here
for the callers that name them by this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from helmhive.api.kinds import GROUP, VERSION
from helmhive.controller.router.engine import AGENT_JOB, RateLimiter, Router, RouterSettings, RouterStats
from helmhive.controller.runtime import Runtime
from helmhive.policy.memory.selection import NamedMemoryRecord
from helmhive.policy.routing.inputs import (
    PoolServing,
    RunnerFacts,
    parse_memory_record,
    parse_pool,
    parse_session_binding,
)
from helmhive.policy.routing.route import SessionBindingView

__all__ = ["AGENT_JOB", "RateLimiter", "Router", "RouterSettings", "RouterStats", "register"]


def register(runtime: Runtime, router: Router | None = None) -> Router:
    """Register the routing indexes and handlers; return the router (tests and probes read its stats)."""
    router = router or Router(runtime)
    # Qualification probes never take a slot a job waits for, nor one this process just assigned.
    runtime.slot_waited_for, runtime.slots_held = router.waited_for, router.held_slots

    @kopf.on.startup()
    async def start_router(**kwargs: Any) -> None:
        router.bind(kwargs)
        router.start()

    @kopf.on.cleanup()
    async def stop_router(**_: Any) -> None:
        await router.stop()

    @kopf.on.probe(id="routing")
    async def routing_probe(**_: Any) -> dict[str, int]:
        stats = router.stats
        return {
            "synced": int(runtime.job_store.synced.is_set()),  # 0: not routing yet (the job store is listing)
            "storedJobs": len(runtime.job_store.store),
            "assigned": stats.assigned,
            "waiting": len(router.waiting),
            "failed": stats.failed,
            "conflicts": stats.conflicts,
            "queued": len(router.queued),
        }

    # Index functions are async so Kopf runs them in the event loop, not in a thread. They return {}
    # rather than None when an object no longer belongs in the index: Kopf keeps an object's previous
    # values when its index function returns None (a finished job would hold its slot forever).
    @kopf.index(GROUP, VERSION, "runners", id="routing_runners")
    async def routing_runners(body: kopf.Body, **_: Any) -> dict[str, RunnerFacts]:
        facts = router.runner_facts(body)  # parsed once: the event handler below reads the same facts
        return {facts.namespace: facts} if facts is not None else {}

    @kopf.index(GROUP, VERSION, "runnerpools", id="routing_pools")
    async def routing_pools(body: kopf.Body, **_: Any) -> dict[str, PoolServing]:
        pool = parse_pool(body)
        return {pool.namespace: pool} if pool is not None else {}

    @kopf.index("", "v1", "namespaces", id="routing_namespaces")
    async def routing_namespaces(name: str, labels: kopf.Labels, **_: Any) -> dict[str, dict[str, str]]:
        return {name: dict(labels)}

    @kopf.index(GROUP, VERSION, "memoryrecords", id="routing_memory")
    async def routing_memory(namespace: str | None, body: kopf.Body, **_: Any) -> dict[str, NamedMemoryRecord]:
        record = parse_memory_record(body)
        return {namespace or "": record} if record is not None else {}

    @kopf.index(GROUP, VERSION, "sessionbindings", id="routing_sessions")
    async def routing_sessions(body: kopf.Body, **_: Any) -> dict[str, SessionBindingView]:
        view = parse_session_binding(body)
        return {view.runner_namespace: view} if view is not None else {}

    async def route_jobs(event_type: str | None, body: Mapping[str, Any]) -> None:
        router.observe_job(event_type, body)

    runtime.job_events.subscribe("routing", route_jobs)

    # Event handlers run after the indexes took the same event in, so cached views are dropped in time.
    @kopf.on.event(GROUP, VERSION, "runners")
    async def wake_on_runners(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        deleted = event.get("type") == "DELETED"
        if router.runner_view_changed(body, deleted=deleted):
            router.fleet_changed()
        if not deleted:
            router.observe_runner(body)

    @kopf.on.event(GROUP, VERSION, "runnerpools")
    async def pools_changed(**_: Any) -> None:
        router.fleet_changed()

    @kopf.on.event("", "v1", "namespaces")
    async def namespaces_changed(name: str, **_: Any) -> None:
        router.fleet_changed(namespace=name)

    return router

"""The routing engine: decide with the pure core, write the assignment once, audit it.

One :class:`Router` per operator process, fed by the thin Kopf handlers and indexes of
:mod:`helmhive.controller.routing` (which hands it the indexes and the watch events). It owns:

- **the work queue**: each job is handled by one worker at a time (a queue with a processing
  set, like client-go's; :class:`~helmhive.controller.router_queue.WorkQueue`);
- **reservations**: slots this process assigned that the jobs index does not show yet;
- **waiting and backoff**: a job that waits for capacity is re-decided on a backoff timer (and
  early when capacity frees); its status is written when it starts waiting and at each backoff
  attempt, never silently;
- **audit recovery**: the audit records of every decision it writes, and after a restart those
  of recent decisions found in status (:class:`~helmhive.controller.router_audits.RouterAudits`).

Its settings, token bucket and counters are in :mod:`helmhive.controller.router_settings`.

A worker:

1. under one global asyncio lock (a pool may serve several namespaces, so runners are shared),
   builds the runner views, counts active jobs per runner from the jobs index *plus* the
   assignments this process wrote that the index has not shown yet, calls
   :func:`~helmhive.policy.routing.decide_route`, and reserves the slot in memory;
2. outside the lock, within a bound on concurrent writes and a token bucket, merge-patches the
   job's status (:func:`helmhive.policy.agentjob.route`) with ``metadata.resourceVersion`` as a
   precondition. A 409 means the job changed since it was read: the reservation is released,
   the job re-read and re-decided. So a decision made on a stale copy is never written, and a
   retry after a crash never assigns twice;
3. hands the audit of the decision (``JobRouted`` or ``JobRoutingFailed``, and
   ``MemoryInjected``) to a bounded background task and takes the next job. Records have
   deterministic names (:mod:`helmhive.policy.routing_audit`). After a restart, every decision
   younger than ``audit_recovery_seconds`` seen in a job's status is checked for its records and
   any missing one is written, so a crash between the status write and the audit loses nothing.

Durations (the token bucket, how long a job has waited, when a decision was audited) are read
from an injected monotonic clock (``monotonic``, :func:`time.monotonic` by default), so tests
drive them without sleeping; wall-clock times in status come from the runtime's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.job import ChangeStage
from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller import metrics
from helmhive.controller.kube import Conflict, KubeError, NotFound
from helmhive.controller.router_audits import RouterAudits, plain_job
from helmhive.controller.router_queue import WorkQueue
from helmhive.controller.router_settings import RouterSettings, RouterStats, TokenBucket
from helmhive.controller.runtime import Runtime
from helmhive.policy import agentjob
from helmhive.policy.agentjob import decide_held_runner, decide_needs_binding, decide_needs_routing
from helmhive.policy.conditions import find_condition
from helmhive.policy.memory import NamedMemoryRecord, select_memory
from helmhive.policy.routing import (
    RouteOutcome,
    RoutingDecision,
    RunnerKey,
    RunnerView,
    SessionBindingView,
)
from helmhive.policy.routing_inputs import (
    PoolServing,
    QueuedJob,
    RunnerFacts,
    build_route_inputs,
    build_runner_views,
    decide_implementation_provider,
    decide_job_route,
    parse_queued_job,
    parse_runner,
)

__all__ = ["AGENT_JOB", "JobKey", "Router", "RouterSettings", "RouterStats", "TokenBucket"]

AGENT_JOB = kind_by_name("AgentJob")
JobKey = tuple[str, str]
log = logging.getLogger("helmhive.routing")


@dataclass
class _Waiting:
    blocked: frozenset[RunnerKey]
    since: float
    timer: asyncio.TimerHandle | None = None
    woken_by: RunnerKey | None = None
    """The runner whose freed slot this job was queued to take (one job per freed slot)."""


class Router(WorkQueue):
    """The work queue, reservations and waiting jobs of one operator process (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        settings: RouterSettings | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.runtime = runtime
        self.settings = settings or RouterSettings.from_env()
        self.monotonic = monotonic
        self.lock = asyncio.Lock()
        self.bucket = TokenBucket(rate=self.settings.qps, burst=self.settings.burst, clock=monotonic)
        self.stats = RouterStats()
        # Indexes, bound once Kopf hands them over.
        self.runners: Mapping[Any, Iterable[RunnerFacts]] = {}
        self.pools: Mapping[Any, Iterable[PoolServing]] = {}
        self.namespaces: Mapping[Any, Iterable[dict[str, str]]] = {}
        self.jobs_by_runner: Mapping[Any, Collection[JobKey]] = {}
        self.memory: Mapping[Any, Iterable[NamedMemoryRecord]] = {}
        self.implementations: Mapping[Any, Iterable[str]] = {}
        self.sessions: Mapping[Any, Iterable[SessionBindingView]] = {}
        self.implementations_written: dict[tuple[str, str, int], str] = {}  # (namespace, change, iteration) -> provider
        self.bodies: dict[JobKey, dict[str, Any]] = {}
        # Bindings made by the queue step that this process writes together with the decision.
        self.unwritten: dict[JobKey, dict[str, Any]] = {}
        self.rebind: Callable[[JobKey], Coroutine[Any, Any, None]] | None = None
        # Slots this process assigned that the jobs index may not show yet.
        self.pending: dict[JobKey, RunnerKey] = {}
        self.pending_by_runner: dict[RunnerKey, set[JobKey]] = {}
        self.waiting: dict[JobKey, _Waiting] = {}
        self.holding: dict[JobKey, RunnerKey] = {}
        self.schedulable: dict[RunnerKey, bool] = {}
        self.audits = RouterAudits(
            runtime,
            bucket=self.bucket,
            workers=self.settings.workers,
            recovery_seconds=self.settings.audit_recovery_seconds,
            monotonic=monotonic,
        )
        self.topology = 0  # bumped when runners, pools or namespaces change
        self._views: dict[str, tuple[int, list[RunnerView]]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    # Kopf-facing -----------------------------------------------------------------------
    def bind(self, indexes: Mapping[str, Any]) -> None:
        """Take the Kopf indexes (the same objects for the operator's lifetime)."""
        self.runners = indexes["routing_runners"]
        self.pools = indexes["routing_pools"]
        self.namespaces = indexes["routing_namespaces"]
        self.jobs_by_runner = indexes["routing_jobs"]
        self.memory = indexes["routing_memory"]
        self.implementations = indexes["routing_implementations"]
        self.sessions = indexes["routing_sessions"]

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._worker(i)) for i in range(self.settings.workers)]

    async def stop(self) -> None:
        self.audits.cancel()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for waiting in self.waiting.values():
            if waiting.timer is not None:
                waiting.timer.cancel()

    def changed_topology(self) -> None:
        self.topology += 1

    def submit_bound(
        self, body: Mapping[str, Any], binding: dict[str, Any], conditions: list[dict[str, Any]] | None
    ) -> None:
        """The queue step bound ``body``: route it, writing the binding with the decision in one write.

        The decision is made on the job as read plus its binding, and written conditional on the
        job's ``resourceVersion`` as read, so the binding is still the exact revision and
        snapshot chosen at queue time, and a job that changed meanwhile is bound again.
        """
        bound = plain_job(body)
        bound["status"]["profile"] = binding
        if conditions is not None:
            bound["status"]["conditions"] = conditions
        key: JobKey = (str(bound["metadata"].get("namespace", "")), str(bound["metadata"].get("name", "")))
        if not decide_needs_routing(bound):
            return
        self.bodies[key] = bound
        self.unwritten[key] = binding
        self.enqueue(key, "bound")

    def _bound_in_memory(self, key: JobKey, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """True when ``body`` is the very copy whose binding waits in memory to be written (nothing to do)."""
        if key not in self.unwritten:
            return False
        stored = self.bodies.get(key)
        same = stored is not None and stored["metadata"].get("resourceVersion") == (body.get("metadata") or {}).get(
            "resourceVersion"
        )
        if same and event_type != "DELETED":
            return True
        # The job changed (or was written by someone else): the queue step decides it again.
        self.unwritten.pop(key, None)
        return False

    def observe_job(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """React to one AgentJob watch event: queue it, release a reservation, or free capacity."""
        meta = body.get("metadata") or {}
        key: JobKey = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if self._bound_in_memory(key, event_type, body):
            return
        status = body.get("status") or {}
        deleted = event_type == "DELETED"
        if deleted or status.get("assignment"):
            self._release(key)  # the index now shows it (or it is gone)
            implementation = decide_implementation_provider(body)
            if implementation is not None:
                self.implementations_written.pop(implementation[0], None)
        holder = None if deleted else decide_held_runner(body)
        previous = self.holding.pop(key, None)
        if holder is not None:
            self.holding[key] = holder
        elif previous is not None:
            metrics.record_job_finished(body)
            self._capacity_freed(previous)
        if deleted:
            self.audits.forget(key)
        elif status.get("routing"):
            self.audits.recover(key, body)
        if deleted or not decide_needs_routing(body):
            self._forget_body(key)
            self._stop_waiting(key)
            return
        self.bodies[key] = plain_job(body)
        if key not in self.waiting or self.waiting[key].timer is None:
            self.enqueue(key, "event")

    def observe_runner(self, body: Mapping[str, Any]) -> None:
        """A runner that becomes schedulable may take waiting jobs: re-decide them now."""
        facts = parse_runner(body)
        if facts is None:
            return
        now_schedulable = facts.schedulable is True
        before = self.schedulable.get(facts.key)
        self.schedulable[facts.key] = now_schedulable
        if now_schedulable and before is not True:
            for key in list(self.waiting):
                self.enqueue(key, "wake")

    # Work queue --------------------------------------------------------------------------
    async def _worker(self, number: int) -> None:
        while True:
            key, trigger = await self._next()
            try:
                await self.route(key, trigger)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("routing job %s/%s failed; retrying", *key)
                self._later(key, self.settings.retry_seconds, "retry")
            finally:
                self._done(key)

    # Reservations and waiting -------------------------------------------------------------
    def _reserve(self, key: JobKey, runner: RunnerKey) -> None:
        self._release(key)
        self.pending[key] = runner
        self.pending_by_runner.setdefault(runner, set()).add(key)

    def _release(self, key: JobKey) -> None:
        runner = self.pending.pop(key, None)
        if runner is not None:
            jobs = self.pending_by_runner.get(runner)
            if jobs is not None:
                jobs.discard(key)
                if not jobs:
                    del self.pending_by_runner[runner]

    def _forget_body(self, key: JobKey) -> None:
        self.bodies.pop(key, None)
        self.unwritten.pop(key, None)

    def _stop_waiting(self, key: JobKey) -> None:
        waiting = self.waiting.pop(key, None)
        if waiting is not None:
            if waiting.timer is not None:
                waiting.timer.cancel()
            if waiting.woken_by is not None:
                self._capacity_freed(waiting.woken_by)  # it went before taking the slot: pass it on

    def _capacity_freed(self, runner: RunnerKey) -> None:
        """A slot on ``runner`` freed: re-decide the job that has waited longest for it.

        Each freed slot wakes a different job: a job already woken (and not yet re-decided) is
        skipped, so two slots freed in a row are not both spent on one job.
        """
        blocked = [(w.since, k) for k, w in self.waiting.items() if runner in w.blocked and w.woken_by is None]
        if blocked:
            key = min(blocked)[1]
            self.waiting[key].woken_by = runner
            self.enqueue(key, "wake")

    def _take_wake(self, key: JobKey) -> RunnerKey | None:
        """The runner whose freed slot ``key`` was woken for (cleared: this pass uses it or passes it on)."""
        waiting = self.waiting.get(key)
        if waiting is None or waiting.woken_by is None:
            return None
        runner, waiting.woken_by = waiting.woken_by, None
        return runner

    def _pass_wake(self, runner: RunnerKey | None, decision: RoutingDecision | None, written: bool) -> None:
        """Hand a freed slot on unless this pass took it (assigned there) or found it taken (blocked there)."""
        if runner is None:
            return
        if decision is None:
            self._capacity_freed(runner)
            return
        took = written and decision.choice is not None and decision.choice.runner_key == runner
        taken = decision.outcome is RouteOutcome.WAITING and runner in decision.capacity_blocked
        if not (took or taken):
            self._capacity_freed(runner)

    def active_jobs(self, runners: Iterable[RunnerKey]) -> dict[RunnerKey, int]:
        """Active jobs per runner: the jobs index (assigned, unfinished) plus this process's in-flight writes."""
        counts: dict[RunnerKey, int] = {}
        for runner in runners:
            indexed = self.jobs_by_runner.get(runner, ())
            pending = self.pending_by_runner.get(runner)
            # A Kopf index store holds one value per job object, so its length is the count.
            total = len(set(indexed) | pending) if pending else len(indexed)
            if total:
                counts[runner] = total
        return counts

    def runner_views(self, namespace: str) -> list[RunnerView]:
        """Every runner as seen by a job in ``namespace`` (cached until runners, pools or namespaces change)."""
        cached = self._views.get(namespace)
        if cached is not None and cached[0] == self.topology:
            return cached[1]
        pools = {p.key: p for store in self.pools.values() for p in store}
        labels = next(iter(self.namespaces.get(namespace, ())), None)
        facts = [r for store in self.runners.values() for r in store]
        views = build_runner_views(runners=facts, pools=pools, job_namespace=namespace, namespace_labels=labels)
        self._views[namespace] = (self.topology, views)
        return views

    def _implementation_provider(self, key: tuple[str, str, int]) -> str | None:
        indexed = next(iter(self.implementations.get(key, ())), None)
        # The index learns of an implementation's assignment from its watch event; this process's own
        # write is known at once, so a review queued right behind it cannot miss it.
        return indexed or self.implementations_written.get(key)

    @metrics.ROUTING_DECISION.time()
    def decide(self, job: QueuedJob, *, attempts: int) -> RoutingDecision:
        """The pure decision for ``job`` from the indexes and reservations (call under ``self.lock``)."""
        views = self.runner_views(job.namespace)
        inputs = build_route_inputs(
            job=dataclasses.replace(job, attempts=attempts) if attempts != job.attempts else job,
            runners=views,
            active_jobs=self.active_jobs(v.key for v in views),
            sessions=(view for store in self.sessions.values() for view in store),
            implementation_provider=self._implementation_provider,
        )
        return decide_job_route(inputs, now=self.runtime.clock(), policy=self.settings.policy)

    def memory_ids(self, job: QueuedJob) -> list[str]:
        records = list(self.memory.get(job.namespace, ()))
        selection = select_memory(
            records=sorted(records, key=lambda r: r.name),
            workspace=job.spec.workspace,
            service=job.spec.service,
            policy=job.binding.snapshot.memory,
            job_kind=job.spec.job_kind,
            now=self.runtime.clock(),
        )
        return selection.ids

    # One job --------------------------------------------------------------------------------
    async def route(self, key: JobKey, trigger: str) -> None:
        """Decide and write one job (see the module docstring)."""
        woke = self._take_wake(key)
        body = self.bodies.get(key)
        job = parse_queued_job(body) if body is not None and decide_needs_routing(body) else None
        if job is None:
            if body is not None and decide_needs_routing(body):
                log.warning("job %s/%s has an unusable spec or profile binding; not routed", *key, extra=_ref(key))
            self._forget_body(key)
            self._stop_waiting(key)  # nothing to route: it must not keep taking wake-ups
            self._pass_wake(woke, None, written=False)
            return
        binding = self.unwritten.get(key)
        waiting_already = binding is None and _waiting_reason(job)
        backoff = trigger == "backoff"
        async with self.lock:
            decision = self.decide(job, attempts=job.attempts)
            self.stats.decisions += 1
            if decision.choice is not None:
                self._reserve(key, decision.choice.runner_key)
        if decision.outcome is RouteOutcome.WAITING:
            self._wait(key, decision)
            if waiting_already and not backoff:
                self._pass_wake(woke, decision, written=False)
                return  # already visibly waiting; only backoff attempts are written
        else:
            self._stop_waiting(key)
        memory_ids = self.memory_ids(job) if decision.choice is not None else []
        now = self.runtime.clock()
        status = agentjob.route(
            job.state,
            decision=decision,
            memory_ids=memory_ids,
            binding=binding,  # bind and route in one write
            now=now,
        ).status
        if decision.outcome is not RouteOutcome.WAITING:
            self.audits.mark(key)  # this process audits it; its own watch event needs no recovery check
        updated = await self._write(job, status)
        self._pass_wake(woke, decision, written=updated is not None)
        if updated is None:
            self.audits.forget(key)
            return
        self.unwritten.pop(key, None)
        if decision.choice is not None:
            self.holding[key] = decision.choice.runner_key
            metrics.observe_assigned(updated, job_kind=job.spec.job_kind, provider=decision.choice.provider, now=now)
            change = job.spec.change
            if change is not None and change.stage is ChangeStage.IMPLEMENTATION:
                self.implementations_written[(job.namespace, change.name, change.iteration)] = decision.choice.provider
        stored = self.bodies.get(key)
        if stored is not None and stored["metadata"].get("resourceVersion") == job.resource_version:
            # No newer event arrived while writing: our response is the latest copy.
            if decide_needs_routing(updated):
                self.bodies[key] = plain_job(updated)
            else:
                self._forget_body(key)
        self._count(decision)
        self.audits.spawn(self.audits.write(plain_job(updated), check_first=False))

    async def _write(self, job: QueuedJob, status: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the job's status, conditional on the resourceVersion the decision was made from.

        Returns the updated job, or None when nothing was written (the reservation is released,
        and the job re-read and re-queued, or retried later, or forgotten if it is gone).
        """
        key = job.key
        patch = {"metadata": {"resourceVersion": job.resource_version}, "status": status}
        try:
            await self.bucket.take()
            self.stats.writes += 1
            return await self.runtime.kube.patch_status(AGENT_JOB, job.name, patch, namespace=job.namespace)
        except Conflict:
            self.stats.conflicts += 1
            self._release(key)
            await self._reread(key)
        except NotFound:
            self._release(key)
            self._forget_body(key)
            self._stop_waiting(key)
        except KubeError as err:
            self._release(key)
            log.warning("job %s/%s: routing status not written (%s); retrying", *key, err, extra=_ref(key))
            self._later(key, self.settings.retry_seconds, "retry")
        return None

    async def _reread(self, key: JobKey) -> None:
        """After a 409: route the job as it is now, or have the queue step bind it if it still needs that.

        A binding held in memory may lose to a binding already written (the queue step bound the
        job twice before the first write landed, or another process bound it): then the job is
        bound and routed from the fresh copy, never dropped.
        """
        self.unwritten.pop(key, None)
        try:
            fresh = await self.runtime.kube.get(AGENT_JOB, key[1], namespace=key[0])
        except NotFound:
            self._forget_body(key)
            self._stop_waiting(key)
            return
        if decide_needs_binding(fresh) and self.rebind is not None:
            self._forget_body(key)
            self.audits.spawn(self.rebind(key))  # off the worker's path, bounded like the audits
        elif decide_needs_routing(fresh):
            self.bodies[key] = plain_job(fresh)
            self.enqueue(key, "conflict")
        else:
            self._forget_body(key)
            self._stop_waiting(key)

    def _wait(self, key: JobKey, decision: RoutingDecision) -> None:
        waiting = self.waiting.get(key)
        if waiting is None:
            waiting = self.waiting[key] = _Waiting(blocked=decision.capacity_blocked, since=self.monotonic())
        waiting.blocked = decision.capacity_blocked
        if waiting.timer is not None:
            waiting.timer.cancel()
        waiting.timer = self._later(key, decision.retry_after or 0.0, "backoff")

    def _count(self, decision: RoutingDecision) -> None:
        metrics.JOBS_ROUTED.labels(decision.outcome.value, decision.reason.value).inc()
        match decision.outcome:
            case RouteOutcome.ASSIGNED:
                self.stats.assigned += 1
            case RouteOutcome.WAITING:
                self.stats.waiting += 1
            case RouteOutcome.FAILED:
                self.stats.failed += 1


def _waiting_reason(job: QueuedJob) -> bool:
    routed = find_condition(job.conditions, ConditionType.ROUTED)
    return routed is not None and routed.get("reason") == Reason.WAITING_FOR_CAPACITY.value


def _ref(key: JobKey) -> dict[str, Any]:
    return {"k8s_ref": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "namespace": key[0], "name": key[1]}}

"""The routing engine: decide with the pure core, write the assignment once, audit it.

One :class:`Router` per operator process, fed by the thin Kopf handlers and indexes of
:mod:`helmhive.controller.router.handlers` (which hands it the indexes and the watch events). The
engine is five modules, each owning one part:

- this one: the workers, the decision (inputs built by :mod:`helmhive.policy.routing.inputs`, as
  ``explain-routing`` builds them), the conditional status write and what a 409 does;
- :mod:`~helmhive.controller.router.indexes`: the indexes Kopf fills and the runner views cached
  from them;
- :mod:`~helmhive.controller.router.capacity`: reservations, held slots, waiting jobs, backoff
  timers and which job a freed slot wakes;
- :mod:`~helmhive.controller.router.queue`: the work queue (one worker per job at a time);
- :mod:`~helmhive.controller.router.audits`: the audit records, and their recovery after a restart;

with its settings, token bucket and counters in :mod:`~helmhive.controller.router.settings`.

A worker:

1. under one global asyncio lock (a pool may serve several namespaces, so runners are shared),
   builds the runner views, counts active jobs per runner from the jobs index *plus* this
   process's reservations, calls :func:`~helmhive.policy.routing.route.decide_route`, and reserves
   the slot in memory;
2. outside the lock, paced by a token bucket, writes the job's status
   (:func:`helmhive.policy.agentjob.life.route`, which also writes a binding made by the queue step)
   with ``metadata.resourceVersion`` as a precondition: a PUT of the status as read with the
   step's patch merged (:meth:`~helmhive.policy.agentjob.life.StatusPatch.replacement`), which costs
   the API server less than the same merge patch. A 409 means the job changed since it was
   read: the reservation is released, the job re-read and re-decided. So a decision made on a
   stale copy is never written, and a retry after a crash never assigns twice;
3. queues the audit of the decision (written in batches by a background task, see
   :mod:`~helmhive.controller.router.audits`) and takes the next job.

A job that waits for a free slot is re-decided on its backoff timer and when a slot frees; a job
that waits for a runner that can serve it at all (none is registered or schedulable yet: a
RunnerPool applied with the job, a runner registering or coming back) has no timer: the fleet's
events re-decide it (:meth:`~helmhive.controller.router.capacity.Capacity.wake_runner_waits`), and
its deadline is an entry of the operator's one
:class:`~helmhive.controller.deadlines.DeadlineScheduler`, where it fails closed.

Durations (the token bucket, how long a job has waited, when a decision was audited) are read
from an injected monotonic clock (``monotonic``, :func:`time.monotonic` by default), so tests
drive them without sleeping; wall-clock times in status come from the runtime's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from helmhive.api.job import ChangeStage
from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller import metrics
from helmhive.controller.kube.door import Conflict, KubeError, NotFound
from helmhive.controller.router.audits import RouterAudits, plain_job
from helmhive.controller.router.capacity import JobKey, _Waiting
from helmhive.controller.router.indexes import RouterIndexes
from helmhive.controller.router.settings import RateLimiter, RouterSettings, RouterStats
from helmhive.controller.runtime import Runtime
from helmhive.policy.agentjob.life import (
    StatusPatch,
    decide_needs_binding,
    decide_needs_routing,
    parse_agent_job,
)
from helmhive.policy.conditions import find_condition
from helmhive.policy.memory.selection import select_memory
from helmhive.policy.routing.inputs import (
    QueuedJob,
    build_route_inputs,
    decide_implementation_provider,
    decide_job_route,
    parse_queued_job,
)
from helmhive.policy.routing.route import RouteOutcome, RoutingDecision
from helmhive.policy.routing.step import route as route_step

__all__ = ["AGENT_JOB", "JobKey", "RateLimiter", "Router", "RouterSettings", "RouterStats", "_Waiting"]

AGENT_JOB = kind_by_name("AgentJob")
log = logging.getLogger("helmhive.routing")


class Router(RouterIndexes):
    """The routing engine of one operator process (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        settings: RouterSettings | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(monotonic=monotonic, job_store=runtime.job_store.store)
        self.runtime = runtime
        self.settings = settings or RouterSettings.from_env()
        self.lock = asyncio.Lock()
        self.bucket = RateLimiter(rate=self.settings.qps, burst=self.settings.burst, clock=monotonic)
        self.stats = RouterStats()
        self.bodies: dict[JobKey, dict[str, Any]] = {}
        # Bindings made by the queue step that this process writes together with the decision.
        self.unwritten: dict[JobKey, dict[str, Any]] = {}
        self.rebind: Callable[[JobKey], Coroutine[Any, Any, None]] | None = None
        self.audits = RouterAudits(
            runtime,
            bucket=self.bucket,
            workers=self.settings.workers,
            recovery_seconds=self.settings.audit_recovery_seconds,
            monotonic=monotonic,
            linger_seconds=self.settings.audit_linger_seconds,
            retry_seconds=self.settings.retry_seconds,
            event_interval_seconds=self.settings.event_interval_seconds,
        )
        self.tasks: list[asyncio.Task[None]] = []

    # Kopf-facing -----------------------------------------------------------------------
    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._worker(i)) for i in range(self.settings.workers)]
        self.audits.start()

    async def stop(self) -> None:
        await self.audits.close()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._cancel_timers()

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
        job = parse_agent_job(body)  # once: every question below is a property of it
        deleted = event_type == "DELETED"
        if deleted or job.raw_status.get("assignment"):
            self._release(key)  # the index now shows it (or it is gone)
            implementation = decide_implementation_provider(body)
            if implementation is not None:
                self.implementations_written.pop(implementation[0], None)
        holder = None if deleted else job.held_runner
        previous = self.holding.pop(key, None)
        if holder is not None:
            self.holding[key] = holder
        elif previous is not None:
            metrics.record_job_finished(job)
            self._capacity_freed(previous)
        if deleted:
            self.audits.forget(key)
        elif job.raw_status.get("routing"):
            self.audits.recover(key, body)
        if deleted or not job.needs_routing:
            self._forget_body(key)
            self._stop_waiting(key)
            return
        self.bodies[key] = plain_job(body)
        if key not in self.waiting or self.waiting[key].timer is None:
            self.enqueue(key, "event")

    # Work queue --------------------------------------------------------------------------
    async def _worker(self, number: int) -> None:
        # No decision before the AgentJob store holds every job: it would undercount busy runners.
        await self.runtime.job_store.synced.wait()
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

    # Decisions ------------------------------------------------------------------------------
    # Waiting for a runner ---------------------------------------------------------------------
    def _wait(self, key: JobKey, decision: RoutingDecision, *, probe: bool = False) -> None:
        """Record the wait; a wait for a runner gets its deadline in the operator's one scheduler (no timer)."""
        before = self.waiting.get(key)
        was_for_runner = before is not None and before.for_runner
        super()._wait(key, decision, probe=probe)
        deadline = decision.capacity_deadline
        if decision.waits_for_runner and deadline is not None:
            self.runtime.deadlines.at(_deadline_entry(key), deadline, functools.partial(self._deadline_came, key))
        elif was_for_runner:
            self.runtime.deadlines.cancel(_deadline_entry(key))

    def _stop_waiting(self, key: JobKey) -> None:
        waiting = self.waiting.get(key)
        if waiting is not None and waiting.for_runner:
            self.runtime.deadlines.cancel(_deadline_entry(key))
        super()._stop_waiting(key)

    async def _deadline_came(self, key: JobKey) -> None:
        self.enqueue(key, "deadline")  # the decision now fails it closed (or finds a runner after all)

    def _forget_body(self, key: JobKey) -> None:
        self.bodies.pop(key, None)
        self.unwritten.pop(key, None)

    @metrics.ROUTING_DECISION.time()
    def decide(self, job: QueuedJob, *, attempts: int) -> RoutingDecision:
        """The pure decision for ``job`` from the indexes and reservations (call under ``self.lock``)."""
        views = self.runner_views(job.namespace)
        inputs = build_route_inputs(
            job=dataclasses.replace(job, attempts=attempts) if attempts != job.attempts else job,
            runners=views,
            active_jobs=self.active_counts(),
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
        state = parse_agent_job(body) if body is not None else None
        needs_routing = state is not None and state.needs_routing
        job = parse_queued_job(state) if state is not None and needs_routing else None
        if job is None:
            if needs_routing:
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
            self._wait(key, decision, probe=job.state.qualifies is not None)
            if waiting_already and not backoff and _waits_as_written(job, decision):
                self._pass_wake(woke, decision, written=False)
                return  # already visibly waiting so; only backoff attempts are written
        else:
            self._stop_waiting(key)
        memory_ids = self.memory_ids(job) if decision.choice is not None else []
        now = self.runtime.clock()
        patch = route_step(
            job.state,
            decision=decision,
            memory_ids=memory_ids,
            binding=binding,  # bind and route in one write
            now=now,
        )
        if decision.outcome is not RouteOutcome.WAITING:
            self.audits.mark(key)  # this process audits it; its own watch event needs no recovery check
        updated = await self._write(job, patch)
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
        self.audits.record(updated, runner=decision.choice.runner_key if decision.choice is not None else None)

    async def _write(self, job: QueuedJob, patch: StatusPatch) -> dict[str, Any] | None:
        """Write the job's status, conditional on the resourceVersion the decision was made from.

        Returns the updated job, or None when nothing was written (the reservation is released,
        and the job re-read and re-queued, or retried later, or forgotten if it is gone).
        """
        key = job.key
        body = patch.replacement(job.state)
        try:
            await self.bucket.take()
            self.stats.writes += 1
            return await self.runtime.kube.replace_status(AGENT_JOB, job.name, body, namespace=job.namespace)
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


def _waits_as_written(job: QueuedJob, decision: RoutingDecision) -> bool:
    """The job's status already shows this wait, so a re-decision that still waits writes nothing.

    A wait for a slot is written when it starts and at each backoff attempt, not at each early
    re-decision (a busy fleet frees slots all the time). A job that waited for a slot and now waits
    for a runner (its runner went away), or the other way round, is written again: its message and
    ``nextAttemptAt`` would tell the wrong story. A wait for a runner is written whenever what it
    waits for changed (its message: no runner registered, one registering, one disabled...); it is
    re-decided only when the fleet changes, which is seldom.
    """
    routing = job.state.raw_status.get("routing")
    backoff = isinstance(routing, Mapping) and bool(routing.get("nextAttemptAt"))
    if backoff == decision.waits_for_runner:
        return False
    if not decision.waits_for_runner:
        return True
    routed = find_condition(job.conditions, ConditionType.ROUTED)
    return routed is not None and routed.get("message") == decision.message[:1024]


def _deadline_entry(key: JobKey) -> tuple[str, str, str]:
    """The job's entry in the operator's deadline scheduler (the queue step's entries are ``("AgentJob", …)``)."""
    return ("AgentJobRouting", *key)


def _ref(key: JobKey) -> dict[str, Any]:
    return {"k8s_ref": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "namespace": key[0], "name": key[1]}}

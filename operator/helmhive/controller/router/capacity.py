"""The router's view of capacity: reservations, held slots, waiting jobs and who a freed slot wakes.

Owns, for one operator process (:class:`Capacity`, the base of
:class:`~helmhive.controller.router.engine.Router`, on top of its
:class:`~helmhive.controller.router.queue.WorkQueue`):

- **reservations** (``pending``): slots this process assigned that the AgentJob store
  (:class:`~helmhive.policy.routing.job_store.JobStore`) does not show yet; :meth:`Capacity.active_jobs`
  counts the store plus these, so no runner is over-committed
  between a write and its watch event;
- **held slots** (``holding``): which runner each assigned, unfinished job holds, so a job that
  finishes or is deleted frees exactly that runner's slot;
- **waiting jobs** (``waiting``): the runners each job is blocked by, since when (on the injected
  monotonic clock) and its backoff timer; a job that waits for a runner that can serve it at all
  (:attr:`~helmhive.policy.routing.route.RoutingDecision.waits_for_runner`) has no timer;
- **wake-ups**: each freed slot re-decides the job that has waited longest for that runner, a
  different job per slot; a woken job that does not take the slot hands it on. A runner that
  becomes schedulable re-decides every waiting job; a change of the fleet (a runner's view, a
  pool, a namespace) re-decides the jobs waiting for a runner (:meth:`Capacity.wake_runner_waits`);
- **each runner's parsed facts** (:meth:`Capacity.runner_facts`), kept for its resourceVersion, so
  a Runner event is parsed once for the index, the views and the wake-ups.

Nothing here talks to the API server or decides a route; the router does both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.controller.router.queue import WorkQueue
from helmhive.policy.routing.fleet import RunnerFacts, parse_runner
from helmhive.policy.routing.route import RouteOutcome, RoutingDecision, RunnerKey

__all__ = ["Capacity", "JobKey"]

JobKey = tuple[str, str]


@dataclass
class _Waiting:
    blocked: frozenset[RunnerKey]
    since: float
    timer: asyncio.TimerHandle | None = None
    woken_by: RunnerKey | None = None
    """The runner whose freed slot this job was queued to take (one job per freed slot)."""
    for_runner: bool = False
    """It waits for a runner that can serve it at all (no timer: fleet events and its deadline end it)."""
    probe: bool = False
    """A qualification probe: a freed slot goes to a waiting user job first, and it does not count as one."""


class Capacity(WorkQueue):
    """Reservations, held slots and waiting jobs of one process (see the module docstring)."""

    def __init__(self, *, monotonic: Callable[[], float]) -> None:
        super().__init__()
        self.monotonic = monotonic
        self.jobs_by_runner: Mapping[Any, Collection[JobKey]] = {}
        """Jobs by the runner they hold a slot on: the AgentJob store's view (set by the router)."""
        self.runner_counts: Mapping[RunnerKey, int] = {}
        """The length of each ``jobs_by_runner`` set, kept by the same store (set by the router)."""
        self.pending: dict[JobKey, RunnerKey] = {}
        self.pending_by_runner: dict[RunnerKey, set[JobKey]] = {}
        self.waiting: dict[JobKey, _Waiting] = {}
        self.holding: dict[JobKey, RunnerKey] = {}
        self.schedulable: dict[RunnerKey, bool] = {}
        self._facts: dict[RunnerKey, tuple[str, RunnerFacts | None]] = {}  # (resourceVersion, parsed)
        self.on_unblocked: Callable[[RunnerKey], None] | None = None
        """Called for each runner a waiting user job stops waiting for (a qualification probe may take its slot)."""

    def runner_facts(self, body: Mapping[str, Any]) -> RunnerFacts | None:
        """The Runner ``body`` parsed (:func:`~helmhive.policy.routing.fleet.parse_runner`), once per resourceVersion.

        Kopf hands the same event to the routing index and then to the event handler; both read it here.
        """
        meta = body.get("metadata") or {}
        key: RunnerKey = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        version = str(meta.get("resourceVersion") or "")
        cached = self._facts.get(key)
        if version and cached is not None and cached[0] == version:
            return cached[1]
        facts = parse_runner(body)
        if version:
            self._facts[key] = (version, facts)
        return facts

    def waited_for(self, runner: RunnerKey) -> bool:
        """Some user job waits for a free slot on ``runner`` (a qualification probe must not take it).

        A scan of the waiting jobs: the caller asks only for a runner with a probe due and a free slot.
        """
        return any(runner in waiting.blocked and not waiting.probe for waiting in self.waiting.values())

    def held_slots(self, runner: RunnerKey) -> int:
        """The slots of ``runner`` held: the job store's jobs on it plus this process's in-flight assignments."""
        return self.active_jobs((runner,)).get(runner, 0)

    def forget_runner(self, key: RunnerKey) -> None:
        """A deleted runner's parsed facts and schedulability go with it (one that comes back is new)."""
        self._facts.pop(key, None)
        self.schedulable.pop(key, None)

    def observe_runner(self, body: Mapping[str, Any]) -> None:
        """A runner that becomes schedulable may take waiting jobs: re-decide them now."""
        facts = self.runner_facts(body)
        if facts is None:
            return
        now_schedulable = facts.schedulable is True
        before = self.schedulable.get(facts.key)
        self.schedulable[facts.key] = now_schedulable
        if now_schedulable and before is not True:
            for key in list(self.waiting):
                self.enqueue(key, "wake")

    # Reservations --------------------------------------------------------------------------
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

    def active_jobs(self, runners: Iterable[RunnerKey]) -> dict[RunnerKey, int]:
        """Active jobs per runner: the job store (assigned, unfinished) plus this process's in-flight writes."""
        counts: dict[RunnerKey, int] = {}
        by_runner, pending_by_runner = self.jobs_by_runner, self.pending_by_runner
        for runner in runners:
            indexed = by_runner.get(runner, ())
            pending = pending_by_runner.get(runner)
            # The store holds each job once, so its length is the count; a reservation the store
            # already shows (its watch event came before the router saw it) counts once.
            total = len(indexed) + sum(1 for key in pending if key not in indexed) if pending else len(indexed)
            if total:
                counts[runner] = total
        return counts

    def active_counts(self) -> dict[RunnerKey, int]:
        """:meth:`active_jobs` of every runner that holds a job or a reservation, in one pass.

        For a decision, which reads only its own runners' counts (a count of a runner it does not
        see changes nothing): a copy of the store's counts, in one C call, with this process's
        reservations added, instead of a loop per runner.
        """
        counts = dict(self.runner_counts)
        by_runner = self.jobs_by_runner
        for runner, pending in self.pending_by_runner.items():
            indexed = by_runner.get(runner, ())
            extra = sum(1 for key in pending if key not in indexed)  # a reservation the store shows counts once
            if extra:
                counts[runner] = counts.get(runner, 0) + extra
        return counts

    # Waiting and wake-ups --------------------------------------------------------------------
    def _wait(self, key: JobKey, decision: RoutingDecision, *, probe: bool = False) -> None:
        waiting = self.waiting.get(key)
        if waiting is None:
            waiting = self.waiting[key] = _Waiting(blocked=decision.capacity_blocked, since=self.monotonic())
        elif not probe:
            self._unblocked(waiting.blocked - decision.capacity_blocked)
        waiting.blocked = decision.capacity_blocked
        waiting.probe = probe
        waiting.for_runner = decision.waits_for_runner
        if waiting.timer is not None:
            waiting.timer.cancel()
        # A wait for a runner has no backoff: the events that can end it wake it (wake_runner_waits).
        retry = decision.retry_after
        waiting.timer = self._later(key, retry, "backoff") if retry is not None else None

    def _unblocked(self, runners: Iterable[RunnerKey]) -> None:
        if self.on_unblocked is not None:
            for runner in runners:
                self.on_unblocked(runner)

    def _stop_waiting(self, key: JobKey) -> None:
        waiting = self.waiting.pop(key, None)
        if waiting is not None:
            if not waiting.probe:
                self._unblocked(waiting.blocked)
            if waiting.timer is not None:
                waiting.timer.cancel()
            if waiting.woken_by is not None:
                self._capacity_freed(waiting.woken_by)  # it went before taking the slot: pass it on

    def _cancel_timers(self) -> None:
        for waiting in self.waiting.values():
            if waiting.timer is not None:
                waiting.timer.cancel()

    def wake_runner_waits(self, namespace: str | None = None) -> int:
        """Re-decide the jobs waiting for a runner (in ``namespace``, or all): the fleet changed. Returns how many.

        A runner registered or changed, a pool or a namespace's labels changed: any of them may
        make a runner eligible for a job no runner could serve. Jobs waiting for a free slot are
        not woken here (freed slots and their backoff do).
        """
        woken = 0
        for key, waiting in self.waiting.items():
            if waiting.for_runner and (namespace is None or key[0] == namespace):
                self.enqueue(key, "wake")
                woken += 1
        return woken

    def _capacity_freed(self, runner: RunnerKey) -> None:
        """A slot on ``runner`` freed: re-decide the user job that has waited longest for it (a probe only after).

        Each freed slot wakes a different job: a job already woken (and not yet re-decided) is
        skipped, so two slots freed in a row are not both spent on one job.
        """
        blocked = [(w.probe, w.since, k) for k, w in self.waiting.items() if runner in w.blocked and w.woken_by is None]
        if blocked:  # a user job before a qualification probe, then the longest waiting
            key = min(blocked)[2]
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

"""The operator's own AgentJob informer: LIST, then WATCH, feeding the job store and the job steps.

Kopf does not watch AgentJobs (per object it spawned a worker, named it, built handler
arguments, and after a restart held every listed job whole in its backlogs: issue 9). Owns
:class:`JobWatch`, started by Kopf's start-up handlers of the operator that runs the handlers
(so only once leader when leader election is on) and stopped at its clean-up:

1. **LIST** (:meth:`helmhive.controller.job_store_sync.JobStoreSync.list`, paginated): every job
   goes into the store, then to the steps as a listed job (event type None), as Kopf's initial
   listing did, so a restarted operator resumes unbound, waiting, assigned and lost jobs. The
   next page is read only when the steps have taken most of this one, so at most about two
   pages of whole jobs are held at once. Once the steps have taken every listed job, the C
   heap's free pages go back to the OS (:func:`helmhive.controller.heap.trim_heap`): the listing
   allocated and freed hundreds of MiB at 10,000 jobs, which the allocator otherwise keeps. After
   the first listing only, the start-up's objects are also frozen out of the garbage
   collector's scans (:func:`helmhive.controller.heap.freeze_start_up`).
2. **WATCH** from the list's ``resourceVersion`` (``allowWatchBookmarks``, the server ends it
   after ``server_timeout_s``), through :class:`helmhive.controller.kube.watch.WatchStream`; each
   event goes into the store first, then to the steps; a stream that ends is resumed from the
   last ``resourceVersion`` seen (a bookmark's too).
3. **410 Gone** (an ``ERROR`` event or the HTTP status): LIST again; the jobs deleted meanwhile
   are delivered as deletions (:func:`helmhive.policy.agentjob.watch.decide_vanished`).
4. **A dropped or refused connection**: reconnect from the last ``resourceVersion`` after a
   capped, jittered backoff (:func:`helmhive.policy.agentjob.watch.decide_rewatch_delay`), with one warning
   per outage and one line when the watch is back; no stack trace for a network error.

**Order.** The steps of one job run one at a time and in order; what arrives meanwhile is
coalesced into the newest copy, and a deletion is always delivered
(:class:`helmhive.policy.agentjob.watch.PendingEvents`). Different jobs run concurrently, at most
``workers`` at a time.

**Kopf's indexes first.** The steps read Kopf's indexes of runners, pools and namespaces (a job
held on a runner absent from the index is ended as ``RunnerLost``). Kopf runs no handler before
every index is filled from its initial listing, so the steps wait for :attr:`JobWatch.ready`,
set by the first call of a Kopf event handler on Namespaces (there are always some). The store
is filled regardless; the LIST's pages wait for the steps. **After an outage** the gate closes
again until contact with the API server is back (:mod:`helmhive.controller.kube.contact`: the runner
controller then writes the runners' held status) and Kopf's Runner watch, which lists again
when it reconnects, has delivered a Runner since; or ``reopen_after_s`` after this watch is
back (a cluster without runners, or a blip Kopf did not see). This watch comes back within 2 s
of the server, Kopf's may come back later, and a decision made on the runners' status from
before the outage would place a job on a runner now held. A heuristic, not a proof: the two
streams are not ordered with each other.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.kubeerrors import KubeError
from helmhive.controller.heap import freeze_start_up, rss_mib, trim_heap
from helmhive.controller.job_store_sync import JobStoreSync
from helmhive.controller.kube.door import Kube
from helmhive.controller.kube.watch import WatchStream
from helmhive.controller.runtime import JobEvents, Runtime
from helmhive.policy.agentjob.watch import (
    PendingEvents,
    WatchStepKind,
    build_deleted_body,
    decide_rewatch_delay,
    decide_watch_event,
)
from helmhive.policy.routing.job_store import JobKey

__all__ = ["JobWatch", "register", "register_runner_gate"]

AGENT_JOB = kind_by_name("AgentJob")
log = logging.getLogger("helmhive.controller.jobwatch")

_WORKERS = 64
_SERVER_TIMEOUT_S = 300


class _Expired(Exception):
    """The watch's resourceVersion is too old: list again."""


class JobWatch:
    """LIST then WATCH AgentJobs into the store and the steps (see the module docstring)."""

    def __init__(
        self,
        sync: JobStoreSync,
        events: JobEvents,
        *,
        workers: int = _WORKERS,
        server_timeout_s: int = _SERVER_TIMEOUT_S,
        random_draw: Callable[[], float] = random.random,
        in_contact: Callable[[], bool] = lambda: True,
        reopen_after_s: float = 30.0,
        trim: Callable[[], bool] = trim_heap,
        freeze: Callable[[], int] = freeze_start_up,
    ) -> None:
        self.sync = sync
        self.events = events
        self.workers = workers
        self.server_timeout_s = server_timeout_s
        self.random_draw = random_draw
        self.in_contact = in_contact
        self.reopen_after_s = reopen_after_s
        self.trim = trim
        self.freeze = freeze
        self._frozen = False
        self._busy = 0  # workers running a job's steps
        self._idle = asyncio.Event()  # set when no job waits for or runs its steps
        self._reopen: asyncio.TimerHandle | None = None
        self._indexed = False
        self._gate_closed = False
        self.pending = PendingEvents()
        self.ready = asyncio.Event()
        """Kopf's indexes are filled: the steps may run (see the module docstring)."""
        self.resource_version: str | None = None
        """The last ``resourceVersion`` seen: where the watch resumes."""
        self.lists = 0
        """Complete LISTs so far (the first, then one per 410)."""
        self.outages = 0
        """Times the watch lost the API server (one per outage, however many attempts)."""
        self._queue: asyncio.Queue[JobKey] = asyncio.Queue()
        self._drained = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._outage_since: float | None = None

    # Life cycle -----------------------------------------------------------------------------------
    def start(self, kube: Kube, *, resource_version: str | None = None) -> None:
        """LIST, then WATCH; with ``resource_version``, resume a watch from there without a LIST first."""
        self.sync.start(kube)
        self._tasks.append(asyncio.create_task(self._run(kube, resource_version), name="agentjob watch"))
        for number in range(self.workers):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"agentjob steps {number}"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # Delivery to the steps ------------------------------------------------------------------------
    def _deliver(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key: JobKey = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if self.pending.add(key, event_type, body):
            self._queue.put_nowait(key)

    def kopf_indexed(self) -> None:
        """Kopf called a handler: its indexes are filled. Opens the gate the first time."""
        if not self._indexed:
            self._indexed = True
            log.info("kopf's indexes are filled: the agentjob steps run")
            self.ready.set()

    def runners_seen(self) -> None:
        """Kopf delivered a Runner event: after an outage, once contact is back, the steps run again."""
        if self._gate_closed and self.in_contact():
            self._open("kopf's runner watch is live again")

    def _open(self, why: str) -> None:
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        if self._gate_closed:
            self._gate_closed = False
            log.info("agentjob watch: %s: the agentjob steps run", why)
            self.ready.set()

    def _close_gate(self) -> None:
        if self._indexed and not self._gate_closed:
            self._gate_closed = True
            self.ready.clear()

    async def _worker(self) -> None:
        while True:
            await self.ready.wait()
            key = await self._queue.get()
            await self.ready.wait()  # closed while this worker waited for a job
            events = self.pending.take(key)
            if len(self.pending) <= self.sync.page_size:
                self._drained.set()
            self._busy += 1
            try:
                for event_type, body in events:
                    await self.events.dispatch(event_type, body)
            except Exception:  # dispatch logs each step's failure; this is a bug, keep the worker
                log.exception("agentjob steps failed for %s/%s", *key)
            finally:
                self._busy -= 1
                if self.pending.done(key):
                    self._queue.put_nowait(key)
                elif not self._busy and not len(self.pending):
                    self._idle.set()

    async def _listed_page(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self._deliver(None, item)
        while len(self.pending) > self.sync.page_size:  # hold about two pages of whole jobs, not all
            self._drained.clear()
            await self._drained.wait()

    async def _trim_after_listing(self) -> None:
        """Once the steps have taken every listed job, give the listing's freed memory back to the OS."""
        while len(self.pending) or self._busy:
            self._idle.clear()
            await self._idle.wait()
        if not self._frozen:  # the first listing: the start-up's objects are in place
            self._frozen = True
            frozen = await asyncio.to_thread(self.freeze)
            log.info("agentjob watch: %d objects of the start-up frozen out of the garbage collector's scans", frozen)
        before = rss_mib()
        trimmed = await asyncio.to_thread(self.trim)
        after = rss_mib()
        if trimmed and before is not None and after is not None:
            log.info("agentjob watch: the listed jobs passed the steps; heap trimmed, RSS %.0f -> %.0f MiB",
                     before, after)  # fmt: skip

    # LIST and WATCH -------------------------------------------------------------------------------
    async def _run(self, kube: Kube, version: str | None) -> None:
        attempt = 0
        while True:
            try:
                if version is None:
                    listing = await self.sync.list(on_page=self._listed_page)
                    self.lists += 1
                    self._tasks.append(asyncio.create_task(self._trim_after_listing(), name="agentjob heap trim"))
                    self._back()
                    for key in listing.vanished:
                        self._deliver("DELETED", build_deleted_body(key, listing.resource_version))
                    version = listing.resource_version
                version = await self._watch(kube, version)
                attempt = 0  # the server ended the watch (its timeout): resume at once
            except _Expired as expired:
                log.info("agentjob watch: %s; listing again", expired)
                version = None
            except KubeError as err:
                if err.status == 410:
                    log.info("agentjob watch: %s; listing again", err)
                    version = None
                    continue
                version = self.resource_version or version  # the last one the failed watch saw
                self._lost(err)
                await asyncio.sleep(decide_rewatch_delay(attempt, jitter=self.random_draw()))
                attempt += 1
            except Exception:  # a bug must not stop the operator's only view of its jobs
                log.exception("agentjob watch failed; restarting it")
                version = self.resource_version or version
                await asyncio.sleep(decide_rewatch_delay(attempt, jitter=self.random_draw()))
                attempt += 1

    async def _watch(self, kube: Kube, version: str | None) -> str | None:
        """Watch from ``version`` until the server ends the stream; return the last version seen."""
        params: dict[str, Any] = {"allowWatchBookmarks": "true", "timeoutSeconds": self.server_timeout_s}
        if version:
            params["resourceVersion"] = version
        self.resource_version = version
        stream = WatchStream(
            kube, f"/apis/{GROUP}/{VERSION}/{AGENT_JOB.plural}", params, read_timeout=self.server_timeout_s + 30
        )
        try:
            async for raw in stream:
                step = decide_watch_event(raw)
                if step.kind is WatchStepKind.EXPIRED:
                    raise _Expired(step.message)
                if step.kind is WatchStepKind.ERROR:
                    raise KubeError(0, f"the watch answered {step.message}")
                self._back()
                if step.kind is WatchStepKind.OBJECT and step.body is not None:
                    self.sync.observe(step.event_type, step.body)
                    self._deliver(step.event_type, step.body)
                if step.resource_version:
                    self.resource_version = version = step.resource_version
        finally:
            stream.close()  # at once, not when the generator is collected
        return version

    def _lost(self, err: KubeError) -> None:
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self.outages += 1
            self._close_gate()
            log.warning(
                "agentjob watch: lost the API server (%s); reconnecting from version %s", err, self.resource_version
            )

    def _back(self) -> None:
        if self._gate_closed and self._reopen is None:  # no Runner event may come: reopen at this bound
            loop = asyncio.get_running_loop()
            self._reopen = loop.call_later(self.reopen_after_s, self._open, "no Runner event came")
        if self._outage_since is not None:
            log.warning(
                "agentjob watch: back after %.1f s, from version %s",
                time.monotonic() - self._outage_since,
                self.resource_version,
            )
            self._outage_since = None


def register(runtime: Runtime) -> JobWatch:
    """Start the watch with the operator that runs the handlers, and open its gate once Kopf's indexes are filled."""
    watch = JobWatch(runtime.job_store, runtime.job_events, in_contact=lambda: runtime.contact.contact)

    @kopf.on.startup()
    async def start_job_watch(**_: Any) -> None:
        watch.start(runtime.kube)

    @kopf.on.cleanup()
    async def stop_job_watch(**_: Any) -> None:
        await watch.stop()

    # Kopf calls no handler before every index is filled; there is always a namespace to call it for.
    @kopf.on.event("", "v1", "namespaces", id="agentjob-watch-gate")
    async def kopf_indexed(**_: Any) -> None:
        watch.kopf_indexed()

    return watch


def register_runner_gate(watch: JobWatch) -> None:
    """After an outage, reopen the gate on Kopf's next Runner event (see the module docstring).

    Registered after routing's Runner handlers, so the router has dropped its cached runner views
    for the same event before a job step runs.
    """

    @kopf.on.event(GROUP, VERSION, "runners", id="agentjob-watch-runners")
    async def runners_live(**_: Any) -> None:
        watch.runners_seen()

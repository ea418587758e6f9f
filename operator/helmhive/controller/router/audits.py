"""The audit records of the router's decisions: batched off the worker's path, recovered after a restart.

Each written decision's entries (``JobRouted`` or ``JobRoutingFailed``, and ``MemoryInjected``;
:mod:`helmhive.policy.audit.routing`) join a queue. One background task drains it into
``RoutingDecisions`` AuditRecords, one per namespace and batch (at most 100 entries and 256 KiB),
after a short linger (``audit_linger_seconds``) so a burst packs into few records; an idle
router writes nothing. Each create takes one token of the router's bucket. A batch whose create
failed is retried as the same record (same entries, same name), so a create that did reach the
API server before the error is a harmless 409; an ``Invalid`` batch is logged and dropped.

The job's status write is the commit point. After a restart, every decision younger than the
recovery window seen in a job's status and not audited here is checked against its namespace's
batches, listed once (:mod:`helmhive.controller.router.recovery`); an entry missing from every
batch is queued again, so a crash between the status write and the batch write loses nothing.
Two operators overlapping (a leader hand-over while the old one still flushes) can record a
decision twice; nothing is ever recorded zero times. Which decisions this process has
audited, and when, is kept on an injected monotonic clock.

Events: a job that failed closed gets its own Warning Event; assignments are counted into one
aggregated Event per Runner (:mod:`helmhive.controller.router.events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from helmhive.api.audit import AuditAction
from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.qualification import QUALIFICATION_LABEL
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.door import Conflict, Invalid, KubeError
from helmhive.controller.router.events import RunnerEventSeries
from helmhive.controller.router.recovery import AuditRecovery, ensure_routing_recorded
from helmhive.controller.router.settings import RateLimiter
from helmhive.controller.runtime import Runtime
from helmhive.policy.audit.routing import (
    DecisionKey,
    build_routing_batch,
    build_routing_decisions,
    decide_batches,
    decision_key,
)

__all__ = ["RouterAudits", "ensure_routing_recorded", "plain_job"]  # the second re-exported for its callers

AUDIT = kind_by_name("AuditRecord")
JobKey = tuple[str, str]
RunnerKey = tuple[str, str]
log = logging.getLogger("helmhive.routing")


class RouterAudits:
    """The routing audit records and Events of one operator process (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        bucket: RateLimiter,
        workers: int,
        recovery_seconds: float,
        monotonic: Callable[[], float],
        linger_seconds: float = 0.3,
        retry_seconds: float = 2.0,
        event_interval_seconds: float = 30.0,
    ) -> None:
        self.runtime = runtime
        self.bucket = bucket
        self.recovery_seconds = recovery_seconds
        self.monotonic = monotonic
        self.linger_seconds = linger_seconds
        self.retry_seconds = retry_seconds
        # Decisions whose audit this process wrote or checked, and when (pruned past the recovery window).
        self.audited: dict[JobKey, float] = {}
        self.auditing = asyncio.Semaphore(workers)
        self.workers = workers
        self.background: set[asyncio.Task[None]] = set()
        self.pending: list[dict[str, Any]] = []  # entries waiting for a batch
        # Entries this process queued, and when: whichever of the router and recovery comes second
        # adds nothing (pruned past the recovery window, like ``audited``).
        self.queued: dict[DecisionKey, float] = {}
        self.failed: list[dict[str, Any]] = []  # built batches whose create is to be retried as they are
        self.wake = asyncio.Event()
        self.flushing = asyncio.Lock()  # one flush at a time: a batch taken is written before the next looks
        self.flusher: asyncio.Task[None] | None = None
        self.events = RunnerEventSeries(runtime, bucket=bucket, interval=event_interval_seconds, monotonic=monotonic)
        self.batches_written = 0
        self.recovery = AuditRecovery(
            runtime,
            recovery_seconds=recovery_seconds,
            retry_seconds=retry_seconds,
            auditing=self.auditing,
            queue=self._queue,
            queued=lambda key: key in self.queued,
            spawn=self._spawn_task,
        )

    # Life ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background task that drains the queue into batches."""
        if self.flusher is None:
            self.flusher = asyncio.create_task(self._flush_loop())

    def forget(self, key: JobKey) -> None:
        """``key``'s decision is to be checked again (it was not written, or the job is gone)."""
        self.audited.pop(key, None)

    def cancel(self) -> None:
        """Cancel the background tasks (the operator is stopping; recovery covers what was queued)."""
        for task in self.background:
            task.cancel()
        if self.flusher is not None:
            self.flusher.cancel()

    async def close(self, *, grace: float = 5.0) -> None:
        """Stop, writing what is queued first if the API server answers within ``grace`` seconds."""
        flusher, self.flusher = self.flusher, None
        if flusher is not None:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        with contextlib.suppress(TimeoutError, KubeError):
            await asyncio.wait_for(self.flush(), grace)
        self.cancel()

    # Decisions --------------------------------------------------------------------------------
    def record(self, body: Mapping[str, Any], *, runner: RunnerKey | None) -> None:
        """Queue the audit of ``body``'s written decision (no I/O here; the flusher writes it)."""
        entries = build_routing_decisions(job=body, now=self.runtime.clock())
        self._queue(entries)
        meta = body.get("metadata") or {}
        job = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if runner is not None and any(e["action"] == AuditAction.JOB_ROUTED.value for e in entries):
            self.events.count(runner, job=job)
            self.wake.set()
        for entry in entries:
            if entry["action"] == AuditAction.JOB_ROUTING_FAILED.value:
                self.spawn(self._warn(meta, entry))

    def _queue(self, entries: list[dict[str, Any]]) -> None:
        now = self.monotonic()
        fresh = [e for e in entries if decision_key(e) not in self.queued]
        for entry in fresh:
            self.queued[decision_key(entry)] = now
        if len(self.queued) > 8192:
            horizon = now - self.recovery_seconds
            self.queued = {k: t for k, t in self.queued.items() if t >= horizon}
        if fresh:
            self.pending.extend(fresh)
            self.wake.set()

    async def _warn(self, meta: Mapping[str, Any], entry: Mapping[str, Any]) -> None:
        """The per-job Warning Event of a job that failed closed (rare; users look for it on the job)."""
        await self.bucket.take()
        await self.runtime.kube.post_event(
            involved={
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AgentJob",
                "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")},
            },
            reason=AuditAction.JOB_ROUTING_FAILED.value,
            message=str(entry.get("message") or entry["action"]),
            event_type="Warning",
            now=self.runtime.clock(),
        )

    # The flusher --------------------------------------------------------------------------------
    async def _flush_loop(self) -> None:
        while True:
            waiting_events = any(s.count > s.posted for s in self.events.series.values())
            timeout = self.events.interval if waiting_events else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)
            if self.pending and len(self.pending) < 100 and self.linger_seconds > 0:
                await asyncio.sleep(self.linger_seconds)  # let a burst pack into one batch
            self.wake.clear()
            try:
                ok = await self.flush()
                await self.events.flush()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("writing routing audit batches failed; retrying")
                ok = False
            if not ok:
                await asyncio.sleep(self.retry_seconds)
                self.wake.set()

    async def flush(self) -> bool:
        """Write the queued entries as batches; False if some must be retried (kept for the next flush)."""
        async with self.flushing:
            return await self._flush()

    async def write_now(self, job: Mapping[str, Any]) -> None:
        """Write ``job``'s queued decisions now, and wait for a batch holding them that is being written.

        For the lost-runner step, which checks the records before it clears the assignment they are
        built from: without this, a decision still lingering here is written by that step and again
        by the flusher (a duplicate record).
        """
        keys = {decision_key(e) for e in build_routing_decisions(job=job, now=self.runtime.clock())}
        async with self.flushing:
            held = self.pending + [e for record in self.failed for e in record["spec"]["decisions"]]
            if any(decision_key(e) in keys for e in held):
                await self._flush()

    async def _flush(self) -> bool:
        entries, self.pending = self.pending, []
        by_namespace: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            by_namespace.setdefault(str((entry.get("object") or {}).get("namespace") or ""), []).append(entry)
        now = self.runtime.clock()
        records = self.failed + [
            build_routing_batch(namespace=namespace, entries=batch, now=now)
            for namespace, items in by_namespace.items()
            for batch in decide_batches(items)
        ]
        self.failed = []
        for record in records:
            if not await self._create(record):
                self.failed.append(record)
        return not self.failed

    async def _create(self, record: dict[str, Any]) -> bool:
        """Create one batch record; True when it is there (or can never be)."""
        meta = record["metadata"]
        await self.bucket.take()
        try:
            await ensure_audit_unless_terminating(self.runtime.kube, record, now=self.runtime.clock())
            self.batches_written += 1
            log.info("routing audit batch %s/%s: %d decisions", meta["namespace"], meta["name"],
                     len(record["spec"]["decisions"]))  # fmt: skip
        except Conflict:
            pass  # written before (a retry whose first try reached the API server)
        except Invalid as err:
            log.error("routing audit batch %s/%s refused by the API server, dropped: %s", meta["namespace"],
                      meta["name"], err)  # fmt: skip
        except KubeError as err:
            log.warning("routing audit batch %s/%s not written (%s); retrying", meta["namespace"], meta["name"], err)
            return False
        return True

    # Recovery ----------------------------------------------------------------------------------------
    def recover(self, key: JobKey, body: Mapping[str, Any]) -> None:
        """After a restart: make sure a recent decision found in status is in some batch."""
        if key in self.audited:
            return
        if self.recovery.check(key, body):
            self.mark(key)

    def mark(self, key: JobKey) -> None:
        now = self.monotonic()
        self.audited[key] = now
        if len(self.audited) > 4096:
            horizon = now - self.recovery_seconds
            self.audited = {k: t for k, t in self.audited.items() if t >= horizon}

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` off the worker's path, at most ``workers`` at once (the bucket still applies)."""

        async def bounded() -> None:
            async with self.auditing:
                await work

        self._spawn_task(bounded())

    def _spawn_task(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task


def plain_job(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of the parts of a job the router reads (Kopf's body views are not kept)."""
    meta = body.get("metadata") or {}
    plain_meta = {
        k: meta[k]
        for k in ("name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp")
        if k in meta
    }
    qualifies = (meta.get("labels") or {}).get(QUALIFICATION_LABEL)
    if qualifies:  # the one label routing reads: a qualification probe is pinned to its runner
        plain_meta["labels"] = {QUALIFICATION_LABEL: str(qualifies)}
    return {
        "metadata": plain_meta,
        "spec": _plain(body.get("spec") or {}),
        "status": _plain(body.get("status") or {}),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value

"""The audit records of the router's decisions: written off the worker's path, recovered after a restart.

Each routed decision gets its records (``JobRouted`` or ``JobRoutingFailed``, and
``MemoryInjected``; deterministic names from :mod:`helmhive.policy.routing_audit`) from a bounded
background task, paced by the router's token bucket. After a restart, every decision younger
than the recovery window seen in a job's status is checked for its records and any missing one
is written, so a crash between the status write and the audit loses nothing. Which decisions
this process has audited, and when, is kept on an injected monotonic clock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.controller.audit import ensure_audit
from helmhive.controller.kube import Conflict, KubeError, NotFound
from helmhive.controller.router_settings import TokenBucket
from helmhive.controller.runtime import Runtime
from helmhive.policy.routing_audit import build_routing_audits

__all__ = ["RouterAudits", "plain_job"]

AUDIT = kind_by_name("AuditRecord")
JobKey = tuple[str, str]
log = logging.getLogger("helmhive.routing")


class RouterAudits:
    """The routing audit records of one operator process (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        bucket: TokenBucket,
        workers: int,
        recovery_seconds: float,
        monotonic: Callable[[], float],
    ) -> None:
        self.runtime = runtime
        self.bucket = bucket
        self.recovery_seconds = recovery_seconds
        self.monotonic = monotonic
        # Decisions whose audit this process wrote or checked, and when (pruned past the recovery window).
        self.audited: dict[JobKey, float] = {}
        self.auditing = asyncio.Semaphore(workers)
        self.background: set[asyncio.Task[None]] = set()

    def forget(self, key: JobKey) -> None:
        """``key``'s decision is to be checked again (it was not written, or the job is gone)."""
        self.audited.pop(key, None)

    def cancel(self) -> None:
        """Cancel the background tasks (the operator is stopping)."""
        for task in self.background:
            task.cancel()

    async def write(self, body: Mapping[str, Any], *, check_first: bool) -> None:
        """Create the routing audit records of ``body``'s written decision (an existing one counts as done).

        ``check_first`` reads each record before creating it: the cheap path when recovering
        after a restart, where most records exist already.
        """
        now = self.runtime.clock()
        meta = body.get("metadata") or {}
        involved = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentJob",
            "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")},
        }
        for record in build_routing_audits(job=body, now=now):
            name = record["metadata"]["name"]
            namespace = record["metadata"]["namespace"]
            try:
                if check_first:
                    try:
                        await self.runtime.kube.get(AUDIT, name, namespace=namespace)
                        continue
                    except NotFound:
                        pass
                await self.bucket.take()  # the AuditRecord
                await self.bucket.take()  # and its Event
                action = record["spec"]["action"]
                await ensure_audit(self.runtime.kube, record, involved=involved, event_reason=action, now=now)
            except Conflict:
                continue
            except KubeError as err:
                log.warning("audit record %s/%s not written: %s", namespace, name, err)

    def recover(self, key: JobKey, body: Mapping[str, Any]) -> None:
        """After a restart: make sure a recent decision found in status has its audit records."""
        if key in self.audited:
            return
        routing = (body.get("status") or {}).get("routing") or {}
        decided = _parse_time(routing.get("decidedAt"))
        if decided is None or (self.runtime.clock() - decided).total_seconds() > self.recovery_seconds:
            return  # older than any crash this process could have followed
        if not build_routing_audits(job=body, now=self.runtime.clock()):
            return  # still waiting: nothing to audit yet
        self.mark(key)
        self.spawn(self.write(plain_job(body), check_first=True))

    def mark(self, key: JobKey) -> None:
        now = self.monotonic()
        self.audited[key] = now
        if len(self.audited) > 4096:
            horizon = now - self.recovery_seconds
            self.audited = {k: t for k, t in self.audited.items() if t >= horizon}

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run audit writing off the worker's path, at most ``workers`` at once (the bucket still applies)."""

        async def bounded() -> None:
            async with self.auditing:
                await work

        task = asyncio.create_task(bounded())
        self.background.add(task)
        task.add_done_callback(self.background.discard)


def _parse_time(raw: Any) -> dt.datetime | None:
    if not raw:
        return None
    try:
        return dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None


def plain_job(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of the parts of a job the router reads (Kopf's body views are not kept)."""
    meta = body.get("metadata") or {}
    return {
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp")
            if k in meta
        },
        "spec": _plain(body.get("spec") or {}),
        "status": _plain(body.get("status") or {}),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value

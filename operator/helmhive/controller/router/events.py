"""The router's Normal Events: one aggregated ``JobsRouted`` Event per Runner, not one per job.

A per-job Normal Event cannot be aggregated across distinct jobs, so it cost one write per
routed job. Like client-go's event recorder (its EventCorrelator aggregates similar events and
raises ``count`` with a patch; events.k8s.io's EventSeries does the same on a timer), this keeps
one Event per Runner for the life of the operator process: it is created on the runner's first
assignment, then its ``count``, ``lastTimestamp`` and message are patched at most once every
``interval`` seconds. ``kubectl describe runner`` shows it; the job's own record is its status
and the ``RoutingDecisions`` AuditRecords. Warning Events (a job that failed closed) stay per job
(:mod:`helmhive.controller.router.audits`). Best effort, like every Event: errors are logged and
dropped, and an Event expired by the API server's TTL is created again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.controller.kube.door import KubeError, NotFound
from helmhive.controller.router.settings import RateLimiter
from helmhive.controller.runtime import Runtime

__all__ = ["REASON", "RunnerEventSeries"]

RUNNER = kind_by_name("Runner")
REASON = "JobsRouted"
RunnerKey = tuple[str, str]
log = logging.getLogger("helmhive.routing")


@dataclasses.dataclass
class _Series:
    count: int = 0  # assignments counted
    posted: int = 0  # of them, how many the Event shows
    latest: str = ""  # the last job assigned, namespace/name
    name: str | None = None  # the Event's name once created
    flushed_at: float | None = None  # monotonic time of the last write


class RunnerEventSeries:
    """Counts assignments per Runner and writes them as one Event per Runner (see the module docstring)."""

    def __init__(
        self, runtime: Runtime, *, bucket: RateLimiter, interval: float, monotonic: Callable[[], float]
    ) -> None:
        self.runtime = runtime
        self.bucket = bucket
        self.interval = interval
        self.monotonic = monotonic
        self.series: dict[RunnerKey, _Series] = {}

    def count(self, runner: RunnerKey, *, job: str) -> None:
        """One more job was assigned to ``runner`` (no I/O: :meth:`flush` writes)."""
        series = self.series.setdefault(runner, _Series())
        series.count += 1
        series.latest = job

    def due(self) -> list[RunnerKey]:
        """The runners whose Event is behind its count and may be written now."""
        now = self.monotonic()
        return [
            key
            for key, s in self.series.items()
            if s.count > s.posted and (s.flushed_at is None or now - s.flushed_at >= self.interval)
        ]

    async def flush(self) -> None:
        """Write every due runner's Event (one create or one patch each)."""
        for key in self.due():
            await self._write(key, self.series[key])

    async def _write(self, key: RunnerKey, series: _Series) -> None:
        namespace, name = key
        count, now = series.count, self.runtime.clock()
        message = f"{count} jobs routed to this runner by this operator process (latest: {series.latest})"
        series.flushed_at = self.monotonic()
        await self.bucket.take()
        if series.name is not None:
            try:
                await self.runtime.kube.patch_event_series(
                    series.name, namespace=namespace, count=count, message=message, now=now
                )
                series.posted = count
                return
            except NotFound:
                series.name = None  # expired (the Event TTL): start a new one
            except KubeError as err:
                log.info("event about runner %s/%s not updated: %s", namespace, name, err)
                return
        try:
            uid = (await self.runtime.kube.get(RUNNER, name, namespace=namespace))["metadata"].get("uid")
        except KubeError:
            uid = None  # gone, or unreadable: the Event still names it
        series.name = await self.runtime.kube.post_event(
            involved={
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Runner",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
            },
            reason=REASON,
            message=message,
            count=count,
            now=now,
        )
        if series.name is not None:
            series.posted = count

"""Fills the operator's AgentJob store (:class:`~helmhive.policy.job_store.JobStore`) and says when it is synced.

Owns (:class:`JobStoreSync`, one per process, on the :class:`~helmhive.controller.runtime.Runtime`):
the store, the AgentJob watch events it takes in (the operator's one AgentJob handler calls
:meth:`JobStoreSync.observe` before any step sees the event), the one paginated LIST that fills
it, and :attr:`JobStoreSync.synced`, which the router waits for before its first decision.

**When the LIST runs.** Kopf runs start-up handlers before its watches start, so a LIST made at
start-up could be older than Kopf's own initial listing: a job deleted in between would stay in
the store for ever (its deletion is before Kopf's watch begins). The LIST therefore starts when
Kopf delivers its first AgentJob event (its listing is done by then), or, when no job exists
to deliver, ``fallback_seconds`` after start-up. Everything that changes after the LIST's
snapshot reaches the store as an event, and what arrives out of order is sorted out by each
job's resourceVersion (see :mod:`helmhive.policy.job_store`).

A page that fails is retried with a backoff; a ``continue`` token that expired (410) restarts the
LIST, which is harmless (only newer copies replace what the store holds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from helmhive.api.kinds import kind_by_name
from helmhive.api.kubeerrors import KubeError
from helmhive.policy.job_store import JobStore

if TYPE_CHECKING:
    from helmhive.controller.kube import Kube

__all__ = ["JobStoreSync"]

AGENT_JOB = kind_by_name("AgentJob")
log = logging.getLogger("helmhive.controller.jobstore")

_PAGE = 500
_BACKOFF = (1.0, 2.0, 5.0, 10.0)


class JobStoreSync:
    """The store, its LIST and its synced flag (see the module docstring)."""

    def __init__(self, *, page_size: int = _PAGE, fallback_seconds: float = 5.0) -> None:
        self.store = JobStore()
        self.synced = asyncio.Event()
        self.page_size = page_size
        self.fallback_seconds = fallback_seconds
        self.kube: Kube | None = None
        self.sync_seconds: float | None = None
        self._started_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._fallback: asyncio.Task[None] | None = None

    def start(self, kube: Kube) -> None:
        """At operator start-up: remember the API door and arm the fallback for an empty cluster."""
        self.kube = kube
        self._started_at = time.monotonic()
        if self._task is None:
            self._fallback = asyncio.create_task(self._list_later(), name="agentjob store fallback")

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One AgentJob watch event: into the store; the first one starts the LIST."""
        self.store.observe(event_type, body)
        if self._task is None and self.kube is not None:
            self._begin()

    async def stop(self) -> None:
        for task in (self._fallback, self._task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _begin(self) -> None:
        self.store.begin_listing()
        self._task = asyncio.create_task(self._list(), name="agentjob store list")

    async def _list_later(self) -> None:
        await asyncio.sleep(self.fallback_seconds)
        if self._task is None:
            self._begin()

    async def _list(self) -> None:
        assert self.kube is not None
        pages = taken = attempt = 0
        token: str | None = None
        while True:
            try:
                page = await self.kube.list_page(AGENT_JOB, limit=self.page_size, continue_token=token)
            except KubeError as err:
                if token is not None and err.status == 410:
                    log.info("agentjob store: the list's continue token expired; listing again")
                    token = None
                    continue
                delay = _BACKOFF[min(attempt, len(_BACKOFF) - 1)]
                attempt += 1
                log.warning("agentjob store: a page of the list failed (%s); retrying in %.0f s", err, delay)
                await asyncio.sleep(delay)
                continue
            attempt = 0
            pages += 1
            items = page.get("items") or []
            taken += self.store.add_listed(items)
            del page["items"]
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                break
            await asyncio.sleep(0)  # let events through between pages
        self.store.finish_listing()
        started = self._started_at if self._started_at is not None else time.monotonic()
        self.sync_seconds = time.monotonic() - started
        self.synced.set()
        log.info(
            "agentjob store synced: %d jobs (%d pages, %d copies newer than the events), %d holding a runner, "
            "%.1f s after start-up",
            len(self.store),
            pages,
            taken,
            sum(len(jobs) for jobs in self.store.jobs_by_runner.values()),
            self.sync_seconds,
        )

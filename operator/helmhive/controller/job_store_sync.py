"""Fills the operator's AgentJob store (:class:`~helmhive.policy.routing.job_store.JobStore`); says when it is synced.

Owns (:class:`JobStoreSync`, one per process, on the :class:`~helmhive.controller.runtime.Runtime`):
the store, the paginated LIST that fills it, and :attr:`JobStoreSync.synced`, which the router
waits for before its first decision (it would undercount busy runners before).

The operator's own AgentJob watch (:mod:`helmhive.controller.jobs.watch`) drives it: it calls
:meth:`JobStoreSync.list` first (and again after a 410), then watches from the list's
``resourceVersion`` and hands every event to :meth:`JobStoreSync.observe` before any step sees it.
List and watch are one ordered stream, so nothing the LIST missed is lost, and a re-list finds
the jobs deleted while nobody watched (:func:`helmhive.policy.agentjob.watch.decide_vanished`) and
drops them, returning them so their deletion reaches the steps too.

A ``continue`` token that expired (410) restarts the LIST, which is harmless (only newer copies
replace what the store holds). Any other failure is raised to the watch, which retries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from helmhive.api.kinds import kind_by_name
from helmhive.api.kubeerrors import KubeError
from helmhive.policy.agentjob.watch import build_deleted_body, decide_vanished
from helmhive.policy.routing.job_store import JobKey, JobStore, parse_resource_version

if TYPE_CHECKING:
    from helmhive.controller.kube.door import Kube

__all__ = ["JobStoreSync", "Listing"]

AGENT_JOB = kind_by_name("AgentJob")
log = logging.getLogger("helmhive.controller.jobstore")

_PAGE = 500

PageSink = Callable[[list[dict[str, Any]]], Awaitable[None]]


class Listing(NamedTuple):
    """What one complete LIST found."""

    resource_version: str | None
    """Where a watch resumes from."""
    vanished: list[JobKey]
    """Jobs the store held that the LIST no longer shows (already dropped from the store)."""


class JobStoreSync:
    """The store, its LIST and its synced flag (see the module docstring)."""

    def __init__(self, *, page_size: int = _PAGE) -> None:
        self.store = JobStore()
        self.synced = asyncio.Event()
        self.page_size = page_size
        self.kube: Kube | None = None
        self.sync_seconds: float | None = None
        self._started_at: float | None = None

    def start(self, kube: Kube) -> None:
        """At operator start-up: remember the API door and when the operator started."""
        self.kube = kube
        self._started_at = time.monotonic()

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """One AgentJob watch event into the store; False when it was older than the store's copy."""
        return self.store.observe(event_type, body)

    async def list(self, on_page: PageSink | None = None) -> Listing:
        """One complete paginated LIST into the store; ``on_page`` gets each page's jobs after the store.

        Sets :attr:`synced` at the end of the first one. Raises :class:`KubeError` when a page
        fails (other than an expired ``continue`` token, which restarts the LIST).
        """
        assert self.kube is not None, "start() first"
        self.store.begin_listing()
        pages = taken = 0
        token: str | None = None
        version: str | None = None
        listed: set[JobKey] = set()
        while True:
            try:
                page = await self.kube.list_page(AGENT_JOB, limit=self.page_size, continue_token=token)
            except KubeError as err:
                if token is None or err.status != 410:
                    raise
                log.info("agentjob store: the list's continue token expired; listing again")
                token, version, listed = None, None, set()
                continue
            pages += 1
            meta = page.get("metadata") or {}
            version = version or meta.get("resourceVersion")
            items: list[dict[str, Any]] = page.get("items") or []
            taken += self.store.add_listed(items)
            listed.update((str(i["metadata"].get("namespace", "")), str(i["metadata"]["name"])) for i in items)
            del page["items"]
            if on_page is not None:
                await on_page(items)
            token = meta.get("continue") or None
            if token is None:
                break
        list_version = parse_resource_version({"metadata": {"resourceVersion": version}})
        vanished = decide_vanished(self.store.versions(), listed, list_version)
        for key in vanished:
            self.store.observe("DELETED", build_deleted_body(key, version))
        self.store.finish_listing()
        first = not self.synced.is_set()
        if first:
            started = self._started_at if self._started_at is not None else time.monotonic()
            self.sync_seconds = time.monotonic() - started
            self.synced.set()
        log.info(
            "agentjob store %s: %d jobs (%d pages, %d copies newer than the store's), %d holding a runner, "
            "%d vanished%s",
            "synced" if first else "listed again",
            len(self.store),
            pages,
            taken,
            sum(len(jobs) for jobs in self.store.jobs_by_runner.values()),
            len(vanished),
            f", {self.sync_seconds:.1f} s after start-up" if first else "",
        )
        return Listing(version, vanished)

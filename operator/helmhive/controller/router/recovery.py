"""After a restart, the routing decisions whose audit batch a crash cut off: found in one LIST per namespace.

The job's status write is the commit point of a decision; its entries are batched afterwards
(:mod:`helmhive.controller.router.audits`), so a crash between the two leaves a decision in
status and in no record. Owns :class:`AuditRecovery`, which finds those, and the per-job check of
the lost-runner and failed-job steps (:func:`ensure_routing_recorded`).

**One LIST per namespace.** Every job seen with a decision younger than the recovery window
(``audit_recovery_seconds``) and not audited by this process is a *check*: its key, when it
was decided and its entries (never the whole job), queued per namespace. The first check of a
namespace lists that namespace's ``RoutingDecisions`` batches built within the window (by their
``helmhive.dev/audit-hour`` label, paginated, keeping only the decisions' keys); every check is
then a set lookup (:func:`helmhive.policy.audit.routing.decide_missing_entries`), and an entry
no batch holds is queued to be written. A restart over 10,000 jobs costs a few LISTs, not
10,000, and holds only the keys.

A decision made after its namespace was listed is not looked up: this process made it (and
queued its entries) or another operator did while both ran (a leader hand-over), which may
record it twice, never zero times. Past the recovery window the keys are dropped. A LIST that
fails is retried; the checks wait for it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import sys
from collections.abc import Callable, Coroutine, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from helmhive.api.kinds import kind_by_name
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.door import Conflict, Kube, KubeError
from helmhive.controller.runtime import Runtime
from helmhive.policy.audit.routing import (
    DecisionKey,
    build_routing_batch,
    build_routing_decisions,
    decide_missing_entries,
    decide_recovery_selector,
    decision_key,
    held_decision_keys,
    job_audit_label,
)

__all__ = ["AuditRecovery", "ensure_routing_recorded", "list_held_decisions", "missing_entries"]

AUDIT = kind_by_name("AuditRecord")
JobKey = tuple[str, str]
Check = tuple[JobKey, dt.datetime, list[dict[str, Any]]]
log = logging.getLogger("helmhive.routing")

_PAGE = 50  # batches a page: at most 256 KiB of entries each
_CLOCK_MARGIN_S = 300.0  # the hours listed reach this far past the window, for clocks that disagree


class AuditRecovery:
    """The recovery checks of one operator process (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        recovery_seconds: float,
        retry_seconds: float,
        auditing: asyncio.Semaphore,
        queue: Callable[[list[dict[str, Any]]], None],
        queued: Callable[[DecisionKey], bool],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self.runtime = runtime
        self.recovery_seconds = recovery_seconds
        self.retry_seconds = retry_seconds
        self.auditing = auditing  # the audit workers' bound: a LIST takes one
        self.queue = queue  # entries to write
        self.queued = queued  # this process queued the decision already
        self.spawn = spawn
        self.checks: dict[str, collections.deque[Check]] = {}
        """Per namespace, the checks waiting for its batches to be listed."""
        self.workers: dict[str, asyncio.Task[None]] = {}
        self.held: dict[str, set[DecisionKey]] = {}
        """Per namespace, the decisions its batches held when listed."""
        self.held_at: dict[str, dt.datetime] = {}
        self.lists = 0
        """Complete LISTs of batches made so far (one per namespace with recent decisions)."""

    def check(self, key: JobKey, body: Mapping[str, Any]) -> bool:
        """Queue a check of ``body``'s decision if it is recent; True when one was queued."""
        decided = _parse_time(((body.get("status") or {}).get("routing") or {}).get("decidedAt"))
        now = self.runtime.clock()
        if decided is None or (now - decided).total_seconds() > self.recovery_seconds:
            return False  # older than any crash this process could have followed
        entries = build_routing_decisions(job=body, now=now)
        if not entries:
            return False  # still waiting: nothing to audit yet
        namespace = key[0]
        self.checks.setdefault(namespace, collections.deque()).append((key, decided, entries))
        if namespace not in self.workers:
            self.workers[namespace] = self.spawn(self._worker(namespace))
        return True

    async def _worker(self, namespace: str) -> None:
        """Take the namespace's checks until none is left (one task per namespace at a time)."""
        checks = self.checks[namespace]
        try:
            while checks:
                held = await self._held(namespace, checks[0][1])
                key, _, entries = checks.popleft()
                missing = [e for e in decide_missing_entries(entries, held) if not self.queued(decision_key(e))]
                if missing:
                    log.info("routing audit of %s/%s recovered: %s", *key, ", ".join(str(e["action"]) for e in missing))
                    self.queue([dict(e) for e in missing])
        finally:
            del self.workers[namespace]
            if not checks:
                del self.checks[namespace]

    async def _held(self, namespace: str, decided: dt.datetime) -> AbstractSet[DecisionKey]:
        """What the namespace's batches held when first listed; nothing for a decision made after that."""
        taken = self.held_at.get(namespace)
        if taken is None:
            taken = self.runtime.clock()
            self.held[namespace] = await self._list(namespace, now=taken)
            self.held_at[namespace] = taken
        if decided > taken:
            return frozenset()
        if (self.runtime.clock() - taken).total_seconds() > self.recovery_seconds:
            self.held[namespace] = set()  # no decision from before the LIST is recent any more
        return self.held[namespace]

    async def _list(self, namespace: str, *, now: dt.datetime) -> set[DecisionKey]:
        """One paginated LIST of the namespace's batches of the window; retried until it succeeds."""
        selector = decide_recovery_selector(
            since=now - dt.timedelta(seconds=self.recovery_seconds + _CLOCK_MARGIN_S),
            until=now + dt.timedelta(seconds=_CLOCK_MARGIN_S),
        )
        while True:
            try:
                async with self.auditing:
                    held, pages = await list_held_decisions(self.runtime.kube, namespace, selector)
            except KubeError as err:
                log.warning("routing audit recovery in %s: batches not listed (%s); retrying", namespace, err)
                await asyncio.sleep(self.retry_seconds)
                continue
            self.lists += 1
            log.info("routing audit recovery in %s: the window's batches hold %d decisions (%d pages)",
                     namespace, len(held), pages)  # fmt: skip
            return held


async def list_held_decisions(kube: Kube, namespace: str, selector: str) -> tuple[set[DecisionKey], int]:
    """The decisions held by the namespace's batches ``selector`` selects, and the pages read.

    Paginated (:data:`_PAGE` batches a page); only the keys are kept. A ``continue`` token that
    expired (410) restarts the LIST.
    """
    held: set[DecisionKey] = set()
    token: str | None = None
    pages = 0
    while True:
        try:
            page = await kube.list_page(
                AUDIT, limit=_PAGE, continue_token=token, namespace=namespace, label_selector=selector
            )
        except KubeError as err:
            if token is None or err.status != 410:
                raise
            held, token = set(), None
            continue
        pages += 1
        held.update((uid, attempt, sys.intern(action)) for uid, attempt, action in held_decision_keys(page["items"]))
        token = (page.get("metadata") or {}).get("continue") or None
        if token is None:
            return held, pages


async def missing_entries(kube: Kube, job: Mapping[str, Any], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of ``job`` no ``RoutingDecisions`` record holds yet (one labelled LIST of the job's batches)."""
    meta = job.get("metadata") or {}
    records = await kube.list(
        AUDIT, str(meta.get("namespace", "")), label_selector=job_audit_label(str(meta.get("uid", "")))
    )
    return [dict(e) for e in decide_missing_entries(entries, held_decision_keys(records))]


async def ensure_routing_recorded(kube: Kube, job: Mapping[str, Any], *, now: dt.datetime) -> None:
    """Make sure ``job``'s current decision is in some batch, writing a batch of its own if not (now).

    For the lost-runner and failed-job steps, which are about to clear the assignment the entries
    are built from. Raises KubeError (the caller retries); an existing record of the same name is
    a 409: done.
    """
    missing = await missing_entries(kube, job, build_routing_decisions(job=job, now=now))
    if not missing:
        return
    namespace = str((job.get("metadata") or {}).get("namespace", ""))
    with contextlib.suppress(Conflict):
        await ensure_audit_unless_terminating(
            kube, build_routing_batch(namespace=namespace, entries=missing, now=now), now=now
        )


def _parse_time(raw: Any) -> dt.datetime | None:
    if not raw:
        return None
    try:
        return dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None

"""Waiting for a reference that does not exist yet, up to a deadline. Pure.

GitOps tools (``kubectl apply -f dir/``, Argo CD, Flux) create objects in an order nobody
controls, so a job or memory record that names a Workspace or Profile created a moment
later is the normal case, not an error. Such an object **waits** with a reason that names
what it waits for, and is looked at again when that object appears or changes; only when
its deadline passes does it fail closed with the reason it would have had at once:

- the Workspace is missing: ``WaitingForWorkspace``, then ``WorkspaceNotFound``;
- the Workspace names no active profile for the job's kind: ``WaitingForProfile``, then
  ``ProfileNotFound`` (a change to the Workspace ends the wait);
- the Profile is missing: ``WaitingForProfile``, then ``ProfileNotFound``;
- the Profile is valid but the operator has not written the revision for its current spec
  yet: ``WaitingForProfile``, then ``ProfileNotFound``.

The deadline is the object's ``metadata.creationTimestamp`` plus a limit (the operator's
``--reference-wait-seconds``, 600 by default), so an operator restart neither extends nor
resets it. What the specification names as a refusal is never waited for: an invalid
profile, a profile for another envelope, no eligible mapping, an unadvertised model.

Whether a job still needs binding is :attr:`helmhive.policy.agentjob.life.AgentJob.needs_binding`.

Also here, as plain data structures for the operator's single scheduler:
:class:`DeadlineHeap` (the next time each object must be looked at, earliest first) and
:class:`WaitingRoom` (which objects wait for which reference). Neither does I/O nor reads
a clock; ``now`` is always an argument.
"""

from __future__ import annotations

import datetime as dt
import enum
import heapq
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from helmhive.api.common import JobKind
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.conditions import ConditionUpdate, set_condition
from helmhive.policy.timestamps import as_utc, format_timestamp

__all__ = [
    "DEFAULT_REFERENCE_WAIT",
    "WAITING_REASONS",
    "DeadlineHeap",
    "MissingReference",
    "Reference",
    "ReferenceKind",
    "WaitDecision",
    "WaitingRoom",
    "build_bound_conditions",
    "build_unbound_conditions",
    "decide_reference_wait",
    "decide_wait_deadline",
    "missing_profile",
    "missing_profile_binding",
    "missing_workspace",
    "parse_timestamp",
    "pending_profile_revision",
]

DEFAULT_REFERENCE_WAIT = dt.timedelta(minutes=10)
"""How long after its creation an object waits for a reference before failing closed."""

WAITING_REASONS = frozenset({Reason.WAITING_FOR_WORKSPACE.value, Reason.WAITING_FOR_PROFILE.value})
"""Reasons of a job that waits for a reference: not final, and not yet bound."""

K = TypeVar("K", bound=Hashable)


class ReferenceKind(enum.StrEnum):
    """The kinds of object whose appearance or change can end a wait."""

    WORKSPACE = "Workspace"
    PROFILE = "Profile"


@dataclass(frozen=True, kw_only=True)
class Reference:
    """One object by kind, namespace and name: what a waiting object is woken by."""

    kind: ReferenceKind
    namespace: str
    name: str


@dataclass(frozen=True, kw_only=True)
class MissingReference:
    """A reference that does not resolve (yet), and the reasons for waiting and for giving up."""

    reference: Reference
    waiting_reason: Reason
    final_reason: Reason
    message: str


def missing_workspace(*, namespace: str, name: str) -> MissingReference:
    """The Workspace ``name`` does not exist in ``namespace``."""
    return MissingReference(
        reference=Reference(kind=ReferenceKind.WORKSPACE, namespace=namespace, name=name),
        waiting_reason=Reason.WAITING_FOR_WORKSPACE,
        final_reason=Reason.WORKSPACE_NOT_FOUND,
        message=f"workspace {name} does not exist in {namespace}",
    )


def missing_profile_binding(*, namespace: str, workspace: str, job_kind: JobKind) -> MissingReference:
    """The Workspace exists but names no active profile for ``job_kind``: a change to it ends the wait."""
    return MissingReference(
        reference=Reference(kind=ReferenceKind.WORKSPACE, namespace=namespace, name=workspace),
        waiting_reason=Reason.WAITING_FOR_PROFILE,
        final_reason=Reason.PROFILE_NOT_FOUND,
        message=f"workspace {workspace} names no active profile for {job_kind.value}",
    )


def missing_profile(*, namespace: str, name: str) -> MissingReference:
    """The Profile ``name`` does not exist in ``namespace``."""
    return MissingReference(
        reference=Reference(kind=ReferenceKind.PROFILE, namespace=namespace, name=name),
        waiting_reason=Reason.WAITING_FOR_PROFILE,
        final_reason=Reason.PROFILE_NOT_FOUND,
        message=f"profile {name} does not exist in {namespace}",
    )


def pending_profile_revision(*, namespace: str, name: str) -> MissingReference:
    """The Profile is valid but its revision for the current spec is not written yet (the operator makes it)."""
    return MissingReference(
        reference=Reference(kind=ReferenceKind.PROFILE, namespace=namespace, name=name),
        waiting_reason=Reason.WAITING_FOR_PROFILE,
        final_reason=Reason.PROFILE_NOT_FOUND,
        message=f"profile {name} has no revision for its current spec yet",
    )


@dataclass(frozen=True, kw_only=True)
class WaitDecision:
    """Wait (until ``deadline``) or fail closed now, with the condition reason and message."""

    waiting: bool
    reason: Reason
    message: str
    deadline: dt.datetime


def parse_timestamp(raw: Any) -> dt.datetime | None:
    """Read a Kubernetes timestamp (``2026-01-02T03:04:05Z``) as an aware UTC datetime; None if unreadable."""
    if isinstance(raw, dt.datetime):
        return as_utc(raw)
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return as_utc(dt.datetime.fromisoformat(raw.replace("Z", "+00:00")))
    except ValueError:
        return None


def decide_wait_deadline(*, created_at: dt.datetime | None, now: dt.datetime, limit: dt.timedelta) -> dt.datetime:
    """When an object created at ``created_at`` stops waiting: creation plus ``limit``.

    An object without a readable creation time (never the case for one the API server
    stored) is given the whole ``limit`` from ``now``.
    """
    return as_utc(created_at if created_at is not None else now) + limit


def decide_reference_wait(
    *, missing: MissingReference, created_at: dt.datetime | None, now: dt.datetime, limit: dt.timedelta
) -> WaitDecision:
    """Wait for ``missing`` while ``now`` is before the deadline; fail closed with its final reason after."""
    deadline = decide_wait_deadline(created_at=created_at, now=now, limit=limit)
    if as_utc(now) < deadline:
        return WaitDecision(
            waiting=True,
            reason=missing.waiting_reason,
            message=f"{missing.message}; waiting until {format_timestamp(deadline)}",
            deadline=deadline,
        )
    seconds = int(limit.total_seconds())
    return WaitDecision(
        waiting=False,
        reason=missing.final_reason,
        message=f"{missing.message} (waited {seconds}s after creation, until {format_timestamp(deadline)})",
        deadline=deadline,
    )


def build_unbound_conditions(
    conditions: Sequence[dict[str, Any]] | None,
    *,
    reason: Reason,
    message: str,
    generation: int | None,
    now: dt.datetime,
) -> ConditionUpdate:
    """``Routed=False`` and ``Ready=False``, both with ``reason``: a job waiting, or failed closed at queue time."""
    update = ConditionUpdate([dict(c) for c in conditions or ()], False)
    for ctype in (ConditionType.ROUTED, ConditionType.READY):
        step = set_condition(
            update.conditions, type=ctype, status=False, reason=reason, message=message, generation=generation, now=now
        )
        update = ConditionUpdate(step.conditions, update.changed or step.changed)
    return update


def build_bound_conditions(conditions: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The conditions once the job is bound: without the waiting ``Routed``/``Ready``; None if there were none.

    Routing then sees the job as it would a job bound at once (no ``Routed`` condition yet).
    """
    kept = [
        dict(c)
        for c in conditions or ()
        if not (
            c.get("type") in (ConditionType.ROUTED, ConditionType.READY)
            and c.get("status") == "False"
            and c.get("reason") in WAITING_REASONS
        )
    ]
    return kept if len(kept) != len(conditions or ()) else None


class DeadlineHeap(Generic[K]):
    """At most one pending time per key, earliest first; setting a key again replaces its time.

    Replaced and discarded entries stay in the heap until they surface and are skipped, so
    every operation is O(log n) and the heap never holds more than the live keys plus the
    entries replaced since they last surfaced.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[dt.datetime, int, K]] = []
        self._when: dict[K, tuple[dt.datetime, int]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._when)

    def __contains__(self, key: object) -> bool:
        return key in self._when

    def when(self, key: K) -> dt.datetime | None:
        """The pending time of ``key``, or None."""
        entry = self._when.get(key)
        return entry[0] if entry is not None else None

    def set(self, key: K, when: dt.datetime) -> None:
        """Make ``when`` the pending time of ``key`` (replacing any earlier or later one)."""
        entry = (as_utc(when), next(self._seq))
        self._when[key] = entry
        heapq.heappush(self._heap, (*entry, key))
        if len(self._heap) > 2 * len(self._when) + 64:
            self._compact()

    def discard(self, key: K) -> None:
        """Forget ``key``'s pending time, if any."""
        self._when.pop(key, None)

    def next_at(self) -> dt.datetime | None:
        """The earliest pending time, or None when nothing is pending."""
        self._skip_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: dt.datetime) -> list[K]:
        """Remove and return every key due at ``now`` (time ``<= now``), earliest first."""
        due: list[K] = []
        moment = as_utc(now)
        while True:
            self._skip_stale()
            if not self._heap or self._heap[0][0] > moment:
                return due
            _, _, key = heapq.heappop(self._heap)
            del self._when[key]
            due.append(key)

    def _skip_stale(self) -> None:
        while self._heap:
            when, seq, key = self._heap[0]
            if self._when.get(key) == (when, seq):
                return
            heapq.heappop(self._heap)

    def _compact(self) -> None:
        self._heap = [(when, seq, key) for key, (when, seq) in self._when.items()]
        heapq.heapify(self._heap)


class WaitingRoom(Generic[K]):
    """Which waiting objects (keys) are woken by which :class:`Reference`, both ways."""

    def __init__(self) -> None:
        self._by_reference: dict[Reference, set[K]] = {}
        self._by_waiter: dict[K, set[Reference]] = {}

    def __len__(self) -> int:
        return len(self._by_waiter)

    def __contains__(self, waiter: object) -> bool:
        return waiter in self._by_waiter

    def expect(self, waiter: K, reference: Reference) -> None:
        """``waiter`` is to be woken when ``reference`` appears or changes."""
        self._by_reference.setdefault(reference, set()).add(waiter)
        self._by_waiter.setdefault(waiter, set()).add(reference)

    def waiters(self, reference: Reference) -> list[K]:
        """The keys waiting for ``reference`` (a copy, in no particular order)."""
        return list(self._by_reference.get(reference, ()))

    def references(self, waiter: K) -> set[Reference]:
        """What ``waiter`` waits for (a copy)."""
        return set(self._by_waiter.get(waiter, ()))

    def forget(self, waiter: K) -> None:
        """``waiter`` waits for nothing any more."""
        for reference in self._by_waiter.pop(waiter, ()):
            waiters = self._by_reference.get(reference)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._by_reference[reference]

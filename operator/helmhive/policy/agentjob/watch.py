"""What the operator's own AgentJob watch makes of the API server's answers. Pure.

The operator lists and watches AgentJobs itself (:mod:`helmhive.controller.jobs.watch`; Kopf no
longer watches them). This module holds its decisions, without I/O:

- :func:`decide_watch_event`: one line of a watch stream is a job's change, a bookmark (only a
  newer ``resourceVersion``), an expiry (410 Gone, "too old resource version": re-list) or
  another error (reconnect);
- :func:`decide_vanished`: after a re-list, the jobs the store holds that the list no longer
  shows, deleted while nobody watched; their deletion is delivered like a watch event, with
  :func:`build_deleted_body`;
- :class:`PendingEvents`: the events of each job waiting for its steps. The steps of one job run
  one at a time, so what arrives meanwhile is coalesced: the steps are level-triggered and only
  need the newest copy, but a deletion is never dropped (a job deleted and created again under
  its name delivers both);
- :func:`decide_rewatch_delay`: the capped, jittered delay before reconnecting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from helmhive.policy.backoff import decide_jittered_delay

__all__ = [
    "JobEvent",
    "PendingEvents",
    "WatchStep",
    "WatchStepKind",
    "build_deleted_body",
    "decide_rewatch_delay",
    "decide_vanished",
    "decide_watch_event",
]

JobKey = tuple[str, str]
JobEvent = tuple[str | None, Mapping[str, Any]]
"""(event type, None for a listed job; the job)."""

_OBJECT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED"})


class WatchStepKind(StrEnum):
    OBJECT = "object"
    """A job was added, changed or deleted."""
    BOOKMARK = "bookmark"
    """Nothing changed; resume from its ``resourceVersion``."""
    EXPIRED = "expired"
    """The ``resourceVersion`` is too old (410): list again."""
    ERROR = "error"
    """Another error from the server: reconnect from the last ``resourceVersion``."""


@dataclass(frozen=True)
class WatchStep:
    kind: WatchStepKind
    event_type: str | None = None
    body: Mapping[str, Any] | None = None
    resource_version: str | None = None
    """Where the next watch resumes from (None: unchanged)."""
    message: str = ""


def _version(body: Mapping[str, Any] | None) -> str | None:
    raw = ((body or {}).get("metadata") or {}).get("resourceVersion")
    return str(raw) if raw else None


def decide_watch_event(event: Mapping[str, Any]) -> WatchStep:
    """What one decoded watch event means (see the module docstring)."""
    kind = event.get("type")
    obj = event.get("object")
    body: Mapping[str, Any] = obj if isinstance(obj, Mapping) else {}
    if kind in _OBJECT_TYPES and body.get("metadata"):
        return WatchStep(WatchStepKind.OBJECT, event_type=str(kind), body=body, resource_version=_version(body))
    if kind == "BOOKMARK":
        return WatchStep(WatchStepKind.BOOKMARK, resource_version=_version(body))
    code = body.get("code")
    message = str(body.get("message") or body.get("reason") or kind or "an empty event")
    if kind == "ERROR" and (code == 410 or body.get("reason") in ("Expired", "Gone")):
        return WatchStep(WatchStepKind.EXPIRED, message=message)
    return WatchStep(WatchStepKind.ERROR, message=f"{kind}: {message}")


def decide_vanished(
    held: Mapping[JobKey, int | None], listed: Iterable[JobKey], list_version: int | None
) -> list[JobKey]:
    """The jobs held (with the version they were last seen at) that a complete list did not show.

    A job seen at a version newer than the list's was created or changed after the list's
    snapshot: it has not vanished. Without comparable versions, absent means vanished.
    """
    seen = set(listed)
    return sorted(
        key
        for key, version in held.items()
        if key not in seen and (version is None or list_version is None or version <= list_version)
    )


def build_deleted_body(key: JobKey, resource_version: str | None) -> dict[str, Any]:
    """The body a vanished job's deletion is delivered with: only its name (its last copy is not kept)."""
    meta: dict[str, Any] = {"namespace": key[0], "name": key[1]}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "helmhive.dev/v1alpha1", "kind": "AgentJob", "metadata": meta}


def decide_rewatch_delay(attempt: int, *, jitter: float, base: float = 0.5, cap: float = 2.0) -> float:
    """Seconds before reconnect ``attempt`` (0-based): doubling from ``base`` up to ``cap``, times 0.5 to 1.

    ``jitter`` is a number in [0, 1) (the caller's random draw), so many operators do not reconnect
    in step. The cap is short: the heartbeat hold counts from the watches' return.
    """
    return decide_jittered_delay(attempt=attempt, fraction=0.5 + jitter / 2, base_s=base, cap_s=cap)


class PendingEvents:
    """Per job, the events its steps have not taken yet, coalesced (see the module docstring).

    :meth:`add` answers whether the job must be scheduled (it is neither queued nor running);
    a worker :meth:`take`\\ s its events, runs them, and calls :meth:`done`, which answers whether
    more came meanwhile (schedule it again). A job is therefore never run by two workers at once.
    """

    def __init__(self) -> None:
        self._events: dict[JobKey, list[JobEvent]] = {}
        self._scheduled: set[JobKey] = set()

    def __len__(self) -> int:
        """Jobs with events waiting."""
        return len(self._events)

    def add(self, key: JobKey, event_type: str | None, body: Mapping[str, Any]) -> bool:
        events = self._events.setdefault(key, [])
        if event_type == "DELETED":
            # The deletion supersedes any change before it (and an earlier deletion of the same name).
            events[:] = [("DELETED", body)]
        elif events and events[-1][0] != "DELETED":
            events[-1] = (event_type, body)  # the newest copy is all the steps need
        else:
            events.append((event_type, body))  # after a deletion: the job created again
        if key in self._scheduled:
            return False
        self._scheduled.add(key)
        return True

    def take(self, key: JobKey) -> list[JobEvent]:
        return self._events.pop(key, [])

    def done(self, key: JobKey) -> bool:
        """The job's steps finished: True when it has more events (schedule it again)."""
        if key in self._events:
            return True
        self._scheduled.discard(key)
        return False

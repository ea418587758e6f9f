"""The audit page model: the namespace's AuditRecords, newest first, bounded, filtered by a search. Pure.

The search is the page's GET form (:class:`AuditQuery`): by object (``Kind/name``, or part of
it), actor, action and a time range. A record shows its action, object, actor, time, before and
after state, message and details; a ``RoutingDecisions`` batch also each decision's action and
job. AuditRecords hold names, revisions and hashes only (docs/audit.md); like
:mod:`helmhive.console.view`, this names every field shown.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from helmhive.api.audit import AuditAction
from helmhive.console.view import Row, as_text, get_path, object_ref

__all__ = ["AUDIT_LIMIT", "AuditPage", "AuditQuery", "build_audit", "parse_audit_query"]

AUDIT_LIMIT = 200
ACTIONS = tuple(a.value for a in AuditAction)


@dataclass(frozen=True)
class AuditQuery:
    """What the search asks: each empty field matches every record."""

    object: str = ""
    actor: str = ""
    action: str = ""
    since: str = ""
    until: str = ""

    def as_row(self) -> Row:
        return {
            "object": self.object,
            "actor": self.actor,
            "action": self.action,
            "since": self.since,
            "until": self.until,
        }


@dataclass(frozen=True)
class AuditPage:
    namespace: str
    query: AuditQuery
    records: list[Row]
    matched: int
    total: int
    limit: int
    actions: list[str]
    problems: list[str] = field(default_factory=list)


def _when(text: str) -> dt.datetime | None:
    """An RFC 3339 time or a form's ``datetime-local`` (taken as UTC); None when empty or not a time."""
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def parse_audit_query(params: Mapping[str, list[str]]) -> tuple[AuditQuery, list[str]]:
    """The search from a query string (``parse_qs``'s answer), and a line for each field it cannot use."""

    def one(key: str) -> str:
        return (params.get(key) or [""])[0].strip()[:256]

    query = AuditQuery(
        object=one("object"), actor=one("actor"), action=one("action"), since=one("since"), until=one("until")
    )
    problems = []
    if query.action and query.action not in ACTIONS:
        problems.append(f"no such action {query.action!r}; the actions are {', '.join(ACTIONS)}")
    for key in ("since", "until"):
        value = getattr(query, key)
        if value and _when(value) is None:
            problems.append(f"{key} {value!r} is not a time (use 2026-12-06T12:00 or RFC 3339); not applied")
    return query, problems


def _state(state: Any) -> str:
    if not isinstance(state, dict):
        return ""
    parts = [as_text(state.get(k)) for k in ("value", "revision", "hash") if state.get(k)]
    return " · ".join(parts)


def build_audit_row(record: dict[str, Any]) -> Row:
    """One record's row (every field a string)."""
    spec = record.get("spec") or {}
    obj = spec.get("object") or {}
    details = spec.get("details") or {}
    shown = [f"{k}={v}" for k, v in sorted(details.items())] if isinstance(details, dict) else []
    for decision in spec.get("decisions") or []:
        if isinstance(decision, dict):
            shown.append(
                f"{as_text(decision.get('action'))} {as_text(get_path(decision, 'object', 'name'))}: "
                f"{as_text(decision.get('message'))}".rstrip(": ")
            )
    for suggestion in spec.get("suggestions") or []:
        if isinstance(suggestion, dict):
            shown.append(f"suggestion {as_text(suggestion.get('record'))} {as_text(suggestion.get('digest'))}")
    return {
        "name": object_ref(record)[1],
        "time": as_text(spec.get("time")),
        "action": as_text(spec.get("action")),
        "object": f"{as_text(obj.get('kind'))}/{as_text(obj.get('name'))}",
        "actor": as_text(get_path(spec, "actor", "username")),
        "before": _state(spec.get("before")),
        "after": _state(spec.get("after")),
        "message": as_text(spec.get("message")),
        "details": "; ".join(shown),
    }


def _matches(row: Row, query: AuditQuery, since: dt.datetime | None, until: dt.datetime | None) -> bool:
    if query.action and row["action"] != query.action:
        return False
    if query.object and query.object.lower() not in row["object"].lower():
        return False
    if query.actor and query.actor.lower() not in row["actor"].lower():
        return False
    if since or until:
        when = _when(row["time"])
        if when is None or (since and when < since) or (until and when > until):
            return False
    return True


def build_audit(
    *,
    namespace: str,
    records: list[dict[str, Any]],
    query: AuditQuery,
    problems: list[str] | None = None,
    limit: int = AUDIT_LIMIT,
) -> AuditPage:
    """The records that match ``query``, newest first (by ``spec.time``, then name), at most ``limit``."""
    rows = [build_audit_row(r) for r in records]
    rows.sort(key=lambda r: (_when(r["time"]) or dt.datetime.min.replace(tzinfo=dt.UTC), r["name"]), reverse=True)
    since, until = _when(query.since), _when(query.until)
    matched = [r for r in rows if _matches(r, query, since, until)]
    return AuditPage(
        namespace=namespace,
        query=query,
        records=matched[:limit],
        matched=len(matched),
        total=len(rows),
        limit=limit,
        actions=list(ACTIONS),
        problems=list(problems or []),
    )

"""Writes AuditRecords (the durable trail) and Events (best effort), and applies retention.

The AuditRecord is the record; the Event is a convenience for ``kubectl describe`` and may
be lost. A failure to write the AuditRecord is raised so Kopf retries the handler.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from helmhive.api.kinds import kind_by_name
from helmhive.controller.kube import Kube
from helmhive.policy.audit import decide_audit_retention

__all__ = ["AUDIT", "ensure_audit", "patch_audit_retention"]

AUDIT = kind_by_name("AuditRecord")


async def ensure_audit(
    kube: Kube,
    record: dict[str, Any],
    *,
    involved: dict[str, Any] | None = None,
    event_reason: str | None = None,
    event_type: str = "Normal",
    now: dt.datetime,
) -> dict[str, Any]:
    """Create the AuditRecord, then post an Event about ``involved`` if given."""
    namespace = record["metadata"]["namespace"]
    created = await kube.create(AUDIT, record, namespace=namespace)
    if involved is not None and event_reason:
        await kube.post_event(
            involved=involved,
            reason=event_reason,
            message=record["spec"].get("message") or record["spec"]["action"],
            event_type=event_type,
            now=now,
        )
    return created


async def patch_audit_retention(
    kube: Kube, *, namespace: str | None, now: dt.datetime, max_age: dt.timedelta, max_count: int
) -> int:
    """Delete records past retention in ``namespace`` (all namespaces if None); return how many."""
    records = await kube.list(AUDIT, namespace)
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_namespace.setdefault(record["metadata"]["namespace"], []).append(record)
    deleted = 0
    for ns, items in by_namespace.items():
        for name in decide_audit_retention(items, now=now, max_age=max_age, max_count=max_count):
            await kube.delete(AUDIT, name, namespace=ns)
            deleted += 1
    return deleted

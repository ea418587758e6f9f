"""Builds AuditRecord objects and decides which ones retention removes. Pure.

An audit record holds names, revisions and content hashes only. Callers pass no
secret material in; :func:`build_audit_record` also refuses detail keys that name one,
so a careless caller fails loudly in tests instead of leaking quietly.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from helmhive.api.audit import AuditAction, AuditActor, AuditObject, AuditRecordSpec, AuditState
from helmhive.api.kinds import API_VERSION

__all__ = ["OPERATOR_ACTOR", "build_audit_record", "check_audit_details", "decide_audit_retention"]

OPERATOR_ACTOR = AuditActor(username="helmhive-operator")
_SECRETISH = re.compile(r"(token|secret|password|credential|api[-_]?key|session[-_]?id)", re.IGNORECASE)
LABEL_ACTION = "helmhive.dev/audit-action"
LABEL_KIND = "helmhive.dev/audit-object-kind"
LABEL_NAME_HASH = "helmhive.dev/audit-object"


def _name_hash(kind: str, name: str) -> str:
    return hashlib.sha256(f"{kind}/{name}".encode()).hexdigest()[:16]


def check_audit_details(details: Mapping[str, str] | None) -> None:
    """Refuse detail keys that name secret material (raises ValueError): names and hashes only."""
    for key in details or {}:
        if _SECRETISH.search(key) and not key.lower().endswith(("hash", "generation", "ref", "name")):
            raise ValueError(f"audit detail {key!r} looks like secret material; audit names and hashes only")


def build_audit_record(
    *,
    action: AuditAction,
    obj: Mapping[str, Any],
    actor: AuditActor = OPERATOR_ACTOR,
    before: AuditState | None = None,
    after: AuditState | None = None,
    message: str = "",
    details: Mapping[str, str] | None = None,
    now: dt.datetime,
    namespace: str | None = None,
) -> dict[str, Any]:
    """Return an AuditRecord manifest about ``obj`` (a Kubernetes object as a dict)."""
    check_audit_details(details)
    meta = obj.get("metadata", {})
    kind = str(obj.get("kind", ""))
    name = str(meta.get("name", ""))
    spec = AuditRecordSpec(
        action=action,
        actor=actor,
        object=AuditObject(
            api_version=str(obj.get("apiVersion", API_VERSION)),
            kind=kind,
            namespace=meta.get("namespace"),
            name=name,
            uid=meta.get("uid"),
        ),
        time=now,
        before=before,
        after=after,
        message=message[:1024],
        details=dict(details or {}),
    )
    prefix = f"{kind.lower()}-{name}"[:40].rstrip("-.") + "-"
    return {
        "apiVersion": API_VERSION,
        "kind": "AuditRecord",
        "metadata": {
            "generateName": prefix,
            "namespace": namespace or meta.get("namespace"),
            "labels": {
                LABEL_ACTION: action.value,
                LABEL_KIND: kind.lower()[:63],
                LABEL_NAME_HASH: _name_hash(kind, name),
            },
        },
        "spec": spec.to_wire(),
    }


def decide_audit_retention(
    records: Sequence[Mapping[str, Any]], *, now: dt.datetime, max_age: dt.timedelta, max_count: int
) -> list[str]:
    """Return the names of records to delete: older than ``max_age``, or beyond the newest ``max_count``."""

    def when(record: Mapping[str, Any]) -> dt.datetime:
        raw = str(record.get("spec", {}).get("time", "1970-01-01T00:00:00Z")).replace("Z", "+00:00")
        return dt.datetime.fromisoformat(raw)

    ordered = sorted(records, key=lambda r: (when(r), r["metadata"]["name"]), reverse=True)
    doomed = [r for i, r in enumerate(ordered) if i >= max_count or now - when(r) > max_age]
    return sorted(r["metadata"]["name"] for r in doomed)

"""The audit of session resets: which binding was reset, how, and by whom the API server said. Pure.

A binding is reset when its next job must start a fresh chain:

- **its ``status.resets`` grows** (``helmhive sessions reset``, or ``kubectl patch
  --subresource=status`` by anyone RBAC lets write it). The ``helmhive-audit-trail`` admission
  policy keeps the count honest: it never goes down, and turning ``stored`` off needs it to go up;
- **it is deleted** (the runner's next job on that key creates a new binding, with nothing stored).

The actor is the user the API server authenticated for the request that made the change, as the
operator's admission webhook saw it (:func:`actor_from_userinfo`), never what a client wrote.
A change the webhook did not see (it was unreachable, or the operator restarted between the
request and the watch event) is recorded with the actor ``unknown`` and ``actorSource:
notWitnessed``: said, not guessed.

Each reset has one deterministic AuditRecord name -- ``sessionbinding-<name>-<uid8>-reset-<count>``
for a count, ``…-deleted`` for the deletion -- so writing it again is a harmless 409 and a reset
is recorded exactly once. The uid keeps a re-created binding of the same name apart.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.audit import AuditAction, AuditActor, AuditState
from helmhive.policy.audit.records import build_audit_record

__all__ = [
    "UNKNOWN_ACTOR",
    "ActorSource",
    "ResetToAudit",
    "actor_from_userinfo",
    "build_session_deleted_audit",
    "build_session_reset_audit",
    "decide_reset_audits",
    "deleted_audit_name",
    "reset_audit_name",
    "reset_count",
    "resets_of",
]

UNKNOWN_ACTOR = AuditActor(username="unknown")
_MAX_RECORDS_PER_CHANGE = 16


class ActorSource(enum.StrEnum):
    """Where a SessionReset record's actor came from."""

    ADMISSION = "admission"
    """The request's authenticated user, as the operator's admission webhook saw it."""
    NOT_WITNESSED = "notWitnessed"
    """The webhook did not see the request; the actor is ``unknown``."""


def actor_from_userinfo(userinfo: Mapping[str, Any]) -> AuditActor | None:
    """The AdmissionReview's ``userInfo`` as an actor (bounded); None without a username."""
    username = str(userinfo.get("username") or "")[:256]
    if not username:
        return None
    groups = [str(g)[:256] for g in list(userinfo.get("groups") or [])[:16]]
    uid = str(userinfo.get("uid") or "")[:128] or None
    return AuditActor(username=username, uid=uid, groups=groups)


def reset_count(raw: Any) -> int:
    """A ``status.resets`` value as a count (0 when absent or not a number)."""
    try:
        return max(int(raw or 0), 0)
    except (TypeError, ValueError):
        return 0


def resets_of(body: Mapping[str, Any] | None) -> int:
    """``status.resets`` of a SessionBinding (0 when absent or not a number)."""
    return reset_count(((body or {}).get("status") or {}).get("resets"))


def _prefix(binding: str, uid: str) -> str:
    return f"sessionbinding-{binding[:200]}-{uid[:8]}"


def reset_audit_name(binding: str, uid: str, count: int) -> str:
    """The AuditRecord name of reset number ``count`` of one binding."""
    return f"{_prefix(binding, uid)}-reset-{count}"


def deleted_audit_name(binding: str, uid: str) -> str:
    """The AuditRecord name of one binding's deletion."""
    return f"{_prefix(binding, uid)}-deleted"


@dataclass(frozen=True, kw_only=True)
class ResetToAudit:
    """One reset to record: its count, the count before it, and who made it (if the webhook saw it)."""

    count: int
    previous: int | None
    """The count this reset started from; None when unknown (the binding was first seen reset)."""
    actor: AuditActor | None


def decide_reset_audits(*, before: int | None, after: int, witnessed: Mapping[int, AuditActor]) -> list[ResetToAudit]:
    """The resets to record when ``status.resets`` went from ``before`` to ``after``.

    One record for ``after`` always (with its actor if witnessed), and one for each count in
    between that the webhook saw set by a request of its own: two resets that reached the
    operator as one change (or while it was busy) are two records, each with its actor.
    ``before`` None means unknown (the binding is seen for the first time). Nothing when the
    count did not grow; at most 16 records for one change, the newest.
    """
    if after <= 0 or (before is not None and after <= before):
        return []
    floor = 0 if before is None else before
    between = sorted(k for k in witnessed if floor < k < after)
    chain = [*between, after]
    previous = dict(zip(chain, [before, *chain[:-1]], strict=True))
    return [
        ResetToAudit(count=k, previous=previous[k], actor=witnessed.get(k)) for k in chain[-_MAX_RECORDS_PER_CHANGE:]
    ]


def _binding_details(binding: Mapping[str, Any]) -> dict[str, str]:
    spec = binding.get("spec") or {}
    details = {key: str(spec.get(key) or "")[:512] for key in ("workspace", "profile", "provider", "runner", "scope")}
    if spec.get("service"):
        details["service"] = str(spec["service"])[:512]
    return details


def _who(actor: AuditActor | None) -> str:
    return actor.username if actor is not None else "an actor the operator did not witness"


def build_session_reset_audit(*, binding: Mapping[str, Any], reset: ResetToAudit, now: dt.datetime) -> dict[str, Any]:
    """The ``SessionReset`` record of reset number ``reset.count`` of ``binding``."""
    meta = binding.get("metadata") or {}
    name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    details = {
        **_binding_details(binding),
        "via": "status",
        "resets": str(reset.count),
        "resetsBefore": "unknown" if reset.previous is None else str(reset.previous),
        "actorSource": (ActorSource.ADMISSION if reset.actor is not None else ActorSource.NOT_WITNESSED).value,
    }
    record = build_audit_record(
        action=AuditAction.SESSION_RESET,
        obj=binding,
        actor=reset.actor or UNKNOWN_ACTOR,
        before=AuditState(value=f"resets {details['resetsBefore']}"),
        after=AuditState(value=f"resets {reset.count}"),
        message=(
            f"session binding {name} reset (reset {reset.count}) by {_who(reset.actor)}: "
            "its next job starts a fresh session"
        ),
        details=details,
        now=now,
    )
    record["metadata"].pop("generateName", None)
    record["metadata"]["name"] = reset_audit_name(name, uid, reset.count)
    return record


def build_session_deleted_audit(
    *, binding: Mapping[str, Any], actor: AuditActor | None, now: dt.datetime
) -> dict[str, Any]:
    """The ``SessionReset`` record of ``binding``'s deletion (its chain ends with it)."""
    meta = binding.get("metadata") or {}
    name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    stored = bool((binding.get("status") or {}).get("stored"))
    details = {
        **_binding_details(binding),
        "via": "delete",
        "resets": str(resets_of(binding)),
        "actorSource": (ActorSource.ADMISSION if actor is not None else ActorSource.NOT_WITNESSED).value,
    }
    record = build_audit_record(
        action=AuditAction.SESSION_RESET,
        obj=binding,
        actor=actor or UNKNOWN_ACTOR,
        before=AuditState(value="stored" if stored else "empty"),
        after=AuditState(value="deleted"),
        message=(
            f"session binding {name} deleted by {_who(actor)}: "
            "the next job on its key starts a fresh session in a new binding"
        ),
        details=details,
        now=now,
    )
    record["metadata"].pop("generateName", None)
    record["metadata"]["name"] = deleted_audit_name(name, uid)
    return record

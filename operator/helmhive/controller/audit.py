"""Writes AuditRecords (the durable trail) and Events (best effort), and applies retention.

The AuditRecord is the record; the Event is a convenience for ``kubectl describe`` and may
be lost. A failure to write the AuditRecord is raised so Kopf retries the handler, with one
exception: a namespace being deleted refuses new objects for good, and the trail of what it held
goes with it, so a record for a terminating namespace is dropped (and logged) rather than retried
forever, which would hold the deleted object's finalizer and the namespace with it.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from helmhive.api.kinds import kind_by_name
from helmhive.controller.kube.door import Forbidden, Kube, KubeError, NotFound
from helmhive.policy.audit.records import decide_audit_retention

__all__ = ["AUDIT", "ensure_audit", "ensure_audit_unless_terminating", "patch_audit_retention"]

AUDIT = kind_by_name("AuditRecord")
_RETENTION_PAGE = 100  # records a page: a routing batch is at most 256 KiB
log = logging.getLogger(__name__)


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


async def ensure_audit_unless_terminating(
    kube: Kube,
    record: dict[str, Any],
    *,
    involved: dict[str, Any] | None = None,
    event_reason: str | None = None,
    event_type: str = "Normal",
    now: dt.datetime,
) -> bool:
    """:func:`ensure_audit`; False (nothing written) if the record's namespace is being deleted or gone.

    For every record kept in the namespace of what it is about, which can be deleted under it
    (Forbidden while it terminates, NotFound once it is gone); any other refusal is raised as by
    :func:`ensure_audit`.
    """
    namespace = str(record["metadata"]["namespace"])
    try:
        await ensure_audit(kube, record, involved=involved, event_reason=event_reason, event_type=event_type, now=now)
    except (Forbidden, NotFound):
        try:
            terminating = bool((await kube.read_namespace(namespace))["metadata"].get("deletionTimestamp"))
        except NotFound:
            terminating = True  # already gone: the record would have gone with it
        except KubeError:
            terminating = False
        if not terminating:
            raise
        meta = record["metadata"]
        what = meta.get("name") or meta.get("generateName") or record["spec"].get("action")
        log.info("namespace %s is being deleted; audit record %s goes with it", namespace, what)
        return False
    return True


async def patch_audit_retention(
    kube: Kube, *, namespace: str | None, now: dt.datetime, max_age: dt.timedelta, max_count: int
) -> int:
    """Delete records past retention in ``namespace`` (all namespaces if None); return how many.

    Listed page by page, keeping only each record's name and time: routing batches weigh up to
    256 KiB each, and one unpaginated LIST of them all would be held whole.
    """
    by_namespace: dict[str, dict[str, dict[str, Any]]] = {}
    async for page in kube.list_pages(AUDIT, namespace, limit=_RETENTION_PAGE):
        for record in page:
            meta = record["metadata"]
            spec = record.get("spec") or {}
            slim = {"metadata": {"name": meta["name"]}, "spec": {k: spec[k] for k in ("time",) if k in spec}}
            by_namespace.setdefault(meta["namespace"], {})[meta["name"]] = slim
    deleted = 0
    for ns, items in by_namespace.items():
        for name in decide_audit_retention(list(items.values()), now=now, max_age=max_age, max_count=max_count):
            await kube.delete(AUDIT, name, namespace=ns)
            deleted += 1
    return deleted

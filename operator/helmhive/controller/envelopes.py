"""Publishes the envelope catalogue and keeps the cluster's copies equal to the code.

At startup every envelope is created or restored. Afterwards every watch event on an
Envelope is compared with the code: an edited spec is put back (a conditional PUT), a
deleted envelope is recreated, and each restoration is logged and posted as an Event.
The ValidatingAdmissionPolicy in :mod:`helmhive.deploy` stops most edits before they
happen; this is the second line.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import kopf

from helmhive.api.audit import AuditAction, AuditState
from helmhive.api.common import JobKind
from helmhive.api.envelope import EnvelopeSpec
from helmhive.api.kinds import API_VERSION, kind_by_name
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.audit import ensure_audit
from helmhive.controller.kube.door import Conflict, Kube, KubeError, NotFound
from helmhive.controller.runtime import Runtime
from helmhive.policy.audit.records import build_audit_record
from helmhive.policy.conditions import set_condition
from helmhive.policy.envelopes import ENVELOPES, envelope_hash

__all__ = ["build_envelope_object", "decide_envelope_drift", "ensure_envelope", "ensure_envelopes"]

ENVELOPE = kind_by_name("Envelope")
MANAGED_BY = {"app.kubernetes.io/managed-by": "helmhive-operator", "app.kubernetes.io/part-of": "helmhive"}
HASH_ANNOTATION = "helmhive.dev/content-hash"


def build_envelope_object(spec: EnvelopeSpec) -> dict[str, Any]:
    """Return the Envelope object the operator publishes for ``spec``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Envelope",
        "metadata": {
            "name": spec.job_kind.value,
            "labels": dict(MANAGED_BY),
            "annotations": {HASH_ANNOTATION: envelope_hash(spec)},
        },
        "spec": spec.to_wire(),
    }


def decide_envelope_drift(observed: dict[str, Any], desired: EnvelopeSpec) -> list[str]:
    """Return the top-level spec fields (and metadata) that differ from the code, sorted."""
    expected = build_envelope_object(desired)
    drift = sorted(
        key
        for key in {*expected["spec"], *observed.get("spec", {})}
        if observed.get("spec", {}).get(key) != expected["spec"].get(key)
    )
    meta = observed.get("metadata", {})
    if (meta.get("annotations") or {}).get(HASH_ANNOTATION) != expected["metadata"]["annotations"][HASH_ANNOTATION]:
        drift.append("metadata.annotations")
    if any((meta.get("labels") or {}).get(k) != v for k, v in MANAGED_BY.items()):
        drift.append("metadata.labels")
    return drift


def _managers(observed: dict[str, Any]) -> str:
    names = sorted({m.get("manager", "?") for m in observed.get("metadata", {}).get("managedFields") or []})
    return ", ".join(n for n in names if n) or "unknown"


async def _mark_published(kube: Kube, observed: dict[str, Any], spec: EnvelopeSpec, now: dt.datetime) -> None:
    status = observed.get("status") or {}
    update = set_condition(
        status.get("conditions"),
        type=ConditionType.PUBLISHED,
        status=True,
        reason=Reason.MATCHES_CODE,
        message="Matches the envelope defined in the operator's code.",
        generation=observed.get("metadata", {}).get("generation"),
        now=now,
    )
    digest = envelope_hash(spec)
    if not update.changed and status.get("contentHash") == digest:
        return
    patch = {
        "status": {
            "conditions": update.conditions,
            "contentHash": digest,
            "observedGeneration": observed.get("metadata", {}).get("generation"),
        }
    }
    await kube.patch_status(ENVELOPE, spec.job_kind.value, patch)


async def ensure_envelope(
    kube: Kube,
    spec: EnvelopeSpec,
    *,
    observed: dict[str, Any] | None,
    logger: kopf.Logger,
    now: dt.datetime,
    audit_namespace: str | None = None,
) -> str:
    """Create or restore one envelope; return ``created``, ``restored`` or ``unchanged``.

    A restoration is audited in ``audit_namespace`` (the operator's own) when given.
    """
    name = spec.job_kind.value
    if observed is None:
        try:
            observed = await kube.get(ENVELOPE, name)
        except NotFound:
            observed = None
    desired = build_envelope_object(spec)
    if observed is None:
        try:
            created = await kube.create(ENVELOPE, desired)
        except Conflict:
            raise kopf.TemporaryError(f"envelope {name} appeared while creating it", delay=1) from None
        logger.info("published envelope %s", name)
        await _mark_published(kube, created, spec, now)
        return "created"
    drift = decide_envelope_drift(observed, spec)
    if not drift:
        await _mark_published(kube, observed, spec, now)
        return "unchanged"
    body = dict(desired)
    body["metadata"] = {**observed["metadata"], **desired["metadata"]}
    body["metadata"]["labels"] = {**(observed["metadata"].get("labels") or {}), **MANAGED_BY}
    body["metadata"]["annotations"] = {
        **(observed["metadata"].get("annotations") or {}),
        **desired["metadata"]["annotations"],
    }
    body["metadata"].pop("managedFields", None)
    try:
        restored = await kube.replace(ENVELOPE, name, body)
    except (Conflict, NotFound):
        raise kopf.TemporaryError(f"envelope {name} changed while restoring it", delay=1) from None
    editors = _managers(observed)
    logger.warning(
        "restored envelope %s: fields %s differed from the code (field managers: %s)",
        name,
        ", ".join(drift),
        editors,
    )
    await kube.post_event(
        involved=restored,
        reason=Reason.RESTORED,
        message=f"Envelope {name} was edited ({', '.join(drift)}) and restored from code.",
        event_type="Warning",
        now=now,
    )
    if audit_namespace:
        record = build_audit_record(
            action=AuditAction.ENVELOPE_RESTORED,
            obj=restored,
            before=AuditState(hash=str((observed["metadata"].get("annotations") or {}).get(HASH_ANNOTATION, ""))[:80]),
            after=AuditState(hash=envelope_hash(spec)),
            message=f"envelope {name} restored from code; drifted: {', '.join(drift)}"[:1024],
            details={"fieldManagers": editors[:512]},
            now=now,
            namespace=audit_namespace,
        )
        try:
            await ensure_audit(kube, record, now=now)
        except KubeError as err:
            logger.warning("could not audit the restoration of envelope %s: %s", name, err.message)
    await _mark_published(kube, restored, spec, now)
    return "restored"


async def ensure_envelopes(
    kube: Kube, *, logger: kopf.Logger, now: dt.datetime, audit_namespace: str | None = None
) -> dict[str, str]:
    """Publish every envelope in the catalogue; return what happened to each."""
    return {
        kind.value: await ensure_envelope(
            kube, spec, observed=None, logger=logger, now=now, audit_namespace=audit_namespace
        )
        for kind, spec in ENVELOPES.items()
    }


def register(runtime: Runtime) -> None:
    """Register the envelope handlers with Kopf."""

    @kopf.on.startup()
    async def publish_envelopes(logger: kopf.Logger, **_: Any) -> None:
        results = await ensure_envelopes(
            runtime.kube, logger=logger, now=runtime.clock(), audit_namespace=runtime.config.namespace
        )
        logger.info("envelope catalogue published: %s", results)

    @kopf.on.event("helmhive.dev", "v1alpha1", "envelopes")
    async def guard_envelope(event: kopf.RawEvent, logger: kopf.Logger, **_: Any) -> None:
        obj: dict[str, Any] = dict(event.get("object") or {})
        name = obj.get("metadata", {}).get("name", "")
        try:
            spec = ENVELOPES[JobKind(name)]
        except ValueError:
            if event.get("type") != "DELETED":
                logger.warning("envelope %s is not in the code catalogue; deleting it", name)
                await runtime.kube.delete(ENVELOPE, name)
            return
        observed = None if event.get("type") == "DELETED" else obj
        if observed is None:
            logger.warning("envelope %s was deleted; recreating it from code", name)
        await ensure_envelope(
            runtime.kube,
            spec,
            observed=observed,
            logger=logger,
            now=runtime.clock(),
            audit_namespace=runtime.config.namespace,
        )

"""MemoryRecords: the ``Active`` condition, expiry on time, and the audit of every change.

A per-record Kopf daemon keeps ``Active`` true to :func:`decide_memory_active` and the
Workspace scope check: it wakes at least every second (pure arithmetic, no API call) and
patches only when the condition changes, so a record turns inactive at its ``expiresAt``
without anyone touching it, also after an operator restart. Create, update, expiry and
delete are audited (delete through a finalizer, so it cannot be missed).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from helmhive.api.audit import AuditAction, AuditState
from helmhive.api.kinds import kind_by_name
from helmhive.api.memory import MemoryRecordSpec, WorkspaceSpec
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.audit import ensure_audit
from helmhive.controller.kube import NotFound
from helmhive.controller.profiles import actor_from
from helmhive.controller.runtime import Runtime
from helmhive.policy.audit import build_audit_record
from helmhive.policy.conditions import find_condition, set_condition
from helmhive.policy.memory import decide_memory_active, decide_memory_scope

__all__ = ["memory_hash", "register"]

MEMORY = kind_by_name("MemoryRecord")
WORKSPACE = kind_by_name("Workspace")
_SCOPE_RECHECK_SECONDS = 30.0


def memory_hash(spec: Mapping[str, Any]) -> str:
    canonical = json.dumps(dict(spec), sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


async def _scope_problem(runtime: Runtime, spec: MemoryRecordSpec, namespace: str) -> tuple[Reason, str] | None:
    try:
        workspace = await runtime.kube.get(WORKSPACE, spec.workspace, namespace=namespace)
    except NotFound:
        return Reason.WORKSPACE_NOT_FOUND, f"workspace {spec.workspace} does not exist in {namespace}"
    try:
        parsed = WorkspaceSpec.model_validate(workspace.get("spec") or {})
    except ValidationError:
        return Reason.WORKSPACE_NOT_FOUND, f"workspace {spec.workspace} has an invalid spec"
    violations = decide_memory_scope(record=spec, workspace=parsed)
    return (violations[0].reason, violations[0].message) if violations else None


async def reconcile_memory(
    runtime: Runtime, body: Mapping[str, Any], logger: kopf.Logger, scope: tuple[Reason, str] | None
) -> float | None:
    """Patch ``Active`` if it changed; audit an expiry; return seconds until the next transition."""
    meta = body["metadata"]
    status = dict(body.get("status") or {})
    now = runtime.clock()
    try:
        spec = MemoryRecordSpec.model_validate(dict(body.get("spec") or {}))
    except ValidationError as err:
        active, reason, message, wait = False, Reason.INVALID_SPEC, str(err.errors()[0]["msg"]), None
    else:
        activity = decide_memory_active(record=spec, now=now)
        active, reason, message = activity.active, activity.reason, activity.message
        wait = (activity.next_transition - now).total_seconds() if activity.next_transition else None
        if active and scope is not None:
            active, reason, message = False, scope[0], scope[1]
    previous = find_condition(status.get("conditions"), ConditionType.ACTIVE)
    update = set_condition(
        status.get("conditions"),
        type=ConditionType.ACTIVE,
        status=active,
        reason=reason,
        message=message,
        generation=meta.get("generation"),
        now=now,
    )
    digest = memory_hash(body.get("spec") or {})
    if update.changed or status.get("contentHash") != digest:
        patch: dict[str, Any] = {
            "conditions": update.conditions,
            "contentHash": digest,
            "observedGeneration": meta.get("generation"),
        }
        if reason == Reason.EXPIRED:
            patch["expiredAt"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        await runtime.kube.patch_status(MEMORY, meta["name"], {"status": patch}, namespace=meta["namespace"])
        if reason == Reason.EXPIRED and (previous or {}).get("reason") != Reason.EXPIRED:
            record = build_audit_record(
                action=AuditAction.MEMORY_EXPIRED,
                obj=body,
                before=AuditState(hash=digest, value="Active"),
                after=AuditState(hash=digest, value="Expired"),
                message=f"memory record {meta['name']} expired",
                now=now,
            )
            await ensure_audit(runtime.kube, record, involved=dict(body), event_reason="Expired", now=now)
            logger.info("memory record %s/%s expired", meta["namespace"], meta["name"])
    return wait


async def _audit_change(
    runtime: Runtime, body: Mapping[str, Any], action: AuditAction, before: str | None, after: str | None
) -> None:
    now = runtime.clock()
    record = build_audit_record(
        action=action,
        obj=body,
        actor=actor_from(body["metadata"]),
        before=AuditState(hash=before) if before else None,
        after=AuditState(hash=after) if after else None,
        message=f"memory record {body['metadata']['name']}: {action.value}",
        details={"workspace": str((body.get("spec") or {}).get("workspace", ""))[:253]},
        now=now,
    )
    await ensure_audit(runtime.kube, record, involved=dict(body), event_reason=action.value, now=now)


def register(runtime: Runtime) -> None:
    """Register the memory record handlers."""

    @kopf.on.create("helmhive.dev", "v1alpha1", "memoryrecords")
    async def memory_created(body: kopf.Body, **_: Any) -> None:
        await _audit_change(runtime, body, AuditAction.MEMORY_CREATED, None, memory_hash(body.get("spec") or {}))

    @kopf.on.update("helmhive.dev", "v1alpha1", "memoryrecords", field="spec")
    async def memory_updated(body: kopf.Body, old: Any, new: Any, **_: Any) -> None:
        await _audit_change(runtime, body, AuditAction.MEMORY_UPDATED, memory_hash(old or {}), memory_hash(new or {}))

    @kopf.on.delete("helmhive.dev", "v1alpha1", "memoryrecords")
    async def memory_deleted(body: kopf.Body, **_: Any) -> None:
        await _audit_change(runtime, body, AuditAction.MEMORY_DELETED, memory_hash(body.get("spec") or {}), None)

    @kopf.daemon("helmhive.dev", "v1alpha1", "memoryrecords", cancellation_timeout=5.0)
    async def keep_active(stopped: kopf.DaemonStopped, body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        checked_hash: str | None = None
        checked_at = 0.0
        scope: tuple[Reason, str] | None = None
        loop = asyncio.get_running_loop()
        while not stopped:
            digest = memory_hash(body.get("spec") or {})
            if digest != checked_hash or loop.time() - checked_at > _SCOPE_RECHECK_SECONDS:
                try:
                    spec = MemoryRecordSpec.model_validate(dict(body.get("spec") or {}))
                    scope = await _scope_problem(runtime, spec, body["metadata"]["namespace"])
                except ValidationError:
                    scope = None
                checked_hash, checked_at = digest, loop.time()
            wait = await reconcile_memory(runtime, body, logger, scope)
            await stopped.wait(min(1.0, max(0.05, wait)) if wait is not None else 1.0)

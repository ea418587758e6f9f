"""The audit records of a routing decision, built from what the job's status says was written. Pure.

One decision about one run of a job gives at most two records, each with a *deterministic name*
(``agentjob-<job>-<uid8>-<suffix>``, with ``-<attempt>`` appended for a re-run after a lost
runner), so writing them again after a crash is a harmless 409 and a run never has two:

- ``JobRouted`` (suffix ``routed``): runner, pool, provider, model and its source, effort,
  mapping, credential generation, profile revision, memory count, avoided provider;
- ``MemoryInjected`` (suffix ``memory``), *selected at queue time*: the MemoryRecord names routing
  chose, when there are any (``after`` and the message say "selected at queue time");
- ``JobRoutingFailed`` (suffix ``routing-failed``): the reason, for a job that failed closed.

A job still waiting for capacity has no record yet. What the runner then injected at run time
is a second ``MemoryInjected`` record (:mod:`helmhive.policy.memory_audit`). Names and hashes
only: nothing here copies instructions, memory text or any credential.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from helmhive.api.audit import AuditAction, AuditState
from helmhive.api.kinds import API_VERSION
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.audit import build_audit_record
from helmhive.policy.conditions import find_condition

__all__ = ["audit_name", "build_routing_audits"]


def audit_name(job_name: str, uid: str, suffix: str, attempt: int = 0) -> str:
    """The AuditRecord name for one kind of routing record about one run of one job.

    A job re-queued after its runner was lost (``status.attempts`` > 0) is routed again, and that
    decision is a record of its own: the attempt is part of the name from the first re-run on (the
    first run keeps the plain name), so the second assignment is not a 409 against the first.
    """
    base = f"agentjob-{job_name[:200]}-{uid[:8]}-{suffix}"
    return base if attempt <= 0 else f"{base}-{attempt}"


def _named(record: dict[str, Any], name: str) -> dict[str, Any]:
    record["metadata"].pop("generateName", None)
    record["metadata"]["name"] = name
    return record


def build_routing_audits(*, job: Mapping[str, Any], now: dt.datetime) -> list[dict[str, Any]]:
    """The routing audit records for ``job`` as its status now stands (none while it waits)."""
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    ref = {
        "apiVersion": API_VERSION,
        "kind": "AgentJob",
        "metadata": {"name": name, "namespace": meta.get("namespace"), "uid": uid},
    }
    routed = find_condition(status.get("conditions"), ConditionType.ROUTED) or {}
    message = str(routed.get("message") or "")
    routing = status.get("routing") or {}
    assignment = status.get("assignment")
    attempt = int(status.get("attempts") or 0)
    if assignment:
        memory_ids = [str(m) for m in assignment.get("memoryIds") or []]
        details = {
            "runner": str(assignment.get("runner", "")),
            "runnerNamespace": str(assignment.get("runnerNamespace") or meta.get("namespace") or ""),
            "pool": str(assignment.get("pool", "")),
            "provider": str(assignment.get("provider", "")),
            "model": str(assignment.get("model", "")),
            "modelSource": str(assignment.get("modelSource", "")),
            "mappingIndex": str(assignment.get("mappingIndex", "")),
            "credentialGeneration": str(assignment.get("credentialGeneration", 0)),
            "profileRevision": str((status.get("profile") or {}).get("revision", ""))[:512],
            "memoryCount": str(len(memory_ids)),
        }
        if assignment.get("reasoningEffort"):
            details["reasoningEffort"] = str(assignment["reasoningEffort"])
        if routing.get("avoidedProvider"):
            details["avoidedProvider"] = str(routing["avoidedProvider"])
        records = [
            _named(
                build_audit_record(
                    action=AuditAction.JOB_ROUTED,
                    obj=ref,
                    after=AuditState(value=f"{details['provider']}/{details['model']}"[:256]),
                    message=message,
                    details=details,
                    now=now,
                ),
                audit_name(name, uid, "routed", attempt),
            )
        ]
        if memory_ids:
            records.append(
                _named(
                    build_audit_record(
                        action=AuditAction.MEMORY_INJECTED,
                        obj=ref,
                        after=AuditState(value=f"{len(memory_ids)} records selected at queue time"),
                        message=(
                            f"memory records selected at queue time: {', '.join(memory_ids)} "
                            "(the runner re-checks each when the job starts; its report is the "
                            f"{audit_name(name, uid, 'memory-run', attempt)} record)"
                        )[:1024],
                        details={
                            "memoryIds": ",".join(memory_ids)[:512],
                            "workspace": str((job.get("spec") or {}).get("workspace", "")),
                        },
                        now=now,
                    ),
                    audit_name(name, uid, "memory", attempt),
                )
            )
        return records
    reason = str(routed.get("reason") or "")
    if routed.get("status") == "False" and reason != Reason.WAITING_FOR_CAPACITY.value and routing:
        return [
            _named(
                build_audit_record(
                    action=AuditAction.JOB_ROUTING_FAILED,
                    obj=ref,
                    after=AuditState(value=reason[:256]),
                    message=message,
                    details={"reason": reason[:512], "consideredRunners": str(routing.get("consideredRunners", 0))},
                    now=now,
                ),
                audit_name(name, uid, "routing-failed", attempt),
            )
        ]
    return []

"""The run-time ``MemoryInjected`` record: what the runner actually injected, written by the operator.

The runner re-checks each MemoryRecord named at queue time when it starts the job and reports
what it injected and what it dropped, and why, in ``status.result.memory`` (with
``Running=True``). One Kopf handler on changes of that field builds the record
(:func:`helmhive.policy.memory_audit.build_memory_report_audit`) and creates it. Kopf keeps the
last handled report in the job's ``last-handled-configuration`` annotation, so a report written
while the operator was down is recorded when it starts, and one recorded is not recorded again;
the record's name is deterministic per job and attempt, so a retry is a harmless 409.

The queue-time record (what routing chose) is written by :mod:`helmhive.controller.routing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from helmhive.api.kinds import GROUP, VERSION
from helmhive.controller.audit import ensure_audit
from helmhive.controller.kube import Conflict
from helmhive.controller.runtime import Runtime
from helmhive.policy.memory_audit import build_memory_report_audit

__all__ = ["ensure_memory_report_audit", "register"]


async def ensure_memory_report_audit(runtime: Runtime, job: Mapping[str, Any]) -> bool:
    """Record the memory ``job``'s runner reported; False if there is none or it was recorded before."""
    now = runtime.clock()
    record = build_memory_report_audit(job=job, now=now)
    if record is None:
        return False
    meta = job.get("metadata") or {}
    involved = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentJob",
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")},
    }
    try:
        await ensure_audit(runtime.kube, record, involved=involved, event_reason="MemoryInjected", now=now)
    except Conflict:
        return False
    return True


def register(runtime: Runtime) -> None:
    """Register the handler that audits each runner's memory report."""

    @kopf.on.update(GROUP, VERSION, "agentjobs", id="memory-report", field="status.result.memory")
    async def memory_reported(body: kopf.Body, new: Any, **_: Any) -> None:
        if new:
            await ensure_memory_report_audit(runtime, body)

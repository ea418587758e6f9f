"""The run-time ``MemoryInjected`` record: what the runner actually injected, written by the operator.

The runner re-checks each MemoryRecord named at queue time when it starts the job and reports
what it injected and what it dropped, and why, in ``status.result.memory`` (with
``Running=True``). An event handler on AgentJobs builds the record
(:func:`helmhive.policy.memory.injected.build_memory_report_audit`) and creates it.

It is one step of the operator's AgentJob event handler (:class:`~helmhive.controller.runtime.JobEvents`).
Its name is deterministic per job and attempt. The handler remembers the names it recorded (or
found) in memory, so later events of the same job cost nothing; a name it has not seen since it
started (a report written while the operator was down, or before a restart) is read first and
created only if missing. An event handler rather than Kopf's ``on.update``: that one would make
Kopf patch its last-handled-configuration annotation onto every job, a mutating call per job.

The queue-time record (what routing chose) is written by :mod:`helmhive.controller.router.handlers`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.door import Conflict, NotFound
from helmhive.controller.runtime import Runtime
from helmhive.policy.memory.injected import build_memory_report_audit

__all__ = ["MemoryReports", "ensure_memory_report_audit", "register"]

AUDIT = kind_by_name("AuditRecord")
_REMEMBERED = 65536


async def ensure_memory_report_audit(runtime: Runtime, job: Mapping[str, Any], *, check_first: bool = False) -> bool:
    """Record the memory ``job``'s runner reported; False if there is none or it was recorded before."""
    now = runtime.clock()
    record = build_memory_report_audit(job=job, now=now)
    if record is None:
        return False
    if check_first:
        try:
            await runtime.kube.get(AUDIT, record["metadata"]["name"], namespace=record["metadata"]["namespace"])
            return False
        except NotFound:
            pass
    meta = job.get("metadata") or {}
    involved = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentJob",
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")},
    }
    try:
        # A namespace being deleted refuses new records for good; its trail goes with it.
        return await ensure_audit_unless_terminating(
            runtime.kube, record, involved=involved, event_reason="MemoryInjected", now=now
        )
    except Conflict:
        return False


class MemoryReports:
    """Which reports this process has recorded (bounded; the oldest are forgotten first)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.recorded: OrderedDict[str, None] = OrderedDict()

    async def observe(self, body: Mapping[str, Any]) -> None:
        record = build_memory_report_audit(job=body, now=self.runtime.clock())
        if record is None:
            return
        name = f"{record['metadata']['namespace']}/{record['metadata']['name']}"
        if name in self.recorded:
            return
        await ensure_memory_report_audit(self.runtime, body, check_first=True)
        self.recorded[name] = None
        if len(self.recorded) > _REMEMBERED:
            self.recorded.popitem(last=False)


def register(runtime: Runtime) -> MemoryReports:
    """Register the handler that audits each runner's memory report."""
    reports = MemoryReports(runtime)

    async def memory_reported(event_type: str | None, body: Mapping[str, Any]) -> None:
        if event_type != "DELETED" and ((body.get("status") or {}).get("result") or {}).get("memory"):
            await reports.observe(body)

    runtime.job_events.subscribe("memory-report", memory_reported)

    return reports

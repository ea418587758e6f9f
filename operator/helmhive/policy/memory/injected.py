"""The run-time ``MemoryInjected`` record: what the runner reported it injected, and dropped. Pure.

Routing writes ``MemoryInjected`` with the records *selected at queue time*
(:mod:`helmhive.policy.audit.routing`, suffix ``memory``). When the runner starts the job it
re-checks each one and reports what it injected and what it dropped, and why
(``status.result.memory``). :func:`build_memory_report_audit` turns that report into a second
``MemoryInjected`` record, *injected at run time*, with the deterministic name
``agentjob-<job>-<uid8>-memory-run`` (``memory-run-<n>`` for re-run attempt ``n``): the record
that says what the agent was told. Names only: never memory text.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from helmhive.api.audit import AuditAction, AuditState
from helmhive.api.kinds import API_VERSION
from helmhive.policy.audit.records import build_audit_record
from helmhive.policy.audit.routing import audit_name

__all__ = ["build_memory_report_audit", "memory_report_audit_name"]


def memory_report_audit_name(job_name: str, uid: str, attempt: int) -> str:
    """The name of the run-time ``MemoryInjected`` record of one attempt of one job."""
    return audit_name(job_name, uid, "memory-run" if attempt <= 0 else f"memory-run-{attempt}")


def _joined(items: list[str], limit: int = 512) -> str:
    text = ",".join(items)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def build_memory_report_audit(*, job: Mapping[str, Any], now: dt.datetime) -> dict[str, Any] | None:
    """The run-time ``MemoryInjected`` record from the runner's ``status.result.memory``; None without one.

    It names the records injected, each record dropped with its reason, the records chosen at
    queue time, the runner and the attempt. A report with nothing injected and nothing dropped
    (no records were named) gives no record.
    """
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    report = (status.get("result") or {}).get("memory")
    if not isinstance(report, Mapping):
        return None
    injected = [str(n) for n in report.get("injected") or []]
    dropped = [(str(d.get("name", "")), str(d.get("reason", ""))) for d in report.get("dropped") or []]
    if not injected and not dropped:
        return None
    name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    attempt = int(status.get("attempts") or 0)
    assignment = status.get("assignment") or {}
    runner = str(assignment.get("runner", ""))
    ref = {
        "apiVersion": API_VERSION,
        "kind": "AgentJob",
        "metadata": {"name": name, "namespace": meta.get("namespace"), "uid": uid},
    }
    drops = [f"{n} ({r})" for n, r in dropped]
    message = f"runner {runner} injected {len(injected)} memory record(s) at run time" + (
        f": {', '.join(injected)}" if injected else ""
    )
    if drops:
        message += f"; dropped {', '.join(drops)}"
    details = {
        "injected": _joined(injected),
        "dropped": _joined([f"{n}:{r}" for n, r in dropped]),
        "selected": _joined([str(m) for m in assignment.get("memoryIds") or []]),
        "runner": runner[:512],
        "attempt": str(attempt),
        "workspace": str((job.get("spec") or {}).get("workspace", ""))[:512],
    }
    record = build_audit_record(
        action=AuditAction.MEMORY_INJECTED,
        obj=ref,
        after=AuditState(value=f"{len(injected)} injected, {len(dropped)} dropped at run time"),
        message=message[:1024],
        details=details,
        now=now,
    )
    record["metadata"].pop("generateName", None)
    record["metadata"]["name"] = memory_report_audit_name(name, uid, attempt)
    return record

"""The console's page models: what each page shows, built from the objects the API server returned. Pure.

Each ``build_*`` function takes plain objects (dicts as the API server sends them, or the
``explain-routing`` answer) and returns a frozen dataclass of strings and lists; the HTML
(:mod:`helmhive.console.html`) and the JSON answers are made from those, never from the objects
themselves. So a page shows only the fields named here: a credential, a Secret or a session
binding's native session id can reach the browser only if a field below names it, and none does
(the session binding is shown by its object name and mode only).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "JobPage",
    "Overview",
    "Row",
    "as_text",
    "build_job",
    "build_memory_row",
    "build_overview",
    "condition",
    "format_age",
    "get_path",
    "object_ref",
]

Row = dict[str, str]


def get_path(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def as_text(value: Any) -> str:
    return "" if value is None else str(value)


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    """The object's condition of type ``ctype`` (an empty dict when it has none)."""
    for cond in get_path(obj, "status", "conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == ctype:
            return cond
    return {}


def _cond_text(obj: dict[str, Any], ctype: str) -> str:
    cond = condition(obj, ctype)
    if not cond:
        return ""
    return f"{cond.get('status', '?')} {cond.get('reason', '')}".strip()


def format_age(stamp: Any, now: dt.datetime) -> str:
    """``3m ago`` for an RFC 3339 time, or the text as it was when it is not one."""
    if not stamp:
        return ""
    try:
        when = dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return as_text(stamp)
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def object_ref(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return as_text(meta.get("namespace")), as_text(meta.get("name"))


# The overview ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Overview:
    namespace: str
    pools: list[Row]
    runners: list[Row]
    jobs_by_state: dict[str, list[Row]]
    changes: list[Row]
    problems: list[str] = field(default_factory=list)


def build_pool_row(pool: dict[str, Any]) -> Row:
    ns, name = object_ref(pool)
    ready = condition(pool, "Ready")
    return {
        "namespace": ns,
        "name": name,
        "provider": as_text(get_path(pool, "spec", "provider")),
        "replicas": as_text(get_path(pool, "spec", "replicas")),
        "mode": as_text(get_path(pool, "spec", "execution", "mode") or "InRunner"),
        "ready": _cond_text(pool, "Ready"),
        "message": as_text(ready.get("message")),
    }


def build_runner_row(runner: dict[str, Any], now: dt.datetime) -> Row:
    ns, name = object_ref(runner)
    status = runner.get("status") or {}
    report = status.get("report") or {}
    auth = report.get("authentication") or {}
    qualified = condition(runner, "Qualified")
    qual = status.get("qualification") or {}
    sandbox = report.get("sandbox") or {}
    qualification = ""
    if qual:
        qualification = f"{as_text(qual.get('state'))} (round {as_text(qual.get('round'))})"
        if qual.get("lastFailure"):
            qualification += f": {qual['lastFailure']}"
    return {
        "namespace": ns,
        "name": name,
        "pool": as_text(get_path(runner, "spec", "poolRef", "name")),
        "control": as_text(status.get("effectiveControlState") or get_path(runner, "spec", "controlState") or ""),
        "reported": as_text(status.get("reportedStatus")),
        "schedulable": _cond_text(runner, "Schedulable"),
        "schedulableMessage": as_text(condition(runner, "Schedulable").get("message")),
        "auth": " ".join(p for p in (as_text(auth.get("state")), format_age(auth.get("verifiedAt"), now)) if p),
        "provider": as_text(report.get("provider")),
        "models": as_text(status.get("models")),
        "capacity": f"{report.get('activeJobs', 0)}/{report.get('concurrency', '?')}" if report else "",
        "credentialIsolation": as_text(report.get("credentialIsolation")),
        "network": as_text(sandbox.get("network")),
        "qualified": _cond_text(runner, "Qualified"),
        "qualifiedMessage": as_text(qualified.get("message")),
        "qualification": qualification,
    }


def build_job_row(job: dict[str, Any]) -> Row:
    ns, name = object_ref(job)
    ready = condition(job, "Ready")
    routed = condition(job, "Routed")
    message = as_text(ready.get("message"))
    if routed and routed.get("status") == "False" and routed.get("message") and routed.get("message") != message:
        message = f"{message} (routing: {routed.get('message')})".strip()
    return {
        "namespace": ns,
        "name": name,
        "kind": as_text(get_path(job, "spec", "jobKind")),
        "state": job_state(job),
        "reason": as_text(ready.get("reason")),
        "message": message,
        "runner": as_text(get_path(job, "status", "assignment", "runner")),
    }


def job_state(job: dict[str, Any]) -> str:
    """A job's state for grouping: Succeeded, Failed (fail-closed included), Running, Waiting or Pending."""
    succeeded = condition(job, "Succeeded").get("status")
    if succeeded == "True":
        return "Succeeded"
    if succeeded == "False" or condition(job, "Stalled").get("status") == "True":  # Stalled: failed closed
        return "Failed"
    if condition(job, "Running").get("status") == "True":
        return "Running"
    return "Waiting" if condition(job, "Ready").get("reason") else "Pending"


def build_change_row(change: dict[str, Any]) -> Row:
    ns, name = object_ref(change)
    ready = condition(change, "Ready")
    return {
        "namespace": ns,
        "name": name,
        "title": as_text(get_path(change, "spec", "request", "title")),
        "approval": as_text(get_path(change, "spec", "approval") or "Automatic"),
        "iteration": as_text(get_path(change, "status", "iteration") or 0),
        "state": as_text(ready.get("reason") or "Pending"),
        "message": as_text(ready.get("message")),
    }


def build_overview(
    *,
    namespace: str,
    pools: list[dict[str, Any]],
    runners: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    changes: list[dict[str, Any]],
    now: dt.datetime,
    problems: list[str] | None = None,
) -> Overview:
    """The overview: pools and runners, jobs grouped by state, changes."""
    by_state: dict[str, list[Row]] = {}
    for job in sorted(jobs, key=object_ref):
        row = build_job_row(job)
        by_state.setdefault(row["state"], []).append(row)
    order = ["Failed", "Waiting", "Pending", "Running", "Succeeded"]
    return Overview(
        namespace=namespace,
        pools=[build_pool_row(p) for p in sorted(pools, key=object_ref)],
        runners=[build_runner_row(r, now) for r in sorted(runners, key=object_ref)],
        jobs_by_state={state: by_state[state] for state in order if state in by_state},
        changes=[build_change_row(c) for c in sorted(changes, key=object_ref)],
        problems=list(problems or []),
    )


def build_memory_row(record: dict[str, Any]) -> Row:
    """A MemoryRecord's row: scope, kind, sensitivity, expiry, whether active and why not; never its text."""
    ns, name = object_ref(record)
    spec = record.get("spec") or {}
    scope = spec.get("scope") or {}
    active = condition(record, "Active")
    why = f"{as_text(active.get('reason'))}: {as_text(active.get('message'))}"
    return {
        "namespace": ns,
        "name": name,
        "workspace": as_text(spec.get("workspace")),
        "scope": ":".join(as_text(scope.get(k)) for k in ("type", "service") if scope.get(k)),
        "kind": as_text(spec.get("kind")),
        "sensitivity": as_text(spec.get("sensitivity")),
        "expires": as_text(spec.get("expiresAt")),
        "active": as_text(active.get("status") or "unknown"),
        "why": "" if active.get("status") == "True" else why,
    }


# A job ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobPage:
    namespace: str
    name: str
    row: Row
    conditions: list[Row]
    profile: Row
    snapshot: str
    assignment: Row
    memory_ids: list[str]
    memory_injected: list[str]
    memory_dropped: list[Row]
    session: Row
    result: Row
    decision: Row
    candidates: list[Row]
    routing_note: str
    events: list[Row]


def build_candidates(groups: list[dict[str, Any]]) -> list[Row]:
    """One row per runner of the ``explain-routing`` candidate groups, in table order, with its reason."""
    rows: list[Row] = []
    for group in groups:
        for runner in group.get("runners") or [group.get("runner")]:
            rows.append(
                {
                    "runner": as_text(runner),
                    "namespace": as_text(group.get("namespace")),
                    "provider": as_text(group.get("provider")),
                    "model": as_text(group.get("model")),
                    "reason": as_text(group.get("reason")),
                }
            )
    return rows


def build_job(
    *,
    job: dict[str, Any],
    explanation: dict[str, Any] | None,
    routing_note: str,
    events: list[dict[str, Any]],
    snapshot_text: str,
) -> JobPage:
    """A job's page: its stored state, the fresh routing decision (``explain-routing``'s JSON), its Events."""
    ns, name = object_ref(job)
    status = job.get("status") or {}
    profile = status.get("profile") or {}
    assignment = status.get("assignment") or {}
    session = status.get("session") or {}
    result = status.get("result") or {}
    decision = (explanation or {}).get("decision") or {}
    stored_groups = get_path(status, "routing", "candidates") or []
    groups = decision.get("candidates") if explanation else stored_groups
    failed_reason = condition(job, "Ready")
    return JobPage(
        namespace=ns,
        name=name,
        row=build_job_row(job),
        conditions=[
            {k: as_text(c.get(k)) for k in ("type", "status", "reason", "message")}
            for c in status.get("conditions") or []
            if isinstance(c, dict)
        ],
        profile={"name": as_text(profile.get("name")), "revision": as_text(profile.get("revision"))},
        snapshot=snapshot_text,
        assignment={
            k: as_text(assignment.get(k)) for k in ("runner", "pool", "provider", "model", "modelSource", "assignedAt")
        },
        memory_ids=[as_text(m) for m in assignment.get("memoryIds") or []],
        memory_injected=[as_text(m) for m in get_path(result, "memory", "injected") or []],
        memory_dropped=[
            {"name": as_text(d.get("name")), "reason": as_text(d.get("reason"))}
            for d in get_path(result, "memory", "dropped") or []
            if isinstance(d, dict)
        ],
        session={"binding": as_text(session.get("binding")), "mode": as_text(session.get("mode"))},
        result={
            "outcome": as_text(result.get("outcome")),
            "summary": as_text(result.get("summary")),
            "failure": as_text(failed_reason.get("message")) if job_state(job) == "Failed" else "",
        },
        decision={
            "outcome": as_text(decision.get("outcome")),
            "reason": as_text(decision.get("reason")),
            "message": as_text(decision.get("message")),
        },
        candidates=build_candidates(groups or []),
        routing_note=routing_note,
        events=[
            {
                "type": as_text(e.get("type")),
                "reason": as_text(e.get("reason")),
                "message": as_text(e.get("message")),
                "count": as_text(e.get("count") or 1),
            }
            for e in events
        ],
    )

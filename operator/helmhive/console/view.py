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

from helmhive.api.change import ChangeStatus

__all__ = [
    "ChangePage",
    "JobPage",
    "Overview",
    "Row",
    "build_change",
    "build_job",
    "build_overview",
    "condition",
]

Row = dict[str, str]


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    """The object's condition of type ``ctype`` (an empty dict when it has none)."""
    for cond in _get(obj, "status", "conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == ctype:
            return cond
    return {}


def _cond_text(obj: dict[str, Any], ctype: str) -> str:
    cond = condition(obj, ctype)
    if not cond:
        return ""
    return f"{cond.get('status', '?')} {cond.get('reason', '')}".strip()


def _age(stamp: Any, now: dt.datetime) -> str:
    """``3m ago`` for an RFC 3339 time, or the text as it was when it is not one."""
    if not stamp:
        return ""
    try:
        when = dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return _text(stamp)
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _ref(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return _text(meta.get("namespace")), _text(meta.get("name"))


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
    ns, name = _ref(pool)
    ready = condition(pool, "Ready")
    return {
        "namespace": ns,
        "name": name,
        "provider": _text(_get(pool, "spec", "provider")),
        "replicas": _text(_get(pool, "spec", "replicas")),
        "mode": _text(_get(pool, "spec", "execution", "mode") or "InRunner"),
        "ready": _cond_text(pool, "Ready"),
        "message": _text(ready.get("message")),
    }


def build_runner_row(runner: dict[str, Any], now: dt.datetime) -> Row:
    ns, name = _ref(runner)
    status = runner.get("status") or {}
    report = status.get("report") or {}
    auth = report.get("authentication") or {}
    qualified = condition(runner, "Qualified")
    qual = status.get("qualification") or {}
    sandbox = report.get("sandbox") or {}
    qualification = ""
    if qual:
        qualification = f"{_text(qual.get('state'))} (round {_text(qual.get('round'))})"
        if qual.get("lastFailure"):
            qualification += f": {qual['lastFailure']}"
    return {
        "namespace": ns,
        "name": name,
        "pool": _text(_get(runner, "spec", "poolRef", "name")),
        "control": _text(status.get("effectiveControlState") or _get(runner, "spec", "controlState") or ""),
        "reported": _text(status.get("reportedStatus")),
        "schedulable": _cond_text(runner, "Schedulable"),
        "schedulableMessage": _text(condition(runner, "Schedulable").get("message")),
        "auth": " ".join(p for p in (_text(auth.get("state")), _age(auth.get("verifiedAt"), now)) if p),
        "provider": _text(report.get("provider")),
        "models": _text(status.get("models")),
        "capacity": f"{_text(report.get('activeJobs', 0))}/{_text(report.get('concurrency', '?'))}" if report else "",
        "credentialIsolation": _text(report.get("credentialIsolation")),
        "network": _text(sandbox.get("network")),
        "qualified": _cond_text(runner, "Qualified"),
        "qualifiedMessage": _text(qualified.get("message")),
        "qualification": qualification,
    }


def build_job_row(job: dict[str, Any]) -> Row:
    ns, name = _ref(job)
    ready = condition(job, "Ready")
    routed = condition(job, "Routed")
    message = _text(ready.get("message"))
    if routed and routed.get("status") == "False" and routed.get("message") and routed.get("message") != message:
        message = f"{message} (routing: {routed.get('message')})".strip()
    return {
        "namespace": ns,
        "name": name,
        "kind": _text(_get(job, "spec", "jobKind")),
        "state": job_state(job),
        "reason": _text(ready.get("reason")),
        "message": message,
        "runner": _text(_get(job, "status", "assignment", "runner")),
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
    ns, name = _ref(change)
    ready = condition(change, "Ready")
    return {
        "namespace": ns,
        "name": name,
        "title": _text(_get(change, "spec", "request", "title")),
        "approval": _text(_get(change, "spec", "approval") or "Automatic"),
        "iteration": _text(_get(change, "status", "iteration") or 0),
        "state": _text(ready.get("reason") or "Pending"),
        "message": _text(ready.get("message")),
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
    for job in sorted(jobs, key=_ref):
        row = build_job_row(job)
        by_state.setdefault(row["state"], []).append(row)
    order = ["Failed", "Waiting", "Pending", "Running", "Succeeded"]
    return Overview(
        namespace=namespace,
        pools=[build_pool_row(p) for p in sorted(pools, key=_ref)],
        runners=[build_runner_row(r, now) for r in sorted(runners, key=_ref)],
        jobs_by_state={state: by_state[state] for state in order if state in by_state},
        changes=[build_change_row(c) for c in sorted(changes, key=_ref)],
        problems=list(problems or []),
    )


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
                    "runner": _text(runner),
                    "namespace": _text(group.get("namespace")),
                    "provider": _text(group.get("provider")),
                    "model": _text(group.get("model")),
                    "reason": _text(group.get("reason")),
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
    ns, name = _ref(job)
    status = job.get("status") or {}
    profile = status.get("profile") or {}
    assignment = status.get("assignment") or {}
    session = status.get("session") or {}
    result = status.get("result") or {}
    decision = (explanation or {}).get("decision") or {}
    stored_groups = _get(status, "routing", "candidates") or []
    groups = decision.get("candidates") if explanation else stored_groups
    failed_reason = condition(job, "Ready")
    return JobPage(
        namespace=ns,
        name=name,
        row=build_job_row(job),
        conditions=[
            {k: _text(c.get(k)) for k in ("type", "status", "reason", "message")}
            for c in status.get("conditions") or []
            if isinstance(c, dict)
        ],
        profile={"name": _text(profile.get("name")), "revision": _text(profile.get("revision"))},
        snapshot=snapshot_text,
        assignment={
            k: _text(assignment.get(k)) for k in ("runner", "pool", "provider", "model", "modelSource", "assignedAt")
        },
        memory_ids=[_text(m) for m in assignment.get("memoryIds") or []],
        memory_injected=[_text(m) for m in _get(result, "memory", "injected") or []],
        memory_dropped=[
            {"name": _text(d.get("name")), "reason": _text(d.get("reason"))}
            for d in _get(result, "memory", "dropped") or []
            if isinstance(d, dict)
        ],
        session={"binding": _text(session.get("binding")), "mode": _text(session.get("mode"))},
        result={
            "outcome": _text(result.get("outcome")),
            "summary": _text(result.get("summary")),
            "failure": _text(failed_reason.get("message")) if job_state(job) == "Failed" else "",
        },
        decision={
            "outcome": _text(decision.get("outcome")),
            "reason": _text(decision.get("reason")),
            "message": _text(decision.get("message")),
        },
        candidates=build_candidates(groups or []),
        routing_note=routing_note,
        events=[
            {
                "type": _text(e.get("type")),
                "reason": _text(e.get("reason")),
                "message": _text(e.get("message")),
                "count": _text(e.get("count") or 1),
            }
            for e in events
        ],
    )


# A change ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChangePage:
    namespace: str
    name: str
    title: str
    approval_mode: str
    state: Row
    stages: list[Row]
    conditions: list[Row]
    plan: Row
    plan_steps: list[Row]
    approval: Row
    can_approve: bool
    checks: list[Row]
    review: Row
    criteria: list[Row]
    findings: list[Row]
    patch: Row


def build_change(change: dict[str, Any], status: ChangeStatus, runners: dict[str, str] | None = None) -> ChangePage:
    """A change's page from the object and its validated status (``change status``'s model).

    ``runners`` maps a stage job's name to the runner its assignment names (else its pod is shown).
    """
    runners = runners or {}
    ns, name = _ref(change)
    manual = _get(change, "spec", "approval") == "Manual"
    plan, approval, review = status.plan, status.approval, status.review
    approved = approval is not None and plan is not None and approval.digest == plan.digest
    return ChangePage(
        namespace=ns,
        name=name,
        title=_text(_get(change, "spec", "request", "title")),
        approval_mode="Manual" if manual else "Automatic",
        state=build_change_row(change),
        stages=[
            {
                "stage": j.stage.value,
                "iteration": _text(j.iteration),
                "job": j.name,
                "runner": runners.get(j.name) or _text(j.pod),
                "provider": _text(j.provider),
                "model": _text(j.model),
                "outcome": _text(j.outcome or "running"),
            }
            for j in status.jobs
        ],
        conditions=[
            {"type": c.type, "status": c.status.value, "reason": c.reason, "message": c.message}
            for c in status.conditions
        ],
        plan={} if plan is None else {"digest": plan.digest, "summary": plan.summary, "job": plan.job},
        plan_steps=[] if plan is None else [{"title": s.title, "detail": s.detail} for s in plan.steps],
        approval={}
        if approval is None
        else {"by": approval.by, "digest": approval.digest, "at": approval.at.strftime("%Y-%m-%dT%H:%M:%SZ")},
        can_approve=manual and plan is not None and not approved,
        checks=[
            {
                "name": c.name,
                "outcome": c.outcome.value,
                "exit": _text(c.exit_code),
                "seconds": f"{c.duration_seconds:.1f}",
                "tail": c.output_tail,
            }
            for c in status.check_evidence
        ],
        review={}
        if review is None
        else {
            "verdict": review.verdict.value,
            "provider": _text(review.provider),
            "implementationProvider": _text(review.implementation_provider),
            "providerDiffers": {True: "yes", False: "no (fresh context)", None: "unknown"}[review.provider_differs],
            "iteration": _text(review.iteration),
            "findings": _text(len(review.findings)),
            "summary": review.summary,
        },
        criteria=[
            {"criterion": _text(v.criterion + 1), "met": "met" if v.met else "NOT met", "note": _text(v.note)}
            for v in ([] if review is None else review.criteria)
        ],
        findings=[
            {
                "severity": f.severity,
                "where": f"{f.file}:{f.line}" if f.file and f.line is not None else _text(f.file),
                "message": f.message,
            }
            for f in ([] if review is None else review.findings)
        ],
        patch={}
        if status.patch is None
        else {"sha256": status.patch.sha256, "bytes": _text(status.patch.bytes), "files": _text(status.patch.files)},
    )

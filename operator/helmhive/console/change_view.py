"""A change's page model: stages, plan and digest, approval, checks, review and patch summary. Pure.

Built from the Change and its status as ``change status`` validates it (:class:`ChangeStatus`); like
:mod:`helmhive.console.view`, it names every field a page shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from helmhive.api.change import ChangeStatus
from helmhive.console.view import Row, as_text, build_change_row, get_path, object_ref

__all__ = ["ChangePage", "build_change"]


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
    ns, name = object_ref(change)
    manual = get_path(change, "spec", "approval") == "Manual"
    plan, approval, review = status.plan, status.approval, status.review
    approved = approval is not None and plan is not None and approval.digest == plan.digest
    return ChangePage(
        namespace=ns,
        name=name,
        title=as_text(get_path(change, "spec", "request", "title")),
        approval_mode="Manual" if manual else "Automatic",
        state=build_change_row(change),
        stages=[
            {
                "stage": j.stage.value,
                "iteration": as_text(j.iteration),
                "job": j.name,
                "runner": runners.get(j.name) or as_text(j.pod),
                "provider": as_text(j.provider),
                "model": as_text(j.model),
                "outcome": as_text(j.outcome or "running"),
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
                "exit": as_text(c.exit_code),
                "seconds": f"{c.duration_seconds:.1f}",
                "tail": c.output_tail,
            }
            for c in status.check_evidence
        ],
        review={}
        if review is None
        else {
            "verdict": review.verdict.value,
            "provider": as_text(review.provider),
            "implementationProvider": as_text(review.implementation_provider),
            "providerDiffers": {True: "yes", False: "no (fresh context)", None: "unknown"}[review.provider_differs],
            "iteration": as_text(review.iteration),
            "findings": as_text(len(review.findings)),
            "summary": review.summary,
        },
        criteria=[
            {"criterion": as_text(v.criterion + 1), "met": "met" if v.met else "NOT met", "note": as_text(v.note)}
            for v in ([] if review is None else review.criteria)
        ],
        findings=[
            {
                "severity": f.severity,
                "where": f"{f.file}:{f.line}" if f.file and f.line is not None else as_text(f.file),
                "message": f.message,
            }
            for f in ([] if review is None else review.findings)
        ],
        patch={}
        if status.patch is None
        else {
            "sha256": status.patch.sha256,
            "bytes": as_text(status.patch.bytes),
            "files": as_text(status.patch.files),
        },
    )

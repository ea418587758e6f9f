"""The Change controller's decision: from a Change and the jobs it owns to the next action. Pure.

:func:`decide_change` is a function of (the Change, its jobs, whether its Workspace exists,
now). It returns the whole operator-owned status, at most one AgentJob to create, and the
audit records of steps that finished since the status was last written. The Kopf handler
fetches, calls it, and applies the result; a re-run after a crash decides the same thing, and
the jobs' deterministic names (:func:`build_job_name`) make a second create a no-op (409).

The stages run strictly in order, one job at a time::

    planning ─▶ approval gate ─▶ implementation(i) ─▶ review(i) ─┬─▶ done
                                      ▲                          │ request-changes, i < maxIterations
                                      └──────────────────────────┘

Conditions (see ``docs/changes.md`` for every reason):

* ``Planned``: Unknown while the planning job runs; True ``PlanReady``; False with the job's reason.
* ``Approved``: True ``ApprovedAutomatically`` / ``ApprovedManually`` (by the plan's digest);
  False ``AwaitingApproval`` or ``ApprovalDigestMismatch`` (an approval of another plan).
* ``Implemented``: True ``PatchReady``; False with the job's reason (``NoChanges``, ``PatchTooLarge``…).
* ``Checked``: True ``ChecksPassed`` / ``NoChecks``; False ``ChecksFailed``.
* ``Reviewed``: True ``ReviewApproved``; False ``ChangesRequested`` or the job's reason.
* ``Ready``: True only when the review approved and every check passed; otherwise False with
  the step that stops it (``PlanningFailed``, ``ImplementationFailed``, ``ReviewFailed``,
  ``ChangesRequested``, ``ChecksFailed``) or the one under way (``StageRunning``,
  ``AwaitingApproval``, ``WaitingForWorkspace``). A failed stage names its job and the job's reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from helmhive.api.audit import AuditAction, AuditActor
from helmhive.api.change import (
    ApprovalMode,
    ApprovalStatus,
    ChangeJob,
    ChangeSpec,
    ChangeStatus,
    PlanStatus,
    ReviewStatus,
    ReviewVerdict,
)
from helmhive.api.governed import ChangeStage
from helmhive.api.kinds import API_VERSION
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.audit import build_audit_record
from helmhive.policy.change_jobs import (
    LABEL_CHANGE,
    LABEL_STAGE,
    STAGE_KINDS,
    JobState,
    StageJob,
    build_job_name,
    build_label_value,
    parse_plan,
    parse_review,
    view_stage_job,
)
from helmhive.policy.change_prompts import build_stage_prompt
from helmhive.policy.conditions import find_condition, set_condition
from helmhive.policy.routing_audit import audit_name

__all__ = ["AUTOMATIC_APPROVER", "TERMINAL_REASONS", "ChangeDecision", "decide_change"]

AUTOMATIC_APPROVER = "Automatic"
TERMINAL_REASONS = frozenset(
    {
        Reason.REVIEW_APPROVED,
        Reason.CHANGES_REQUESTED,
        Reason.CHECKS_FAILED,
        Reason.PLANNING_FAILED,
        Reason.IMPLEMENTATION_FAILED,
        Reason.REVIEW_FAILED,
        Reason.JOB_MISSING,
        Reason.INVALID_SPEC,
    }
)
"""``Ready`` reasons after which a Change never acts again."""


@dataclass(kw_only=True)
class ChangeDecision:
    """The status to write (operator-owned fields, wire form), the job to create, the audits to record."""

    status: dict[str, Any]
    create: dict[str, Any] | None = None
    audits: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False


@dataclass(kw_only=True)
class _Builder:
    """Accumulates one decision: conditions, status fields, audits."""

    change: Mapping[str, Any]
    spec: ChangeSpec
    previous: ChangeStatus
    now: dt.datetime
    conditions: list[dict[str, Any]]
    status: ChangeStatus = field(default_factory=ChangeStatus)
    audits: list[dict[str, Any]] = field(default_factory=list)
    create: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return str(self.change["metadata"]["name"])

    def cond(self, ctype: ConditionType, value: bool | None, reason: Reason | str, message: str) -> None:
        self.conditions = set_condition(
            self.conditions,
            type=ctype,
            status=value,
            reason=str(reason),
            message=message,
            generation=self.change["metadata"].get("generation"),
            now=self.now,
        ).conditions

    def audit(self, action: AuditAction, key: str, message: str, details: Mapping[str, str], actor: str = "") -> None:
        """Record a finished step once: only when the previous status did not show it yet (see :func:`_recorded`)."""
        meta = self.change["metadata"]
        record = build_audit_record(
            action=action,
            obj={"apiVersion": API_VERSION, "kind": "Change", "metadata": meta},
            actor=AuditActor(username=actor) if actor else AuditActor(username="helmhive-operator"),
            message=message,
            details={k: v[:512] for k, v in details.items() if v},
            now=self.now,
        )
        record["metadata"].pop("generateName", None)
        record["metadata"]["name"] = audit_name(self.name, str(meta.get("uid") or ""), key).replace(
            "agentjob-", "change-", 1
        )
        self.audits.append(record)

    def new_job(self, stage: ChangeStage, iteration: int, **extra: Any) -> None:
        meta = self.change["metadata"]
        name = build_job_name(self.name, stage, iteration)
        prompt = build_stage_prompt(change=self.name, spec=self.spec, stage=stage, iteration=iteration, **extra)
        spec: dict[str, Any] = {
            "workspace": self.spec.workspace,
            "jobKind": STAGE_KINDS[stage].value,
            "request": {"title": f"{self.spec.request.title[:230]} ({stage.value})", "prompt": prompt},
            "source": self.spec.source.to_wire(),
            "change": {"name": self.name, "stage": stage.value, "iteration": iteration},
        }
        if self.spec.service:
            spec["service"] = self.spec.service
        if stage is ChangeStage.IMPLEMENTATION and self.spec.checks:
            spec["checks"] = [c.to_wire() for c in self.spec.checks]
        if stage is ChangeStage.REVIEW and self.status.patch is not None:
            spec["patch"] = self.status.patch.to_wire()
        self.create = {
            "apiVersion": API_VERSION,
            "kind": "AgentJob",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {
                    LABEL_CHANGE: build_label_value(self.name),
                    LABEL_STAGE: stage.value,
                    "app.kubernetes.io/managed-by": "helmhive-operator",
                },
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": "Change",
                        "name": self.name,
                        "uid": meta.get("uid"),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }


def _recorded(previous: ChangeStatus, job: StageJob) -> bool:
    """The previous status already shows this job's outcome (so its audit was already recorded)."""
    return any(j.name == job.name and j.outcome for j in previous.jobs)


def _job_status(job: StageJob) -> ChangeJob:
    done = job.state is not JobState.RUNNING
    return ChangeJob(
        stage=job.stage,
        iteration=job.iteration,
        name=job.name,
        provider=job.provider,
        model=job.model,
        outcome=job.reason[:160] if done and job.reason else None,
    )


def _failed(b: _Builder, job: StageJob, ctype: ConditionType, ready_reason: Reason) -> ChangeDecision:
    why = f"{job.stage.value} job {job.name} ended {job.reason}: {job.message}"[:1024]
    b.cond(ctype, False, job.reason.split(":", 1)[0] or Reason.STAGE_FAILED, why)
    b.cond(ConditionType.READY, False, ready_reason, why)
    if not _recorded(b.previous, job):
        b.audit(
            AuditAction.CHANGE_STAGE_FAILED,
            f"{job.stage.value}-{job.iteration}-failed",
            why,
            {"stage": job.stage.value, "iteration": str(job.iteration), "job": job.name, "reason": job.reason},
        )
    return _done(b, finished=True)


def _done(b: _Builder, *, finished: bool = False) -> ChangeDecision:
    status = b.status.to_wire()
    status["conditions"] = b.conditions
    status["observedGeneration"] = b.change["metadata"].get("generation")
    return ChangeDecision(status=status, create=b.create, audits=b.audits, finished=finished)


def _running(b: _Builder, ctype: ConditionType, stage: ChangeStage, name: str, created: bool) -> ChangeDecision:
    what = f"{stage.value} job {name} " + ("created" if created else "is queued or running")
    b.cond(ctype, None, Reason.STAGE_RUNNING, what)
    b.cond(ConditionType.READY, False, Reason.STAGE_RUNNING, what)
    return _done(b)


def decide_change(
    *,
    change: Mapping[str, Any],
    jobs: Mapping[str, Mapping[str, Any]],
    workspace_exists: bool,
    now: dt.datetime,
) -> ChangeDecision:
    """The next step of one Change (see the module docstring)."""
    raw_status = change.get("status") or {}
    conditions = list(raw_status.get("conditions") or [])
    try:
        spec = ChangeSpec.model_validate(change.get("spec") or {})
    except ValidationError as err:
        first = err.errors()[0]
        where = "spec." + ".".join(str(p) for p in first["loc"])
        conditions = set_condition(
            conditions,
            type=ConditionType.READY,
            status=False,
            reason=Reason.INVALID_SPEC,
            message=f"{where}: {first['msg']}",
            generation=(change.get("metadata") or {}).get("generation"),
            now=now,
        ).conditions
        return ChangeDecision(status={**raw_status, "conditions": conditions}, finished=True)
    try:
        previous = ChangeStatus.model_validate(raw_status)
    except ValidationError:
        previous = ChangeStatus()
    b = _Builder(change=change, spec=spec, previous=previous, now=now, conditions=conditions)
    ready = find_condition(conditions, ConditionType.READY)
    if ready is not None and ready.get("reason") in TERMINAL_REASONS:
        return ChangeDecision(status=dict(raw_status), finished=True)  # final: never re-run a finished Change
    views = {name: v for name, body in jobs.items() if (v := view_stage_job(body)) is not None}
    b.status.jobs = [_job_status(v) for v in sorted(views.values(), key=_order)]
    name = b.name
    missing = [j.name for j in previous.jobs if j.name not in views]
    if missing:
        # Jobs are listed from the API server (not a cache), so a job the status lists and the list lacks is gone.
        b.status = previous.model_copy(deep=True)
        why = f"job {missing[0]} was deleted before the change finished; create a new Change to run it again"
        b.cond(ConditionType.READY, False, Reason.JOB_MISSING, why)
        return _done(b, finished=True)

    # Planning
    plan_job = views.get(build_job_name(name, ChangeStage.PLANNING, 1))
    if plan_job is None:
        if not workspace_exists:
            why = f"workspace {spec.workspace} does not exist yet; planning starts when it appears"
            b.cond(ConditionType.READY, False, Reason.WAITING_FOR_WORKSPACE, why)
            return _done(b)
        b.new_job(ChangeStage.PLANNING, 1)
        return _running(
            b, ConditionType.PLANNED, ChangeStage.PLANNING, build_job_name(name, ChangeStage.PLANNING, 1), True
        )
    if plan_job.state is JobState.RUNNING:
        return _running(b, ConditionType.PLANNED, ChangeStage.PLANNING, plan_job.name, False)
    if plan_job.state is JobState.FAILED:
        return _failed(b, plan_job, ConditionType.PLANNED, Reason.PLANNING_FAILED)
    plan = parse_plan(plan_job)
    if plan is None:
        why = "the plan has no steps or does not match the planning contract"
        return _failed(
            b, _failed_as(plan_job, Reason.INVALID_STAGE_OUTPUT, why), ConditionType.PLANNED, Reason.PLANNING_FAILED
        )
    b.status.plan = plan
    b.cond(ConditionType.PLANNED, True, Reason.PLAN_READY, f"plan {plan.digest} from job {plan_job.name}")
    if previous.plan is None:
        b.audit(
            AuditAction.CHANGE_PLANNED,
            "planned",
            f"plan {plan.digest} with {len(plan.steps)} step(s)",
            {
                "job": plan_job.name,
                "provider": plan_job.provider or "",
                "model": plan_job.model or "",
                "planDigest": plan.digest,
            },
        )

    # Approval gate
    if not _approve(b, plan):
        return _done(b)

    # Implementation, checks and review, one iteration at a time
    b.status.iteration = 0
    findings: ReviewStatus | None = None
    for iteration in range(1, spec.max_iterations + 1):
        b.status.iteration = iteration
        outcome = _iteration(b, views, plan, iteration, findings)
        if isinstance(outcome, ChangeDecision):
            return outcome
        findings = outcome
    raise AssertionError("unreachable: the last iteration always decides")  # pragma: no cover


def _order(job: StageJob) -> tuple[int, int]:
    rank = {ChangeStage.PLANNING: 0, ChangeStage.IMPLEMENTATION: 1, ChangeStage.REVIEW: 2}
    return (job.iteration if job.stage is not ChangeStage.PLANNING else 0, rank[job.stage])


def _approve(b: _Builder, plan: PlanStatus) -> bool:
    """Apply the approval gate; True when the current plan is approved."""
    spec, previous = b.spec, b.previous
    kept = previous.approval if previous.approval is not None and previous.approval.digest == plan.digest else None
    if spec.approval is ApprovalMode.AUTOMATIC:
        by, reason = AUTOMATIC_APPROVER, Reason.APPROVED_AUTOMATICALLY
    elif spec.approved_plan is not None and spec.approved_plan.digest == plan.digest:
        by, reason = spec.approved_plan.by, Reason.APPROVED_MANUALLY
    else:
        command = f"kubectl helmhive change approve {b.name} -n {b.change['metadata'].get('namespace')}"
        if spec.approved_plan is not None:
            why = (
                f"the approval by {spec.approved_plan.by} names plan {spec.approved_plan.digest}, but the plan is "
                f"{plan.digest}; approve the current plan with `{command}`"
            )
            reason_stop = Reason.APPROVAL_DIGEST_MISMATCH
        else:
            why = f"plan {plan.digest} waits for a person's approval: `{command}`"
            reason_stop = Reason.AWAITING_APPROVAL
        b.cond(ConditionType.APPROVED, False, reason_stop, why)
        b.cond(ConditionType.READY, False, reason_stop, why)
        return False
    at = kept.at if kept is not None and kept.by == by else b.now
    b.status.approval = ApprovalStatus(digest=plan.digest, by=by, at=at)
    b.cond(ConditionType.APPROVED, True, reason, f"plan {plan.digest} approved by {by}")
    if kept is None or kept.by != by:
        b.audit(
            AuditAction.CHANGE_APPROVED,
            "approved",
            f"plan {plan.digest} approved by {by}",
            {"planDigest": plan.digest, "approvedBy": by, "mode": spec.approval.value},
            actor=by if by != AUTOMATIC_APPROVER else "",
        )
    return True


def _iteration(
    b: _Builder, views: Mapping[str, StageJob], plan: PlanStatus, iteration: int, findings: ReviewStatus | None
) -> ChangeDecision | ReviewStatus:
    """Decide one iteration; a ReviewStatus means its review requested changes and another may run."""
    impl = _implementation(b, views, plan, iteration, findings)
    if isinstance(impl, ChangeDecision):
        return impl
    return _review(b, views, plan, iteration, impl)


def _failed_as(job: StageJob, reason: Reason, message: str) -> StageJob:
    return replace(job, state=JobState.FAILED, reason=reason.value, message=message)


def _implementation(
    b: _Builder, views: Mapping[str, StageJob], plan: PlanStatus, iteration: int, findings: ReviewStatus | None
) -> ChangeDecision | StageJob:
    """The iteration's implementation and its checks: a decision while it runs or failed, else the finished job."""
    impl_name = build_job_name(b.name, ChangeStage.IMPLEMENTATION, iteration)
    impl = views.get(impl_name)
    if impl is None or impl.state is JobState.RUNNING:
        if impl is None:
            b.new_job(ChangeStage.IMPLEMENTATION, iteration, plan=plan, findings=findings)
        if iteration > 1:
            why = f"waiting for implementation iteration {iteration}"
            b.cond(ConditionType.CHECKED, None, Reason.STAGE_PENDING, why)
        return _running(b, ConditionType.IMPLEMENTED, ChangeStage.IMPLEMENTATION, impl_name, impl is None)
    if impl.state is JobState.SUCCEEDED and impl.patch is None:
        why = "the implementation job succeeded without a patch in status.result.patch"
        impl = _failed_as(impl, Reason.INVALID_STAGE_OUTPUT, why)
    if impl.state is JobState.FAILED or impl.patch is None:
        return _failed(b, impl, ConditionType.IMPLEMENTED, Reason.IMPLEMENTATION_FAILED)
    patch = impl.patch
    b.status.patch, b.status.check_evidence = patch, list(impl.checks)
    b.cond(
        ConditionType.IMPLEMENTED,
        True,
        Reason.PATCH_READY,
        f"iteration {iteration}: patch sha256 {patch.sha256}, {patch.bytes} bytes, {patch.files} file(s), "
        f"from job {impl.name}",
    )
    failing = [c for c in impl.checks if not c.passed]
    if not b.spec.checks:
        b.cond(ConditionType.CHECKED, True, Reason.NO_CHECKS, "the change declares no checks")
    elif failing:
        listed = ", ".join(f"{c.name} ({c.outcome.value})" for c in failing)
        b.cond(ConditionType.CHECKED, False, Reason.CHECKS_FAILED, f"iteration {iteration}: {listed}")
    else:
        b.cond(ConditionType.CHECKED, True, Reason.CHECKS_PASSED, f"iteration {iteration}: {len(impl.checks)} passed")
    if not _recorded(b.previous, impl):
        details = {
            "job": impl.name,
            "iteration": str(iteration),
            "provider": impl.provider or "",
            "model": impl.model or "",
            "patchSha256": patch.sha256,
            "patchBytes": str(patch.bytes),
            "patchFiles": str(patch.files),
        }
        details.update({f"check.{c.name}"[:63]: c.outcome.value for c in impl.checks[:8]})
        message = f"iteration {iteration}: patch sha256 {patch.sha256} ({patch.bytes} bytes)"
        b.audit(AuditAction.CHANGE_IMPLEMENTED, f"implemented-{iteration}", message, details)
    return impl


def _review(
    b: _Builder, views: Mapping[str, StageJob], plan: PlanStatus, iteration: int, impl: StageJob
) -> ChangeDecision | ReviewStatus:
    review_name = build_job_name(b.name, ChangeStage.REVIEW, iteration)
    review = views.get(review_name)
    if review is None:
        b.new_job(ChangeStage.REVIEW, iteration, plan=plan, checks=impl.checks)
        return _running(b, ConditionType.REVIEWED, ChangeStage.REVIEW, review_name, True)
    if review.state is JobState.RUNNING:
        return _running(b, ConditionType.REVIEWED, ChangeStage.REVIEW, review.name, False)
    parsed = parse_review(review, impl) if review.state is JobState.SUCCEEDED else None
    if review.state is JobState.SUCCEEDED and parsed is None:
        review = _failed_as(review, Reason.INVALID_STAGE_OUTPUT, "the review's answer has no valid verdict")
    if parsed is None:
        return _failed(b, review, ConditionType.REVIEWED, Reason.REVIEW_FAILED)
    b.status.review = parsed
    if not _recorded(b.previous, review):
        details = {
            "job": review.name,
            "iteration": str(iteration),
            "verdict": parsed.verdict.value,
            "provider": review.provider or "",
            "model": review.model or "",
            "implementationProvider": parsed.implementation_provider or "",
            "providerDiffers": str(parsed.provider_differs).lower(),
            "findings": str(len(parsed.findings)),
        }
        message = f"iteration {iteration}: {parsed.verdict.value}"
        b.audit(AuditAction.CHANGE_REVIEWED, f"reviewed-{iteration}", message, details)
    where = f"review job {review.name} (iteration {iteration})"
    max_iterations = b.spec.max_iterations
    if parsed.verdict is ReviewVerdict.REQUEST_CHANGES:
        if iteration < max_iterations:
            why = f"{where} requested changes; iteration {iteration + 1} of {max_iterations} follows"
            b.cond(ConditionType.REVIEWED, False, Reason.CHANGES_REQUESTED, why)
            return parsed
        why = f"{where} requested changes after {iteration} of {max_iterations} iteration(s): {parsed.summary}"
        b.cond(ConditionType.REVIEWED, False, Reason.CHANGES_REQUESTED, why)
        b.cond(ConditionType.READY, False, Reason.CHANGES_REQUESTED, why)
        return _done(b, finished=True)
    b.cond(ConditionType.REVIEWED, True, Reason.REVIEW_APPROVED, f"{where} approved the patch")
    failing = [c.name for c in impl.checks if not c.passed]
    if failing:
        why = f"{where} approved, but checks failed: {', '.join(failing)}"
        b.cond(ConditionType.READY, False, Reason.CHECKS_FAILED, why)
    else:
        sha = impl.patch.sha256 if impl.patch else ""
        b.cond(ConditionType.READY, True, Reason.REVIEW_APPROVED, f"patch sha256 {sha} approved by {where}")
    return _done(b, finished=True)

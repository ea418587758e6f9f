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
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from helmhive.api.audit import AuditAction
from helmhive.api.change import (
    ApprovalMode,
    ApprovalStatus,
    ChangeSpec,
    ChangeStatus,
    PlanStatus,
    ReviewStatus,
    ReviewVerdict,
)
from helmhive.api.governed import ChangeStage
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.change.builder import (
    ChangeBuilder,
    ChangeDecision,
    fail_stage,
    finish_decision,
    job_status,
    stage_recorded,
    stage_running,
)
from helmhive.policy.change.jobs import (
    JobState,
    StageJob,
    build_job_name,
    parse_plan,
    parse_review,
    view_stage_job,
)
from helmhive.policy.conditions import find_condition, set_condition
from helmhive.policy.finality import TERMINAL_REASONS
from helmhive.policy.kstatus import with_kstatus

__all__ = ["AUTOMATIC_APPROVER", "TERMINAL_REASONS", "ChangeDecision", "decide_change"]

AUTOMATIC_APPROVER = "Automatic"


def decide_change(
    *,
    change: Mapping[str, Any],
    jobs: Mapping[str, Mapping[str, Any]],
    workspace_exists: bool,
    now: dt.datetime,
) -> ChangeDecision:
    """The next step of one Change (see the module docstring), its status with kstatus's conditions
    and ``observedGeneration`` (:mod:`helmhive.policy.kstatus`)."""
    decision = _decide(change=change, jobs=jobs, workspace_exists=workspace_exists, now=now)
    generation = (change.get("metadata") or {}).get("generation")
    decision.status = with_kstatus("Change", decision.status, generation=generation, now=now)
    return decision


def _decide(
    *,
    change: Mapping[str, Any],
    jobs: Mapping[str, Mapping[str, Any]],
    workspace_exists: bool,
    now: dt.datetime,
) -> ChangeDecision:
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
    b = ChangeBuilder(change=change, spec=spec, previous=previous, now=now, conditions=conditions)
    ready = find_condition(conditions, ConditionType.READY)
    if ready is not None and ready.get("reason") in TERMINAL_REASONS:
        return ChangeDecision(status=dict(raw_status), finished=True)  # final: never re-run a finished Change
    views = {name: v for name, body in jobs.items() if (v := view_stage_job(body)) is not None}
    b.status.jobs = [job_status(v) for v in sorted(views.values(), key=_order)]
    name = b.name
    missing = [j.name for j in previous.jobs if j.name not in views]
    if missing:
        # Jobs are listed from the API server (not a cache), so a job the status lists and the list lacks is gone.
        b.status = previous.model_copy(deep=True)
        why = f"job {missing[0]} was deleted before the change finished; create a new Change to run it again"
        b.cond(ConditionType.READY, False, Reason.JOB_MISSING, why)
        return finish_decision(b, finished=True)

    # Planning
    plan_job = views.get(build_job_name(name, ChangeStage.PLANNING, 1))
    if plan_job is None:
        if not workspace_exists:
            why = f"workspace {spec.workspace} does not exist yet; planning starts when it appears"
            b.cond(ConditionType.READY, False, Reason.WAITING_FOR_WORKSPACE, why)
            return finish_decision(b)
        b.new_job(ChangeStage.PLANNING, 1)
        return stage_running(
            b, ConditionType.PLANNED, ChangeStage.PLANNING, build_job_name(name, ChangeStage.PLANNING, 1), True
        )
    if plan_job.state is JobState.RUNNING:
        return stage_running(b, ConditionType.PLANNED, ChangeStage.PLANNING, plan_job.name, False)
    if plan_job.state is JobState.FAILED:
        return fail_stage(b, plan_job, ConditionType.PLANNED, Reason.PLANNING_FAILED)
    plan = parse_plan(plan_job)
    if plan is None:
        why = "the plan has no steps or does not match the planning contract"
        return fail_stage(
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
        return finish_decision(b)

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


def _approve(b: ChangeBuilder, plan: PlanStatus) -> bool:
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
    b: ChangeBuilder, views: Mapping[str, StageJob], plan: PlanStatus, iteration: int, findings: ReviewStatus | None
) -> ChangeDecision | ReviewStatus:
    """Decide one iteration; a ReviewStatus means its review requested changes and another may run."""
    impl = _implementation(b, views, plan, iteration, findings)
    if isinstance(impl, ChangeDecision):
        return impl
    return _review(b, views, plan, iteration, impl)


def _failed_as(job: StageJob, reason: Reason, message: str) -> StageJob:
    return replace(job, state=JobState.FAILED, reason=reason.value, message=message)


def _implementation(
    b: ChangeBuilder, views: Mapping[str, StageJob], plan: PlanStatus, iteration: int, findings: ReviewStatus | None
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
        return stage_running(b, ConditionType.IMPLEMENTED, ChangeStage.IMPLEMENTATION, impl_name, impl is None)
    if impl.state is JobState.SUCCEEDED and impl.patch is None:
        why = "the implementation job succeeded without a patch in status.result.patch"
        impl = _failed_as(impl, Reason.INVALID_STAGE_OUTPUT, why)
    if impl.state is JobState.FAILED or impl.patch is None:
        return fail_stage(b, impl, ConditionType.IMPLEMENTED, Reason.IMPLEMENTATION_FAILED)
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
    if not stage_recorded(b.previous, impl):
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
    b: ChangeBuilder, views: Mapping[str, StageJob], plan: PlanStatus, iteration: int, impl: StageJob
) -> ChangeDecision | ReviewStatus:
    review_name = build_job_name(b.name, ChangeStage.REVIEW, iteration)
    review = views.get(review_name)
    if review is None:
        b.new_job(ChangeStage.REVIEW, iteration, plan=plan, checks=impl.checks)
        return stage_running(b, ConditionType.REVIEWED, ChangeStage.REVIEW, review_name, True)
    if review.state is JobState.RUNNING:
        return stage_running(b, ConditionType.REVIEWED, ChangeStage.REVIEW, review.name, False)
    parsed = parse_review(review, impl) if review.state is JobState.SUCCEEDED else None
    if review.state is JobState.SUCCEEDED and parsed is None:
        review = _failed_as(review, Reason.INVALID_STAGE_OUTPUT, "the review's answer has no valid verdict")
    if parsed is None:
        return fail_stage(b, review, ConditionType.REVIEWED, Reason.REVIEW_FAILED)
    b.status.review = parsed
    if not stage_recorded(b.previous, review):
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
        return finish_decision(b, finished=True)
    b.cond(ConditionType.REVIEWED, True, Reason.REVIEW_APPROVED, f"{where} approved the patch")
    failing = [c.name for c in impl.checks if not c.passed]
    if failing:
        why = f"{where} approved, but checks failed: {', '.join(failing)}"
        b.cond(ConditionType.READY, False, Reason.CHECKS_FAILED, why)
    else:
        sha = impl.patch.sha256 if impl.patch else ""
        b.cond(ConditionType.READY, True, Reason.REVIEW_APPROVED, f"patch sha256 {sha} approved by {where}")
    return finish_decision(b, finished=True)

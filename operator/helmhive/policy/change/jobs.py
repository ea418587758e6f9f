"""A Change's jobs: their deterministic names, what each one's status means, and its stage output. Pure.

:func:`view_stage_job` reads one AgentJob the Change owns into a :class:`StageJob`: its
stage and iteration, whether it runs, succeeded or failed (a job that failed for the
infrastructure and that the operator will re-queue still counts as running), the provider and model it was routed to,
and the outputs the next stage needs (the plan or the review document, the patch, the check
evidence). :func:`parse_plan` and :func:`parse_review` bound those outputs for the Change's status.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from helmhive.api.change import CriterionVerdict, Finding, PlanStatus, PlanStep, ReviewStatus, ReviewVerdict
from helmhive.api.common import JobKind
from helmhive.api.governed import ChangeStage, CheckEvidence, PatchRef
from helmhive.api.reasons import ConditionType
from helmhive.policy.agentjob.failed import decide_pending_requeue
from helmhive.policy.agentjob.life import parse_agent_job

__all__ = [
    "LABEL_CHANGE",
    "LABEL_STAGE",
    "STAGE_KINDS",
    "JobState",
    "StageJob",
    "build_job_name",
    "build_label_value",
    "build_plan_digest",
    "parse_plan",
    "parse_review",
    "view_stage_job",
]

LABEL_CHANGE = "helmhive.dev/change"
LABEL_STAGE = "helmhive.dev/change-stage"
STAGE_KINDS: Mapping[ChangeStage, JobKind] = {
    ChangeStage.PLANNING: JobKind.CHANGE_PLANNING,
    ChangeStage.IMPLEMENTATION: JobKind.CHANGE_IMPLEMENTATION,
    ChangeStage.REVIEW: JobKind.CHANGE_REVIEW,
}
_SUFFIX = {ChangeStage.PLANNING: "plan", ChangeStage.IMPLEMENTATION: "impl", ChangeStage.REVIEW: "review"}
_MAX_BASE = 180


class JobState(enum.StrEnum):
    RUNNING = "Running"
    """Queued, routed or running (or about to be re-queued after its runner was lost)."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True, kw_only=True)
class StageJob:
    """What the Change needs to know about one of its jobs."""

    name: str
    stage: ChangeStage
    iteration: int
    state: JobState
    reason: str = ""
    message: str = ""
    provider: str | None = None
    model: str | None = None
    output: Mapping[str, Any] | None = None
    patch: PatchRef | None = None
    checks: tuple[CheckEvidence, ...] = ()
    pod: str | None = None
    """The job pod it ran in (a pool in JobPod mode), from ``status.result.jobPod``."""


def build_job_name(change: str, stage: ChangeStage, iteration: int) -> str:
    """The one name a stage's job ever has: ``<change>-plan``, ``<change>-impl-<i>``, ``<change>-review-<i>``.

    A long Change name is shortened with a hash of the whole, so two Changes never share a job.
    """
    base = change
    if len(base) > _MAX_BASE:
        base = f"{change[: _MAX_BASE - 9].rstrip('-.')}-{hashlib.sha256(change.encode()).hexdigest()[:8]}"
    suffix = _SUFFIX[stage] if stage is ChangeStage.PLANNING else f"{_SUFFIX[stage]}-{iteration}"
    return f"{base}-{suffix}"


def build_label_value(name: str) -> str:
    if len(name) <= 63:
        return name
    return f"{name[:54].rstrip('-.')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def view_stage_job(body: Mapping[str, Any]) -> StageJob | None:
    """Parse one AgentJob the Change owns; None when it carries no usable change reference."""
    job = parse_agent_job(body)
    ref = job.raw_spec.get("change")
    if not isinstance(ref, Mapping):
        return None
    try:
        stage = ChangeStage(str(ref.get("stage")))
        iteration = int(ref.get("iteration") or 1)
    except (TypeError, ValueError):
        return None
    state, ending = JobState.RUNNING, None
    if job.finished:
        ending = job.condition(ConditionType.SUCCEEDED)
        # The operator re-queues an infrastructure failure it may re-run: the Change waits for that run.
        if not job.failed:
            state = JobState.SUCCEEDED
        elif not decide_pending_requeue(job):
            state = JobState.FAILED
    elif job.refused:
        state, ending = JobState.FAILED, job.condition(ConditionType.ROUTED)
    reason, message = (str(ending.get("reason")), str(ending.get("message") or "")) if ending else ("", "")
    assignment, result = job.status_part("assignment"), job.status_part("result")
    patch: PatchRef | None = None
    checks: tuple[CheckEvidence, ...] = ()
    try:
        patch = PatchRef.model_validate(result["patch"]) if result.get("patch") else None
        checks = tuple(CheckEvidence.model_validate(c) for c in result.get("checks") or ())
    except ValidationError:
        patch, checks = None, ()
    output = result.get("output")
    job_pod = result.get("jobPod")
    pod = job_pod.get("name") if isinstance(job_pod, Mapping) else None
    return StageJob(
        name=job.name,
        stage=stage,
        iteration=iteration,
        state=state,
        reason=reason,
        message=message,
        provider=assignment.get("provider"),
        model=assignment.get("model"),
        output=output if isinstance(output, Mapping) else None,
        patch=patch,
        checks=checks,
        pod=pod if isinstance(pod, str) and 0 < len(pod) <= 253 else None,
    )


def build_plan_digest(plan: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the plan's canonical JSON (summary, steps, risks): what an approval names."""
    canonical = json.dumps(
        {"summary": plan.get("summary", ""), "steps": plan.get("steps", []), "risks": plan.get("risks", [])},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def parse_plan(job: StageJob) -> PlanStatus | None:
    output = job.output or {}
    try:
        steps = [PlanStep.model_validate(s) for s in output.get("steps") or ()]
        body = {
            "summary": str(output.get("summary") or ""),
            "steps": [s.to_wire() for s in steps],
            "risks": [str(r) for r in output.get("risks") or ()],
        }
        if not steps:
            return None
        return PlanStatus(job=job.name, digest=build_plan_digest(body), **body)
    except (ValidationError, TypeError, AttributeError):
        return None


def parse_review(job: StageJob, implementation: StageJob | None) -> ReviewStatus | None:
    output = job.output or {}
    try:
        provider, implementer = job.provider, implementation.provider if implementation else None
        return ReviewStatus(
            job=job.name,
            iteration=job.iteration,
            verdict=ReviewVerdict(str(output.get("verdict"))),
            summary=str(output.get("summary") or "")[:4000],
            findings=[Finding.model_validate(f) for f in (output.get("findings") or ())[:32]],
            criteria=[CriterionVerdict.model_validate(c) for c in (output.get("criteria") or ())[:32]],
            provider=provider,
            implementation_provider=implementer,
            provider_differs=None if not (provider and implementer) else provider != implementer,
        )
    except (ValidationError, ValueError, TypeError, AttributeError):
        return None

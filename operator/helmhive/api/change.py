"""The Change kind: a governed change, planned, implemented, checked and reviewed at an exact commit.

The spec is the immutable request (CEL rules in the CRD): what to change, the criteria a
human confirmed, the exact source, the checks and the approval mode. Only
``spec.approvedPlan`` may be set later, by a principal allowed the ``approve`` verb on
``changes.helmhive.dev`` and only in their own name (a ValidatingAdmissionPolicy checks both).

The status is written by the operator alone. It has one condition per step (``Planned``,
``Approved``, ``Implemented``, ``Checked``, ``Reviewed``) and a summary ``Ready``, plus the
bounded results each step produced. See ``docs/changes.md``.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated

from pydantic import ConfigDict, Field, StringConstraints

from helmhive.api.common import ApiModel, LongText, Message, Name, ShortText, StatusBase
from helmhive.api.governed import MAX_CHECKS, ChangeStage, CheckEvidence, CheckSpec, PatchRef, SourceRef
from helmhive.api.job import immutable_fields
from helmhive.api.memory import ServiceName
from helmhive.api.profile import ModelId, ProviderName

__all__ = [
    "MAX_ITERATIONS",
    "PLAN_DIGEST_PATTERN",
    "ApprovalMode",
    "ApprovalStatus",
    "ChangeJob",
    "ChangeRequest",
    "ChangeSpec",
    "ChangeStatus",
    "CriterionVerdict",
    "Finding",
    "PlanApproval",
    "PlanStatus",
    "PlanStep",
    "ReviewStatus",
    "ReviewVerdict",
]

MAX_ITERATIONS = 3
PLAN_DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
PlanDigest = Annotated[str, StringConstraints(pattern=PLAN_DIGEST_PATTERN, max_length=71)]
Criterion = Annotated[str, StringConstraints(min_length=1, max_length=1024)]


class ChangeRequest(ApiModel):
    title: ShortText
    description: LongText


class ApprovalMode(enum.StrEnum):
    """``Automatic``: the plan is approved as soon as it exists. ``Manual``: a person approves its digest."""

    AUTOMATIC = "Automatic"
    MANUAL = "Manual"


class PlanApproval(ApiModel):
    """A person's approval of one exact plan, by its digest. ``by`` must be the requesting user."""

    digest: PlanDigest
    by: ShortText


class ChangeSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=immutable_fields(
            "workspace",
            "request",
            "criteria",
            "source",
            "service",
            "approval",
            "maxIterations",
            "checks",
            kind="Change",
        )
    )

    workspace: Name
    request: ChangeRequest
    criteria: Annotated[list[Criterion], Field(min_length=1, max_length=32)]
    """The criteria a human confirmed: what the implementation is held to and the review judges."""
    source: SourceRef
    service: ServiceName | None = None
    approval: ApprovalMode = ApprovalMode.AUTOMATIC
    max_iterations: Annotated[int, Field(ge=1, le=MAX_ITERATIONS)] = 1
    """How many implementations may run: a ``request-changes`` review starts another while some are left."""
    checks: Annotated[list[CheckSpec], Field(max_length=MAX_CHECKS)] = []
    approved_plan: PlanApproval | None = None
    """Set by ``kubectl helmhive change approve``; counts only while it names the current plan's digest."""


class ChangeJob(ApiModel):
    """One job the Change created, and what became of it."""

    stage: ChangeStage
    iteration: Annotated[int, Field(ge=1, le=MAX_ITERATIONS)]
    name: Name
    provider: ProviderName | None = None
    model: ModelId | None = None
    outcome: Annotated[str, StringConstraints(max_length=160)] | None = None
    """The job's final reason (``Completed``, ``PatchTooLarge``…); absent while it runs."""
    pod: Name | None = None
    """The job pod it ran in, for a pool in JobPod mode (recorded when the job ends)."""


class PlanStep(ApiModel):
    title: Annotated[str, StringConstraints(max_length=256)]
    detail: Annotated[str, StringConstraints(max_length=2000)] = ""


class PlanStatus(ApiModel):
    """The plan the planning job returned, bounded, with the digest an approval must name."""

    job: Name
    digest: PlanDigest
    summary: Annotated[str, StringConstraints(max_length=4000)] = ""
    steps: Annotated[list[PlanStep], Field(max_length=32)] = []
    risks: Annotated[list[Annotated[str, StringConstraints(max_length=1000)]], Field(max_length=16)] = []


class ApprovalStatus(ApiModel):
    """Which plan digest was approved, by whom (``Automatic`` for the automatic gate), and when."""

    digest: PlanDigest
    by: ShortText
    at: dt.datetime


class ReviewVerdict(enum.StrEnum):
    APPROVE = "approve"
    REQUEST_CHANGES = "request-changes"


class Finding(ApiModel):
    severity: Annotated[str, StringConstraints(pattern=r"^(info|minor|major|blocker)$", max_length=16)]
    message: Message
    file: Annotated[str, StringConstraints(max_length=512)] | None = None
    line: Annotated[int, Field(ge=0)] | None = None


class CriterionVerdict(ApiModel):
    """The reviewer's judgement of one confirmed criterion (``criterion`` is its index in the spec)."""

    criterion: Annotated[int, Field(ge=0, le=31)]
    met: bool
    note: Message = ""


class ReviewStatus(ApiModel):
    job: Name
    iteration: Annotated[int, Field(ge=1, le=MAX_ITERATIONS)]
    verdict: ReviewVerdict
    summary: Annotated[str, StringConstraints(max_length=4000)] = ""
    findings: Annotated[list[Finding], Field(max_length=32)] = []
    criteria: Annotated[list[CriterionVerdict], Field(max_length=32)] = []
    provider: ProviderName | None = None
    implementation_provider: ProviderName | None = None
    provider_differs: bool | None = None
    """Whether the reviewer's provider differed from the implementer's (False: same provider, fresh context)."""


class ChangeStatus(StatusBase):
    iteration: Annotated[int, Field(ge=0, le=MAX_ITERATIONS)] = 0
    """The implementation iteration under way or last finished (0 before the first)."""
    jobs: Annotated[list[ChangeJob], Field(max_length=1 + 2 * MAX_ITERATIONS)] = []
    plan: PlanStatus | None = None
    approval: ApprovalStatus | None = None
    patch: PatchRef | None = None
    """The latest implementation's patch."""
    check_evidence: Annotated[list[CheckEvidence], Field(max_length=MAX_CHECKS)] = []
    """The latest implementation's checks."""
    review: ReviewStatus | None = None
    """The latest review."""

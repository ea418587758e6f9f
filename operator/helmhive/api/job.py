"""The AgentJob and Change kinds: one job of one kind, and a governed change of three jobs.

A job's request is immutable once created (CEL rules in the CRD); only ``spec.cancel``
may change. Routing, assignment, session and result are written to status by the
operator and the assigned runner, each into its own fields.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StringConstraints

from helmhive.api.common import (
    DNS_LABEL_PATTERN,
    ApiModel,
    JobKind,
    LongText,
    Message,
    Name,
    ReasoningEffort,
    ShortText,
    StatusBase,
    Url,
)
from helmhive.api.memory import ServiceName
from helmhive.api.profile import EffectiveProfile, ModelId, ProviderName

__all__ = [
    "AgentJobSpec",
    "AgentJobStatus",
    "ArtifactRef",
    "Assignment",
    "Candidate",
    "ChangeRef",
    "ChangeRequest",
    "ChangeSpec",
    "ChangeStage",
    "ChangeStatus",
    "CheckEvidence",
    "JobRequest",
    "JobResult",
    "ModelOverride",
    "ModelSource",
    "ProfileBinding",
    "RoutingStatus",
    "SessionMode",
    "SessionStatus",
    "SourceRef",
    "immutable_fields",
]

COMMIT_PATTERN = r"^[0-9a-f]{40}([0-9a-f]{24})?$"
ReasonText = Annotated[str, StringConstraints(max_length=160)]
NamespaceName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]


def immutable_fields(*names: str, kind: str) -> dict[str, Any]:
    """CEL rules for ``json_schema_extra`` that make the named (camelCase) fields immutable.

    Each rule also catches an optional field being added or removed after creation.
    """
    rules = [
        {
            "rule": f"has(self.{n}) == has(oldSelf.{n}) && (!has(self.{n}) || self.{n} == oldSelf.{n})",
            "message": f"{n} is immutable once the {kind} is created",
            "fieldPath": f".{n}",
            "reason": "FieldValueForbidden",
        }
        for n in names
    ]
    return {"x-kubernetes-validations": rules}


class SourceRef(ApiModel):
    """An exact source: a git repository and a full commit id."""

    repository: Url
    commit: Annotated[str, StringConstraints(pattern=COMMIT_PATTERN, max_length=64)]


class JobRequest(ApiModel):
    title: ShortText
    prompt: Annotated[str, StringConstraints(min_length=1, max_length=32768)]


class ModelOverride(ApiModel):
    """An explicit model, honoured only when the profile allows overrides."""

    provider: ProviderName | None = None
    model: ModelId | None = None
    reasoning_effort: ReasoningEffort | None = None


class ChangeStage(enum.StrEnum):
    PLANNING = "planning"
    IMPLEMENTATION = "implementation"
    REVIEW = "review"


class ChangeRef(ApiModel):
    """Set on the jobs a Change creates."""

    name: Name
    stage: ChangeStage


class AgentJobSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=immutable_fields(
            "workspace",
            "jobKind",
            "profile",
            "service",
            "request",
            "model",
            "source",
            "change",
            "timeoutSeconds",
            kind="AgentJob",
        )
    )

    workspace: Name
    job_kind: JobKind
    profile: Name | None = None
    service: ServiceName | None = None
    request: JobRequest
    model: ModelOverride | None = None
    source: SourceRef | None = None
    change: ChangeRef | None = None
    timeout_seconds: Annotated[int, Field(ge=10, le=86400)] = 1800
    cancel: bool = False


class ModelSource(enum.StrEnum):
    MAPPING = "mapping"
    FALLBACK = "fallback"
    OVERRIDE = "override"
    RUNNER_DEFAULT = "runner-default"


class Candidate(ApiModel):
    """One runner considered: the mapping and model it came closest to, and the outcome.

    ``reason`` is ``Selected``, ``NotPreferred:<tie-break>`` or why it was rejected
    (``NotSchedulable/<reason>``, ``ModelNotAdvertised:<model>``, ``MissingLabel:<k=v>``…);
    see ``docs/routing.md``.
    """

    runner: Name
    namespace: NamespaceName | None = None
    """The runner's namespace (a pool may serve other namespaces than its own)."""
    provider: ProviderName | None = None
    mapping_index: Annotated[int, Field(ge=0, le=7)] | None = None
    model: ModelId | None = None
    reason: ReasonText


class RoutingStatus(ApiModel):
    considered_runners: Annotated[int, Field(ge=0)] = 0
    candidates: Annotated[list[Candidate], Field(max_length=20)] = []
    attempts: Annotated[int, Field(ge=0)] = 0
    decided_at: dt.datetime | None = None
    next_attempt_at: dt.datetime | None = None
    capacity_deadline: dt.datetime | None = None
    """While waiting for capacity: when the job stops waiting and fails ``CapacityDeadlineExceeded``."""
    avoided_provider: ProviderName | None = None
    """For a change review: the implementation's provider, which routing preferred not to use."""


class Assignment(ApiModel):
    """Where the job runs and with what. Written once, under a resourceVersion precondition."""

    runner: Name
    pool: Name
    runner_namespace: NamespaceName | None = None
    """The namespace of the runner and its pool (a pool may serve other namespaces than its own)."""
    provider: ProviderName
    model: ModelId
    model_source: ModelSource
    reasoning_effort: ReasoningEffort | None = None
    mapping_index: Annotated[int, Field(ge=0, le=7)]
    memory_ids: Annotated[list[Name], Field(max_length=20)] = []
    credential_generation: Annotated[int, Field(ge=0)] = 0
    assigned_at: dt.datetime


class ProfileBinding(ApiModel):
    """The exact profile revision a job runs with, bound when the job is queued.

    Later edits to the profile change neither the revision nor the snapshot.
    """

    name: Name
    revision: Annotated[str, Field(max_length=253)]
    hash: Annotated[str, Field(max_length=80)]
    snapshot: EffectiveProfile
    bound_at: dt.datetime


class SessionMode(enum.StrEnum):
    FRESH = "fresh"
    RESUMED = "resumed"
    FORKED = "forked"


class SessionStatus(ApiModel):
    """The binding used; the native session id lives only in the binding's Secret."""

    binding: Annotated[str, Field(max_length=253)] | None = None
    mode: SessionMode


class ArtifactRef(ApiModel):
    """A large output kept in an owned ConfigMap (or Secret), referenced from status."""

    kind: Annotated[str, Field(pattern=r"^(ConfigMap|Secret)$", max_length=16)]
    name: Name
    key: Annotated[str, Field(max_length=253)]
    bytes: Annotated[int, Field(ge=0)]
    sha256: Annotated[str, Field(max_length=64)]
    truncated: bool = False


class JobResult(ApiModel):
    outcome: ReasonText
    summary: Annotated[str, Field(max_length=4096)] = ""
    output: Annotated[
        dict[str, Any] | None, Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    ] = None
    artifacts: Annotated[list[ArtifactRef], Field(max_length=8)] = []
    validation_errors: Annotated[list[Message], Field(max_length=20)] = []
    started_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None


class AgentJobStatus(StatusBase):
    profile: ProfileBinding | None = None
    routing: RoutingStatus | None = None
    assignment: Assignment | None = None
    session: SessionStatus | None = None
    result: JobResult | None = None
    attempts: Annotated[int, Field(ge=0)] = 0


class ChangeRequest(ApiModel):
    title: ShortText
    description: LongText


class ChangeSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=immutable_fields("workspace", "request", "criteria", "source", "service", kind="Change")
    )

    workspace: Name
    request: ChangeRequest
    criteria: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=1024)]],
        Field(min_length=1, max_length=32),
    ]
    source: SourceRef
    service: ServiceName | None = None


class CheckEvidence(ApiModel):
    name: ShortText
    passed: bool
    summary: Message = ""


class ChangeStatus(StatusBase):
    stage: ChangeStage | None = None
    jobs: Annotated[dict[str, Name], Field(max_length=3)] = {}
    plan_summary: Annotated[str, Field(max_length=4096)] = ""
    patch: ArtifactRef | None = None
    review_verdict: Annotated[str, Field(pattern=r"^(approve|request-changes)$", max_length=32)] | None = None
    review_provider_differs: bool | None = None
    check_evidence: Annotated[list[CheckEvidence], Field(max_length=16)] = []

"""The AgentJob kind: one job of one kind (the Change kind is in :mod:`helmhive.api.change`).

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
    ATOMIC_OBJECT,
    DNS_LABEL_PATTERN,
    ApiModel,
    JobKind,
    Message,
    Name,
    ReasoningEffort,
    ShortText,
    StatusBase,
)
from helmhive.api.governed import (
    MAX_CHECKS,
    ArtifactRef,
    ChangeRef,
    ChangeStage,
    CheckEvidence,
    CheckSpec,
    PatchRef,
    SourceRef,
)
from helmhive.api.memory import ServiceName
from helmhive.api.profile import EffectiveProfile, ModelId, ProviderName

__all__ = [
    "AgentJobSpec",
    "AgentJobStatus",
    "ArtifactRef",
    "Assignment",
    "Candidate",
    "CandidateGroup",
    "ChangeRef",
    "ChangeStage",
    "CheckEvidence",
    "CheckSpec",
    "DroppedMemory",
    "JobPodRecord",
    "JobRequest",
    "JobResult",
    "MemoryReport",
    "ModelOverride",
    "ModelSource",
    "PatchRef",
    "ProfileBinding",
    "RoutingStatus",
    "SessionMode",
    "SessionStatus",
    "SourceRef",
    "immutable_fields",
]

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


class JobRequest(ApiModel):
    title: ShortText
    prompt: Annotated[str, StringConstraints(min_length=1, max_length=131072)]
    """At most 128 KiB: a governed job's request carries its whole context (criteria, plan, evidence)."""


class ModelOverride(ApiModel):
    """An explicit model, honoured only when the profile allows overrides."""

    provider: ProviderName | None = None
    model: ModelId | None = None
    reasoning_effort: ReasoningEffort | None = None


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
            "checks",
            "patch",
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
    checks: Annotated[list[CheckSpec], Field(max_length=MAX_CHECKS)] = []
    """Run by the runner on the patched tree after the agent's turn (implementation jobs only)."""
    patch: PatchRef | None = None
    """The patch a review job rebuilds the patched tree from, verified by its SHA-256."""
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


class CandidateGroup(ApiModel):
    """Runners the router considered that came equally close: the same namespace, mapping, model and outcome.

    ``runners`` lists them in the order of the candidate table (closest first, then by name); the
    groups come in the order of their closest runner, the winner's first. ``reason`` is
    ``Selected``, ``NotPreferred:<tie-break>`` or why they were rejected
    (``NotSchedulable/<reason>``, ``ModelNotAdvertised:<model>``, ``MissingLabel:<k=v>``…); see
    ``docs/routing.md``. A row stored before groups existed has ``runner`` instead of ``runners``
    and reads as a group of one.
    """

    runners: Annotated[
        list[Name] | None,
        Field(min_length=1, max_length=20, description="The runners of the group, in the candidate table's order."),
    ] = None
    runner: Annotated[
        Name | None,
        Field(description="Only on a row stored before groups existed: its one runner. No longer written."),
    ] = None
    namespace: NamespaceName | None = None
    provider: ProviderName | None = None
    mapping_index: Annotated[int, Field(ge=0, le=7)] | None = None
    model: ModelId | None = None
    reason: ReasonText

    def rows(self) -> list[Candidate]:
        """The group's rows of the candidate table, in order (a row stored before groups: its runner)."""
        common = self.model_dump(exclude={"runners", "runner"})
        names = self.runners or ([self.runner] if self.runner else [])
        return [Candidate(runner=runner, **common) for runner in names]


class RoutingStatus(ApiModel):
    considered_runners: Annotated[int, Field(ge=0)] = 0
    candidates: Annotated[list[CandidateGroup], Field(max_length=20)] = []
    """The candidate table (at most 20 runners in all, the winner first), grouped: the runners
    whose row differs only in runner share one :class:`CandidateGroup`."""

    attempts: Annotated[int, Field(ge=0)] = 0
    decided_at: dt.datetime | None = None
    next_attempt_at: dt.datetime | None = None
    capacity_deadline: dt.datetime | None = None
    """While waiting for capacity: when the job stops waiting and fails ``CapacityDeadlineExceeded``."""
    avoided_provider: ProviderName | None = None
    """For a change review: the implementation's provider, which routing preferred not to use."""

    def rows(self) -> list[Candidate]:
        """The candidate table, row for row: every group expanded."""
        return [row for group in self.candidates for row in group.rows()]


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


class DroppedMemory(ApiModel):
    """A record named at queue time that the runner did not inject, and why (a fixed reason)."""

    name: Name
    reason: ReasonText


class MemoryReport(ApiModel):
    """What the runner injected when the job started: each record re-checked at run time.

    Written by the runner with ``Running=True``; the operator audits it (``MemoryInjected``).
    """

    injected: Annotated[list[Name], Field(max_length=20)] = []
    """The records injected, in injection order."""
    dropped: Annotated[list[DroppedMemory], Field(max_length=20)] = []
    """The records named in ``status.assignment.memoryIds`` but not injected (deleted, expired, inactive…)."""


class JobPodRecord(ApiModel):
    """The job pod a run used (``RunnerPool.spec.execution.mode: JobPod``): deleted once the job ended."""

    name: Name
    warm: bool = False
    """Whether it was one of the pool's warm pods, claimed (else created for the job)."""


class JobResult(ApiModel):
    outcome: ReasonText
    summary: Annotated[str, Field(max_length=4096)] = ""
    output: Annotated[
        dict[str, Any] | None, Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    ] = None
    artifacts: Annotated[list[ArtifactRef], Field(max_length=8)] = []
    validation_errors: Annotated[list[Message], Field(max_length=20)] = []
    patch: PatchRef | None = None
    """Implementation jobs: the patch the runner computed with git against the exact commit."""
    checks: Annotated[list[CheckEvidence], Field(max_length=MAX_CHECKS)] = []
    """Implementation jobs: the evidence of each check, in the order declared."""
    started_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    memory: MemoryReport | None = None
    """The memory the runner injected at run time, and what it dropped (only when records were named)."""
    job_pod: JobPodRecord | None = None
    """The pod the job ran in, for a pool in JobPod mode (its ``JobPodClaimed``/``JobPodCreated`` Event too)."""


class AgentJobStatus(StatusBase):
    # Each is written whole by its steps (helmhive.policy.agentjob.life): atomic for managedFields.
    profile: Annotated[ProfileBinding | None, Field(json_schema_extra=ATOMIC_OBJECT)] = None
    routing: Annotated[RoutingStatus | None, Field(json_schema_extra=ATOMIC_OBJECT)] = None
    assignment: Annotated[Assignment | None, Field(json_schema_extra=ATOMIC_OBJECT)] = None
    session: Annotated[SessionStatus | None, Field(json_schema_extra=ATOMIC_OBJECT)] = None
    result: Annotated[JobResult | None, Field(json_schema_extra=ATOMIC_OBJECT)] = None
    attempts: Annotated[int, Field(ge=0)] = 0

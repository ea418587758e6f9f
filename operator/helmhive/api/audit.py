"""The AuditRecord kind: an append-only trail of what changed, who changed it, and when.

Records are immutable once created (a CEL rule forbids any change to ``spec``) and are
kept by age and count by the operator. Most records are about one object; a
``RoutingDecisions`` record holds a batch of the router's decisions (``decisions``), one entry
per decision with the fields a per-decision record would have (docs/audit.md). They never hold
a credential or a native session identifier: only names, revisions and content hashes.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, StringConstraints

from helmhive.api.common import ApiModel, Message, ShortText, Timestamp

__all__ = [
    "MAX_DECISIONS",
    "AuditAction",
    "AuditActor",
    "AuditDecision",
    "AuditObject",
    "AuditRecordSpec",
    "AuditState",
    "AuditSuggestion",
]

MAX_DECISIONS = 100


class AuditAction(enum.StrEnum):
    PROFILE_REVISION_CREATED = "ProfileRevisionCreated"
    PROFILE_INVALID = "ProfileInvalid"
    MEMORY_CREATED = "MemoryCreated"
    MEMORY_UPDATED = "MemoryUpdated"
    MEMORY_EXPIRED = "MemoryExpired"
    MEMORY_DELETED = "MemoryDeleted"
    RUNNER_REGISTERED = "RunnerRegistered"
    RUNNER_CONTROL_STATE_CHANGED = "RunnerControlStateChanged"
    RUNNER_STATUS_CHANGED = "RunnerStatusChanged"
    RUNNER_CREDENTIAL_ROTATED = "RunnerCredentialRotated"
    RUNNER_REVOKED = "RunnerRevoked"
    RUNNER_QUALIFIED = "RunnerQualified"
    RUNNER_QUALIFICATION_FAILED = "RunnerQualificationFailed"
    JOB_ROUTED = "JobRouted"
    JOB_ROUTING_FAILED = "JobRoutingFailed"
    MEMORY_INJECTED = "MemoryInjected"
    ROUTING_DECISIONS = "RoutingDecisions"
    SESSION_RESET = "SessionReset"
    SESSION_COMPACTED = "SessionCompacted"
    ENVELOPE_RESTORED = "EnvelopeRestored"
    CHANGE_PLANNED = "ChangePlanned"
    CHANGE_APPROVED = "ChangeApproved"
    CHANGE_IMPLEMENTED = "ChangeImplemented"
    CHANGE_REVIEWED = "ChangeReviewed"
    CHANGE_STAGE_FAILED = "ChangeStageFailed"
    SUGGESTIONS_EXPORTED = "SuggestionsExported"


class AuditActor(ApiModel):
    """Who acted, as the API server identified them (or the operator itself)."""

    username: ShortText
    uid: Annotated[str, Field(max_length=128)] | None = None
    groups: Annotated[list[ShortText], Field(max_length=16)] = []


class AuditObject(ApiModel):
    api_version: ShortText
    kind: Annotated[str, StringConstraints(max_length=63)]
    namespace: Annotated[str, StringConstraints(max_length=63)] | None = None
    name: Annotated[str, StringConstraints(max_length=253)]
    uid: Annotated[str, Field(max_length=128)] | None = None


class AuditState(ApiModel):
    """A before or after state, by revision and content hash only."""

    revision: Annotated[str, Field(max_length=253)] | None = None
    hash: Annotated[str, Field(max_length=80)] | None = None
    value: Annotated[str, Field(max_length=256)] | None = None


Details = Annotated[
    dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]


class AuditDecision(ApiModel):
    """One routing decision in a ``RoutingDecisions`` batch: what a per-decision record would hold."""

    action: AuditAction = Field(description="JobRouted, JobRoutingFailed or MemoryInjected (selected at queue time).")
    object: AuditObject = Field(description="The AgentJob the decision is about (with its uid).")
    attempt: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        default=0, description="The job's status.attempts when decided: 0 for the first run, n for re-run n."
    )
    time: Timestamp = Field(description="When the decision was written to the job's status (status.routing.decidedAt).")
    after: AuditState | None = None
    message: Annotated[str, StringConstraints(max_length=1024)] = ""
    details: Details = {}


class AuditSuggestion(ApiModel):
    """One exported policy suggestion: its digest and the record name it was written as (never its text)."""

    digest: Annotated[str, StringConstraints(max_length=71)]
    record: Annotated[str, StringConstraints(max_length=63)]
    matches_job: bool | None = None
    """Whether the job's output, when the operator read it, held a suggestion with this digest (None: job gone)."""


class AuditRecordSpec(ApiModel):
    action: AuditAction
    actor: AuditActor
    object: AuditObject
    time: Timestamp
    before: AuditState | None = None
    after: AuditState | None = None
    message: Message = ""
    details: Details = {}
    decisions: Annotated[list[AuditDecision], Field(max_length=MAX_DECISIONS)] = Field(
        default=[],
        description=(
            "RoutingDecisions only: the batch of routing decisions this record holds (each job's "
            "are found with the label job.audit.helmhive.dev/<job uid>)."
        ),
    )
    suggestions: Annotated[list[AuditSuggestion], Field(max_length=20)] = Field(
        default=[],
        description="SuggestionsExported only: the suggestions exported, by digest (never their text).",
    )

"""The AuditRecord kind: an append-only trail of what changed, who changed it, and when.

Records are immutable once created (a CEL rule forbids any change to ``spec``) and are
kept by age and count by the operator. They never hold a credential or a native session
identifier: only names, revisions and content hashes.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, StringConstraints

from helmhive.api.common import ApiModel, Message, ShortText, Timestamp

__all__ = ["AuditAction", "AuditActor", "AuditObject", "AuditRecordSpec", "AuditState"]


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
    JOB_ROUTED = "JobRouted"
    JOB_ROUTING_FAILED = "JobRoutingFailed"
    MEMORY_INJECTED = "MemoryInjected"
    SESSION_RESET = "SessionReset"
    SESSION_COMPACTED = "SessionCompacted"
    ENVELOPE_RESTORED = "EnvelopeRestored"
    CHANGE_PLANNED = "ChangePlanned"
    CHANGE_APPROVED = "ChangeApproved"
    CHANGE_IMPLEMENTED = "ChangeImplemented"
    CHANGE_REVIEWED = "ChangeReviewed"
    CHANGE_STAGE_FAILED = "ChangeStageFailed"


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


class AuditRecordSpec(ApiModel):
    action: AuditAction
    actor: AuditActor
    object: AuditObject
    time: Timestamp
    before: AuditState | None = None
    after: AuditState | None = None
    message: Message = ""
    details: Annotated[
        dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=512)]],
        Field(max_length=16),
    ] = {}

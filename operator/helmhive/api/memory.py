"""The MemoryRecord and Workspace kinds: approved context, and the workspace it belongs to.

A memory record is one approved decision or constraint, scoped to the workspace or one of
its services. Records are context for an agent, never authority. A Workspace holds the
repository, its services (the scopes for memory and sessions), and the active profile per
job kind.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated

from pydantic import ConfigDict, Field, StringConstraints

from helmhive.api.common import (
    DNS_LABEL_PATTERN,
    ApiModel,
    JobKind,
    Message,
    Name,
    Sensitivity,
    ShortText,
    StatusBase,
    Timestamp,
    Url,
)

__all__ = [
    "MEMORY_TEXT_MAX",
    "CheckedMemoryScope",
    "MemoryKind",
    "MemoryRecordSpec",
    "MemoryRecordStatus",
    "MemoryScope",
    "MemoryScopeType",
    "MemorySource",
    "MemorySourceType",
    "Repository",
    "ServiceName",
    "SuggestingJob",
    "WorkspaceProfileBinding",
    "WorkspaceService",
    "WorkspaceSpec",
    "WorkspaceStatus",
]

MEMORY_TEXT_MAX = 2000
SUGGESTION_DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
ServiceName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]


class MemoryKind(enum.StrEnum):
    DECISION = "decision"
    CONSTRAINT = "constraint"


class MemoryScopeType(enum.StrEnum):
    WORKSPACE = "workspace"
    SERVICE = "service"


class MemorySourceType(enum.StrEnum):
    PULL_REQUEST = "pull-request"
    ADR = "adr"
    ISSUE = "issue"
    DOCUMENT = "document"
    OTHER = "other"
    POLICY_SUGGESTION = "policy-suggestion"
    """Suggested by a policy-suggestion job (``source.job``) and committed by a human (docs/suggestions.md)."""


class MemoryScope(ApiModel):
    type: MemoryScopeType
    service: ServiceName | None = None


CheckedMemoryScope = Annotated[
    MemoryScope,
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.type == 'service' ? has(self.service) : !has(self.service)",
                    "message": "scope.service is required for a service scope and forbidden otherwise",
                }
            ]
        }
    ),
]
"""A scope as a record or a suggestion carries it: a service scope names its service, no other does (CEL)."""


class SuggestingJob(ApiModel):
    """The policy-suggestion job a record came from, and which of its suggestions (by digest)."""

    name: Name
    uid: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    digest: Annotated[str, StringConstraints(pattern=SUGGESTION_DIGEST_PATTERN, max_length=71)]


class MemorySource(ApiModel):
    """Where the decision was approved: a PR, an ADR, an issue, or a policy-suggestion job."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.type == 'policy-suggestion' ? has(self.job) : !has(self.job)",
                    "message": "source.job is required for a policy-suggestion source and forbidden otherwise",
                }
            ]
        }
    )

    type: MemorySourceType
    url: Url
    """For a policy-suggestion source: the job's API path (``/apis/helmhive.dev/v1alpha1/namespaces/…``)."""
    approved_by: ShortText | None = None
    job: SuggestingJob | None = None


class MemoryRecordSpec(ApiModel):
    workspace: Name
    scope: CheckedMemoryScope
    kind: MemoryKind
    text: Annotated[str, StringConstraints(min_length=1, max_length=MEMORY_TEXT_MAX)]
    source: MemorySource
    sensitivity: Sensitivity
    expires_at: Timestamp | None = None


class MemoryRecordStatus(StatusBase):
    """Written by the operator."""

    content_hash: Annotated[str, Field(max_length=80)] | None = None
    expired_at: dt.datetime | None = None


class Repository(ApiModel):
    url: Url
    default_branch: Annotated[str, StringConstraints(min_length=1, max_length=255)] = "main"


class WorkspaceService(ApiModel):
    """One service of the workspace: a scope for memory and for session continuity."""

    name: ServiceName
    path: Annotated[str, StringConstraints(max_length=512)] = ""
    description: Message = ""


class WorkspaceProfileBinding(ApiModel):
    """The profile that is active for one job kind in this workspace."""

    job_kind: JobKind
    profile: Name


class WorkspaceSpec(ApiModel):
    repository: Repository
    services: Annotated[
        list[WorkspaceService],
        Field(
            max_length=64,
            json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        ),
    ] = []
    profiles: Annotated[
        list[WorkspaceProfileBinding],
        Field(
            max_length=16,
            json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["jobKind"]},
        ),
    ] = []


class WorkspaceStatus(StatusBase):
    """Written by the operator."""

    unresolved_profiles: Annotated[list[Name], Field(max_length=16)] = []

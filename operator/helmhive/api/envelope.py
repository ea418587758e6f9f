"""The Envelope kind: the fixed outer bounds of one job kind.

Envelopes are defined in code (:mod:`helmhive.policy.envelopes`) and published by the
operator as cluster-scoped, read-only objects. The objects are a reference copy: the
operator restores them if anyone edits them, and only the code catalogue is trusted.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import Field

from helmhive.api.common import (
    ApiModel,
    FilesystemAccess,
    JobKind,
    LabelMap,
    Message,
    NetworkAccess,
    SessionPolicy,
    StatusBase,
    ToolKind,
)

__all__ = [
    "Capability",
    "EnvelopeClass",
    "EnvelopeSpec",
    "EnvelopeStatus",
    "MemoryAccess",
    "OutputContract",
    "OutputFormat",
]

Capability = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
"""A capability name a runner advertises, for example ``structured-output``."""


class OutputFormat(enum.StrEnum):
    """``text`` is free prose; ``structured`` is one JSON document checked against a schema."""

    TEXT = "text"
    STRUCTURED = "structured"


class EnvelopeClass(enum.StrEnum):
    PROBE = "probe"
    GOVERNED_CHANGE = "governed-change"
    SUGGESTION = "suggestion"


class MemoryAccess(enum.StrEnum):
    ALLOWED = "allowed"
    FORBIDDEN = "forbidden"


class OutputContract(ApiModel):
    """What a job must return. A profile may add a schema; the envelope's always applies too."""

    format: OutputFormat
    json_schema: Annotated[
        dict[str, Any] | None,
        Field(
            alias="schema",
            description="JSON Schema (draft 2020-12) the structured output must satisfy.",
            json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        ),
    ] = None


class EnvelopeSpec(ApiModel):
    """The maximum a job of this kind may do. A profile can narrow it and never widen it."""

    job_kind: JobKind
    envelope_class: Annotated[EnvelopeClass, Field(alias="class")]
    description: Message
    max_tools: Annotated[list[ToolKind], Field(max_length=16)]
    filesystem: FilesystemAccess
    network: NetworkAccess
    output_contract: OutputContract
    required_capabilities: Annotated[list[Capability], Field(max_length=16)] = []
    required_labels: LabelMap = {}
    session_policies: Annotated[list[SessionPolicy], Field(min_length=1, max_length=3)]
    memory: MemoryAccess


class EnvelopeStatus(StatusBase):
    """Written by the operator: whether the object still matches the code catalogue."""

    content_hash: Annotated[str, Field(max_length=80)] | None = None

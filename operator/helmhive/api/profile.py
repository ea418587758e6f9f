"""The Profile kind: how one kind of agent job runs, within its envelope.

A profile names an envelope and may only narrow it. Its effective form (narrowed to the
envelope, requirements unioned with the envelope's) is computed by
:func:`helmhive.policy.profiles.narrowing.decide_profile` and written to status by the operator.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, StringConstraints

from helmhive.api.common import (
    ApiModel,
    FilesystemAccess,
    JobKind,
    LabelMap,
    LongText,
    Message,
    NetworkAccess,
    ReasoningEffort,
    Sensitivity,
    SessionPolicy,
    StatusBase,
    ToolKind,
)
from helmhive.api.envelope import Capability, OutputContract

__all__ = [
    "EffectiveProfile",
    "MemoryPolicy",
    "ModelId",
    "ProfileSpec",
    "ProfileStatus",
    "ProviderMapping",
    "ProviderName",
    "SessionScope",
    "SessionSettings",
]

ProviderName = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
"""A provider name as runners report it: ``anthropic``, ``openai``, ``google``, ``reference``…"""

ModelId = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@\[\]-]*$")
]
"""A provider's own model identifier, exactly as the runner advertises it."""


class ProviderMapping(ApiModel):
    """One provider choice. Without ``model`` the runner-reported default is used."""

    provider: ProviderName
    model: ModelId | None = None
    fallback_models: Annotated[list[ModelId], Field(max_length=8)] = []
    reasoning_effort: ReasoningEffort | None = None


class SessionScope(enum.StrEnum):
    """What a session binding is keyed on besides workspace, profile, provider and credential."""

    WORKSPACE = "workspace"
    SERVICE = "service"


class SessionSettings(ApiModel):
    policy: SessionPolicy = SessionPolicy.FRESH
    scope: SessionScope = SessionScope.WORKSPACE


class MemoryPolicy(ApiModel):
    """Whether memory is injected, and up to which sensitivity."""

    enabled: bool = False
    max_sensitivity: Sensitivity = Sensitivity.INTERNAL
    max_records: Annotated[int, Field(ge=0, le=20)] = 20


class ProfileSpec(ApiModel):
    """What a platform team commits for one kind of job."""

    envelope: JobKind
    purpose: Message
    instructions: LongText = ""
    provider_mappings: Annotated[list[ProviderMapping], Field(max_length=8)]
    tools: Annotated[list[ToolKind], Field(max_length=16)] | None = None
    filesystem: FilesystemAccess | None = None
    network: NetworkAccess | None = None
    output_contract: OutputContract | None = None
    session: SessionSettings = SessionSettings()
    memory: MemoryPolicy = MemoryPolicy()
    required_labels: LabelMap = {}
    required_capabilities: Annotated[list[Capability], Field(max_length=16)] = []
    allow_model_override: bool = False


class EffectiveProfile(ApiModel):
    """The profile narrowed to its envelope; what routing and execution use."""

    envelope: JobKind
    tools: Annotated[list[ToolKind], Field(max_length=16)]
    filesystem: FilesystemAccess
    network: NetworkAccess
    output_contract: OutputContract
    session: SessionSettings
    memory: MemoryPolicy
    required_labels: LabelMap
    required_capabilities: Annotated[list[Capability], Field(max_length=32)]
    provider_mappings: Annotated[list[ProviderMapping], Field(max_length=8)]
    allow_model_override: bool
    instructions: LongText
    purpose: Message


class ProfileStatus(StatusBase):
    """Written by the operator."""

    effective: EffectiveProfile | None = None
    current_revision: Annotated[str, Field(max_length=253)] | None = None
    current_hash: Annotated[str, Field(max_length=80)] | None = None
    revisions: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=64)] = []

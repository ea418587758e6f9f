"""Shared building blocks of the ``helmhive.dev/v1alpha1`` API: bounded types, conditions, refs.

Everything here is a pydantic v2 model or annotated type. Every string has a maximum
length and every list a maximum number of items, so the generated CRDs are bounded too
(CEL cost estimation and etcd's object limit both depend on that).

This module does no I/O and imports no Kubernetes client.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

__all__ = [
    "ATOMIC_OBJECT",
    "DNS_LABEL_PATTERN",
    "DNS_SUBDOMAIN_PATTERN",
    "ApiModel",
    "Condition",
    "ConditionStatus",
    "ControlState",
    "FilesystemAccess",
    "JobKind",
    "LabelKey",
    "LabelMap",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LabelValue",
    "LocalObjectRef",
    "LongText",
    "Message",
    "Name",
    "NetworkAccess",
    "ReasoningEffort",
    "SecretKeyRef",
    "Sensitivity",
    "SessionPolicy",
    "ShortText",
    "StatusBase",
    "Timestamp",
    "ToolKind",
    "Url",
    "immutable",
]

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

TIMESTAMP_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
Timestamp = Annotated[dt.datetime, Field(json_schema_extra={"pattern": TIMESTAMP_PATTERN})]
"""An RFC 3339 time in a spec. The pattern keeps the API server's ``date-time`` (which also takes
``…ZTjunk`` or a ``+25:00`` offset) to what the operator parses, so a time it admits is a time."""

Name = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
"""A Kubernetes object name (DNS-1123 subdomain)."""

ShortText = Annotated[str, StringConstraints(max_length=256)]
Message = Annotated[str, StringConstraints(max_length=1024)]
LongText = Annotated[str, StringConstraints(max_length=16384)]
Url = Annotated[str, StringConstraints(min_length=1, max_length=2048)]
LabelKey = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=317,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    ),
]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")]
LabelMap = Annotated[dict[LabelKey, LabelValue], Field(max_length=32)]


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
        frozen=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """Serialise as the API server stores it: camelCase, unset fields omitted."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


ATOMIC_OBJECT: dict[str, Any] = {"x-kubernetes-map-type": "atomic"}
"""``json_schema_extra`` for an object written whole by one step: the API server tracks it as one
field in ``managedFields`` instead of one entry per leaf. That keeps the stored object smaller and
cheaper to decode, merge and validate on every write (about a seventh of the API server's CPU per
routed job, docs/performance.md). JSON merge patches still merge into it as before."""


def immutable(message: str) -> dict[str, Any]:
    """Return ``json_schema_extra`` for a field that may not change once the object exists."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": message}]}


class JobKind(enum.StrEnum):
    """The job kinds the specification names; each has exactly one envelope."""

    CONNECTION_TEST = "connection-test"
    IMPLEMENTATION_PROBE = "implementation-probe"
    REVIEW_PROBE = "review-probe"
    CHANGE_PLANNING = "change-planning"
    CHANGE_IMPLEMENTATION = "change-implementation"
    CHANGE_REVIEW = "change-review"
    POLICY_SUGGESTION = "policy-suggestion"


class ToolKind(enum.StrEnum):
    """Tools an agent may be offered, named by the Agent Client Protocol's tool kinds."""

    READ = "read"
    SEARCH = "search"
    THINK = "think"
    EDIT = "edit"
    DELETE = "delete"
    MOVE = "move"
    EXECUTE = "execute"
    FETCH = "fetch"


class FilesystemAccess(enum.StrEnum):
    """Workspace filesystem access, ordered ``none < read < write``."""

    NONE = "none"
    READ = "read"
    WRITE = "write"


class NetworkAccess(enum.StrEnum):
    """Network access from the agent's sandbox, ordered ``disabled < enabled``."""

    DISABLED = "disabled"
    ENABLED = "enabled"


class SessionPolicy(enum.StrEnum):
    """How a job relates to earlier sessions of the same binding."""

    FRESH = "fresh"
    RESUME = "resume"
    FORK = "fork"


class Sensitivity(enum.StrEnum):
    """Memory sensitivity, ordered ``public < internal < confidential < restricted``."""

    PUBLIC = "public"
    INTERNAL = "internal"
    CONFIDENTIAL = "confidential"
    RESTRICTED = "restricted"


class ReasoningEffort(enum.StrEnum):
    """Reasoning effort asked of a model, where the agent offers it."""

    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    MAX = "max"


class ControlState(enum.StrEnum):
    """A runner's control state, set by an administrator."""

    ACTIVE = "Active"
    DRAINING = "Draining"
    DISABLED = "Disabled"
    REVOKED = "Revoked"


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A Kubernetes-style condition (the shape of ``metav1.Condition``)."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Z][A-Za-z0-9]*$")]
    status: ConditionStatus
    reason: Annotated[
        str,
        StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
    ]
    message: Message = ""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    last_transition_time: dt.datetime


class StatusBase(ApiModel):
    """Fields every status has: the generation it reflects and its conditions."""

    model_config = ConfigDict(extra="ignore")

    observed_generation: Annotated[int, Field(ge=0)] | None = None
    conditions: Annotated[
        list[Condition],
        Field(
            max_length=16,
            json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        ),
    ] = []


class LocalObjectRef(ApiModel):
    """A reference to an object in the same namespace."""

    name: Name


class SecretKeyRef(ApiModel):
    """A key in a Secret in the same namespace."""

    name: Name
    key: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] | None = None


class LabelSelectorRequirement(ApiModel):
    key: LabelKey
    operator: Annotated[str, Field(pattern=r"^(In|NotIn|Exists|DoesNotExist)$", max_length=16)]
    values: Annotated[list[LabelValue], Field(max_length=32)] = []


class LabelSelector(ApiModel):
    """A Kubernetes label selector; an empty selector matches everything."""

    match_labels: LabelMap = {}
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=16)] = []

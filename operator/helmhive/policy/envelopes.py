"""The envelope catalogue: one immutable envelope per job kind, defined here and nowhere else.

The specification fixes the rules this table follows:

* every governed-change envelope requires structured output, the ``domain:code`` label and
  disabled network, and allows only fresh sessions and no memory;
* only implementation envelopes allow workspace writes;
* review envelopes add diff review and forbid writes.

The operator publishes these as cluster-scoped Envelope objects and restores any edit.
This module does no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from helmhive.api.common import FilesystemAccess, JobKind, NetworkAccess, SessionPolicy, ToolKind
from helmhive.api.envelope import (
    EnvelopeClass,
    EnvelopeSpec,
    MemoryAccess,
    OutputContract,
    OutputFormat,
)

__all__ = [
    "CAP_DIFF_REVIEW",
    "CAP_STRUCTURED_OUTPUT",
    "CAP_WORKSPACE_WRITE",
    "ENVELOPES",
    "GOVERNED_LABELS",
    "envelope_hash",
    "get_envelope",
    "is_governed",
    "is_implementation",
    "is_review",
]

CAP_STRUCTURED_OUTPUT = "structured-output"
CAP_DIFF_REVIEW = "diff-review"
CAP_WORKSPACE_WRITE = "workspace-write"
GOVERNED_LABELS: Mapping[str, str] = MappingProxyType({"domain": "code"})

_READ_TOOLS = [ToolKind.READ, ToolKind.SEARCH, ToolKind.THINK]
_WRITE_TOOLS = [*_READ_TOOLS, ToolKind.EDIT, ToolKind.DELETE, ToolKind.MOVE, ToolKind.EXECUTE]
_ALL_SESSIONS = [SessionPolicy.FRESH, SessionPolicy.RESUME, SessionPolicy.FORK]

_FINDINGS: dict[str, Any] = {
    "type": "array",
    "maxItems": 64,
    "items": {
        "type": "object",
        "required": ["severity", "message"],
        "properties": {
            "severity": {"enum": ["info", "minor", "major", "blocker"]},
            "file": {"type": "string", "maxLength": 512},
            "line": {"type": "integer", "minimum": 0},
            "message": {"type": "string", "maxLength": 2000},
        },
    },
}
_REVIEW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["verdict", "summary", "findings"],
    "properties": {
        "verdict": {"enum": ["approve", "request-changes"]},
        "summary": {"type": "string", "maxLength": 4000},
        "findings": _FINDINGS,
        "criteria": {
            "type": "array",
            "maxItems": 32,
            "items": {
                "type": "object",
                "required": ["criterion", "met"],
                "properties": {
                    "criterion": {"type": "integer", "minimum": 0, "maximum": 31},
                    "met": {"type": "boolean"},
                    "note": {"type": "string", "maxLength": 1000},
                },
            },
        },
    },
}
_PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["summary", "steps"],
    "properties": {
        "summary": {"type": "string", "maxLength": 4000},
        "steps": {
            "type": "array",
            "minItems": 1,
            "maxItems": 32,
            "items": {
                "type": "object",
                "required": ["title"],
                "properties": {
                    "title": {"type": "string", "maxLength": 256},
                    "detail": {"type": "string", "maxLength": 2000},
                },
            },
        },
        "risks": {"type": "array", "maxItems": 16, "items": {"type": "string", "maxLength": 1000}},
    },
}
_IMPLEMENTATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["summary", "filesChanged"],
    "properties": {
        "summary": {"type": "string", "maxLength": 4000},
        "filesChanged": {"type": "array", "maxItems": 256, "items": {"type": "string", "maxLength": 512}},
        "notes": {"type": "string", "maxLength": 4000},
    },
}
_SUGGESTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["suggestions"],
    "properties": {
        "suggestions": {
            "type": "array",
            "maxItems": 20,
            "items": {
                # Everything a MemoryRecord needs but its source, which the export sets to the job
                # (helmhive.api.suggestion.Suggestion; docs/suggestions.md).
                "type": "object",
                "required": ["kind", "scope", "text", "sensitivity", "rationale"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                    "kind": {"enum": ["decision", "constraint"]},
                    "scope": {
                        "type": "object",
                        "required": ["type"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"enum": ["workspace", "service"]},
                            "service": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": 63,
                                "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                            },
                        },
                    },
                    "text": {"type": "string", "minLength": 1, "maxLength": 2000},
                    "sensitivity": {"enum": ["public", "internal", "confidential", "restricted"]},
                    "rationale": {"type": "string", "minLength": 1, "maxLength": 2000},
                    "expiresAt": {"type": "string", "format": "date-time", "maxLength": 64},
                },
            },
        }
    },
}


def _structured(schema: dict[str, Any]) -> OutputContract:
    return OutputContract(format=OutputFormat.STRUCTURED, json_schema=schema)


_TEXT = OutputContract(format=OutputFormat.TEXT)


def _governed(
    kind: JobKind,
    description: str,
    *,
    tools: list[ToolKind],
    filesystem: FilesystemAccess,
    schema: dict[str, Any],
    capabilities: list[str],
) -> EnvelopeSpec:
    return EnvelopeSpec(
        job_kind=kind,
        envelope_class=EnvelopeClass.GOVERNED_CHANGE,
        description=description,
        max_tools=tools,
        filesystem=filesystem,
        network=NetworkAccess.DISABLED,
        output_contract=_structured(schema),
        required_capabilities=[CAP_STRUCTURED_OUTPUT, *capabilities],
        required_labels=dict(GOVERNED_LABELS),
        session_policies=[SessionPolicy.FRESH],
        memory=MemoryAccess.FORBIDDEN,
    )


_CATALOGUE = (
    EnvelopeSpec(
        job_kind=JobKind.CONNECTION_TEST,
        envelope_class=EnvelopeClass.PROBE,
        description="Checks that a runner's login works: one short answer, no tools, no files.",
        max_tools=[ToolKind.THINK],
        filesystem=FilesystemAccess.NONE,
        network=NetworkAccess.DISABLED,
        output_contract=_TEXT,
        session_policies=[SessionPolicy.FRESH],
        memory=MemoryAccess.FORBIDDEN,
    ),
    EnvelopeSpec(
        job_kind=JobKind.IMPLEMENTATION_PROBE,
        envelope_class=EnvelopeClass.PROBE,
        description="Tries an implementation in a scratch copy of the workspace; may write there.",
        max_tools=_WRITE_TOOLS,
        filesystem=FilesystemAccess.WRITE,
        network=NetworkAccess.DISABLED,
        output_contract=_TEXT,
        required_capabilities=[CAP_WORKSPACE_WRITE],
        session_policies=_ALL_SESSIONS,
        memory=MemoryAccess.ALLOWED,
    ),
    EnvelopeSpec(
        job_kind=JobKind.REVIEW_PROBE,
        envelope_class=EnvelopeClass.PROBE,
        description="Reviews a diff read-only and returns structured findings.",
        max_tools=_READ_TOOLS,
        filesystem=FilesystemAccess.READ,
        network=NetworkAccess.DISABLED,
        output_contract=_structured(_REVIEW_SCHEMA),
        required_capabilities=[CAP_STRUCTURED_OUTPUT, CAP_DIFF_REVIEW],
        session_policies=_ALL_SESSIONS,
        memory=MemoryAccess.ALLOWED,
    ),
    _governed(
        JobKind.CHANGE_PLANNING,
        "Plans a governed change from its immutable request, criteria and exact source; read-only.",
        tools=_READ_TOOLS,
        filesystem=FilesystemAccess.READ,
        schema=_PLAN_SCHEMA,
        capabilities=[],
    ),
    _governed(
        JobKind.CHANGE_IMPLEMENTATION,
        "Implements a planned governed change in the workspace and produces a patch.",
        tools=_WRITE_TOOLS,
        filesystem=FilesystemAccess.WRITE,
        schema=_IMPLEMENTATION_SCHEMA,
        capabilities=[CAP_WORKSPACE_WRITE],
    ),
    _governed(
        JobKind.CHANGE_REVIEW,
        "Reviews a governed change's patch against its criteria; read-only, with diff review.",
        tools=_READ_TOOLS,
        filesystem=FilesystemAccess.READ,
        schema=_REVIEW_SCHEMA,
        capabilities=[CAP_DIFF_REVIEW],
    ),
    EnvelopeSpec(
        job_kind=JobKind.POLICY_SUGGESTION,
        envelope_class=EnvelopeClass.SUGGESTION,
        description="Suggests memory records (decisions, constraints) for humans to approve; read-only.",
        max_tools=_READ_TOOLS,
        filesystem=FilesystemAccess.READ,
        network=NetworkAccess.DISABLED,
        output_contract=_structured(_SUGGESTION_SCHEMA),
        required_capabilities=[CAP_STRUCTURED_OUTPUT],
        session_policies=[SessionPolicy.FRESH, SessionPolicy.RESUME],
        memory=MemoryAccess.ALLOWED,
    ),
)

ENVELOPES: Mapping[JobKind, EnvelopeSpec] = MappingProxyType({e.job_kind: e for e in _CATALOGUE})


def get_envelope(kind: JobKind | str) -> EnvelopeSpec | None:
    """Return a deep copy of the envelope for ``kind``, or None for an unknown kind."""
    try:
        found = ENVELOPES[JobKind(kind)]
    except ValueError:
        return None
    return found.model_copy(deep=True)


def is_governed(kind: JobKind) -> bool:
    return ENVELOPES[kind].envelope_class is EnvelopeClass.GOVERNED_CHANGE


def is_implementation(kind: JobKind) -> bool:
    return kind in (JobKind.IMPLEMENTATION_PROBE, JobKind.CHANGE_IMPLEMENTATION)


def is_review(kind: JobKind) -> bool:
    return kind in (JobKind.REVIEW_PROBE, JobKind.CHANGE_REVIEW)


def envelope_hash(spec: EnvelopeSpec) -> str:
    """Return ``sha256:<hex>`` of the envelope's canonical JSON wire form."""
    canonical = json.dumps(spec.to_wire(), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

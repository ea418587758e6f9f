"""Policy suggestions: what a ``policy-suggestion`` job's output holds, and the SuggestionExport kind.

A suggestion is an agent's proposal for one MemoryRecord. It carries everything the record needs
except its provenance: the source of an exported record is always the job that suggested it,
filled in by the export, never by the agent. A suggestion is never memory: only a MemoryRecord a
human committed is (``docs/suggestions.md``).

A SuggestionExport is the audit request ``helmhive suggestions export`` creates before it writes
any file: which job, which suggestions (by digest), and who (``exportedBy``, which the
``helmhive-suggestion-export`` admission policy requires to be the requester's own username). The
operator turns it into a ``SuggestionsExported`` AuditRecord; it applies nothing.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from helmhive.api.common import DNS_LABEL_PATTERN, ApiModel, Name, Sensitivity, ShortText, StatusBase, Timestamp
from helmhive.api.memory import MEMORY_TEXT_MAX, SUGGESTION_DIGEST_PATTERN, CheckedMemoryScope, MemoryKind

__all__ = [
    "MAX_SUGGESTIONS",
    "SUGGESTION_DIGEST_PATTERN",
    "ExportedSuggestion",
    "Suggestion",
    "SuggestionExportSpec",
    "SuggestionExportStatus",
    "SuggestionOutput",
]

MAX_SUGGESTIONS = 20
Digest = Annotated[str, StringConstraints(pattern=SUGGESTION_DIGEST_PATTERN, max_length=71)]
RecordName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]


class Suggestion(ApiModel):
    """One suggested MemoryRecord, as the agent wrote it (the envelope's output schema, item by item)."""

    name: RecordName | None = None
    """The record's name; without one the export names it after the job and the suggestion's digest."""
    kind: MemoryKind
    scope: CheckedMemoryScope
    text: Annotated[str, StringConstraints(min_length=1, max_length=MEMORY_TEXT_MAX)]
    sensitivity: Sensitivity
    rationale: Annotated[str, StringConstraints(min_length=1, max_length=2000)]
    """Why the agent suggests it: shown to the reviewer as a comment in the exported file, not in the record."""
    expires_at: Timestamp | None = None


class SuggestionOutput(ApiModel):
    """A ``policy-suggestion`` job's ``status.result.output``."""

    suggestions: Annotated[list[Suggestion], Field(max_length=MAX_SUGGESTIONS)]


class ExportedSuggestion(ApiModel):
    """One suggestion written to a file: its digest and the record name it was written as."""

    digest: Digest
    record: RecordName


class SuggestionExportSpec(ApiModel):
    job: Name
    """The policy-suggestion AgentJob, in this namespace."""
    job_uid: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    suggestions: Annotated[list[ExportedSuggestion], Field(min_length=1, max_length=MAX_SUGGESTIONS)]
    exported_by: ShortText
    """The requester's username; the ``helmhive-suggestion-export`` policy refuses any other."""


class SuggestionExportStatus(StatusBase):
    """Written by the operator: ``Recorded`` once the AuditRecord exists."""

    audit_record: Annotated[str, StringConstraints(max_length=253)] | None = None

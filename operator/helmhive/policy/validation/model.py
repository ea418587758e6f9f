"""The values of offline validation: a document read, an issue found, the report, an object under check. Pure.

Shared by the steps of :mod:`helmhive.policy.validation.manifests` (which re-exports the public ones) and its
cross-object rules (:mod:`helmhive.policy.validation.refs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from helmhive.api.reasons import Reason
from helmhive.policy.violations import Violation

__all__ = [
    "CheckedObject",
    "SkippedDocument",
    "SourceDocument",
    "ValidationIssue",
    "ValidationReport",
    "one_line",
]


@dataclass(frozen=True, kw_only=True)
class SourceDocument:
    """One YAML document as the command line read it.

    ``index`` is its 0-based position in ``file``. When the file could not be read or
    parsed, ``load_reason`` and ``load_message`` say why and ``body`` is None.
    """

    file: str
    index: int = 0
    body: Any = None
    load_reason: Reason | None = None
    load_message: str = ""


@dataclass(frozen=True, kw_only=True)
class ValidationIssue:
    """One error, printed as ``file:kind/name: field.path: Reason: message``."""

    file: str
    kind: str
    name: str
    field_path: str
    reason: Reason
    message: str
    document: int = 0
    line: int | None = None

    def render(self) -> str:
        """One line, whatever the input held: control characters are shown escaped."""
        kind = one_line(self.kind) or "?"
        name = one_line(self.name) or f"#{self.document + 1}"
        path = one_line(self.field_path) or "-"
        return f"{one_line(self.file)}:{kind}/{name}: {path}: {self.reason.value}: {one_line(self.message)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "document": self.document,
            "kind": self.kind,
            "name": self.name,
            "fieldPath": self.field_path,
            "reason": self.reason.value,
            "message": self.message,
        }


@dataclass(frozen=True, kw_only=True)
class SkippedDocument:
    """A document that is not a Helmhive object, and why it was not checked."""

    file: str
    document: int
    why: str


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    issues: tuple[ValidationIssue, ...]
    objects: int
    skipped: tuple[SkippedDocument, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.issues


@dataclass(kw_only=True)
class CheckedObject:
    """A Helmhive object found in the set (parsed when ``spec`` is not None)."""

    doc: SourceDocument
    kind: str
    name: str
    namespace: str
    annotations: Mapping[str, str]
    spec: BaseModel | None = None
    issues: list[ValidationIssue] = field(default_factory=list)

    def issue(self, path: str, reason: Reason, message: str) -> None:
        self.issues.append(
            ValidationIssue(
                file=self.doc.file,
                kind=self.kind,
                name=self.name,
                field_path=path,
                reason=reason,
                message=message,
                document=self.doc.index,
            )
        )

    def violation(self, found: Violation) -> None:
        self.issue(found.field_path, found.reason, found.message)


def one_line(text: str) -> str:
    """``text`` with control characters (a newline in a name, say) escaped as Python would."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)

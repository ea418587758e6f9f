"""``helmhive validate PATH...``: check manifests offline, with no cluster.

This module owns the I/O: finding files (a directory is searched recursively for
``*.yaml``, ``*.yml`` and ``*.json``, skipping hidden directories), reading them,
parsing multi-document YAML and finding the line of each issue. The rules live in
:mod:`helmhive.policy.validation.manifests`.

Output: one line per issue on stdout, ``file:kind/name: field.path: Reason: message``,
and a summary on stderr; or, with ``--output json``, one JSON object with every issue
(including its line) for CI annotations. Exit status: 0 when every object is valid,
1 when there is any issue, 2 for a usage error. Bad input never produces a traceback.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from helmhive.api.manifest_yaml import JsonStreamError, ManifestLoader, is_json_stream, load_json_stream
from helmhive.api.reasons import Reason
from helmhive.policy.validation.manifests import (
    EXTERNAL_PROFILES_ANNOTATION,
    SourceDocument,
    ValidationIssue,
    ValidationReport,
    validate_documents,
)
from helmhive.policy.violations import split_field_path

__all__ = ["ValidateFormat", "find_line", "load_documents", "load_paths", "run"]

_SUFFIXES = (".yaml", ".yml", ".json")


class ValidateFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Loaded:
    documents: list[SourceDocument]
    nodes: dict[tuple[str, int], yaml.Node]
    issues: list[ValidationIssue]
    files: int


def _files(path: Path) -> Iterator[Path]:
    """The manifests under ``path``: a broken link with a manifest's name is yielded too, to be reported."""
    if path.is_dir():
        for found in sorted(path.rglob("*")):
            relative = found.relative_to(path).parts
            if found.suffix not in _SUFFIXES or any(p.startswith(".") for p in relative) or found.is_dir():
                continue
            if found.is_file() or found.is_symlink():
                yield found
    else:
        yield path


def _missing(path: Path) -> str:
    """Why ``path`` cannot be opened: a dangling or looping link is not "no such file"."""
    try:
        path.stat()
    except OSError as exc:
        if path.is_symlink():
            return f"cannot read: a symbolic link that leads nowhere ({exc.strerror})"
        return exc.strerror.lower() if exc.strerror else "no such file or directory"
    return "no such file or directory"


def load_documents(*, text: str, file: str) -> tuple[list[SourceDocument], dict[int, yaml.Node]]:
    """Parse a manifest stream as kubectl does; a syntax error becomes an ``InvalidYaml`` document.

    A stream whose first non-blank character is ``{`` is JSON objects; when the first or second
    of them does not parse, the rest is read as YAML from there, as kubectl does. Documents
    before an error are kept. The returned nodes (by document index) locate issues; they are
    absent when the stream does not compose.
    """
    if not is_json_stream(text):
        return _load_yaml(text=text, file=file, first=0)
    try:
        bodies = load_json_stream(text)
    except JsonStreamError as err:
        head = [SourceDocument(file=file, index=i, body=body) for i, body in enumerate(err.decoded)]
        if len(err.decoded) > 1:
            message = f"line {err.line}, column {err.column}: {err}"
            failed = SourceDocument(file=file, index=len(head), load_reason=Reason.INVALID_YAML, load_message=message)
            return [*head, failed], {}
        # Padded with the lines before it, so the YAML's marks are the file's lines.
        tail = "\n" * text.count("\n", 0, err.offset) + text[err.offset :]
        documents, nodes = _load_yaml(text=tail, file=file, first=len(head))
        return [*head, *_not_json_either(documents, err)], nodes
    documents = [SourceDocument(file=file, index=i, body=body) for i, body in enumerate(bodies)]
    found: dict[int, yaml.Node] = {}
    if len(bodies) == 1:
        try:  # JSON is YAML but for tabs, which JSON allows only where spaces could be
            node = yaml.compose(text.replace("\t", " "), Loader=ManifestLoader)
        except Exception:  # only for line numbers
            node = None
        if node is not None:
            found[0] = node
    return documents, found


def _not_json_either(documents: list[SourceDocument], err: JsonStreamError) -> list[SourceDocument]:
    """A stream that is neither JSON nor YAML: say what the JSON reader found too."""
    return [
        dataclasses.replace(
            d, load_message=f"not JSON (line {err.line}, column {err.column}: {err}), nor YAML: {d.load_message}"
        )
        if d.load_reason is Reason.INVALID_YAML
        else d
        for d in documents
    ]


def _load_yaml(*, text: str, file: str, first: int) -> tuple[list[SourceDocument], dict[int, yaml.Node]]:
    documents: list[SourceDocument] = []
    try:
        for index, body in enumerate(yaml.load_all(text, Loader=ManifestLoader), start=first):
            documents.append(SourceDocument(file=file, index=index, body=body))
    except Exception as exc:  # a YAML error, nesting too deep, or anything a constructor raised
        documents.append(
            SourceDocument(
                file=file,
                index=first + len(documents),
                load_reason=Reason.INVALID_YAML,
                load_message=_yaml_problem(exc),
            )
        )
    nodes: dict[int, yaml.Node] = {}
    try:
        for index, node in enumerate(yaml.compose_all(text, Loader=ManifestLoader), start=first):
            if node is not None:
                nodes[index] = node
    except Exception:  # only for line numbers
        pass
    return documents, nodes


def _yaml_problem(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply to read (collections inside collections, hundreds of levels)"
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    return f"{where}{problem}"[:1024]


def load_paths(paths: Sequence[Path]) -> _Loaded:
    """Read every manifest under ``paths``; unreadable paths become issues, never exceptions."""
    documents: list[SourceDocument] = []
    nodes: dict[tuple[str, int], yaml.Node] = {}
    issues: list[ValidationIssue] = []
    files = 0
    seen: set[Path] = set()
    for root in paths:
        if not root.exists():
            issues.append(_file_issue(str(root), _missing(root)))
            continue
        for path in _files(root):
            try:
                real = path.resolve(strict=True)
            except (OSError, RuntimeError):
                issues.append(_file_issue(str(path), _missing(path)))
                continue
            if real in seen:  # named twice (a folder and a file in it): read once
                continue
            seen.add(real)
            files += 1
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                issues.append(_file_issue(str(path), f"cannot read: {exc}"))
                continue
            docs, doc_nodes = load_documents(text=text, file=str(path))
            documents += docs
            nodes.update({(str(path), i): n for i, n in doc_nodes.items()})
    return _Loaded(documents=documents, nodes=nodes, issues=issues, files=files)


def _file_issue(file: str, message: str) -> ValidationIssue:
    return ValidationIssue(file=file, kind="", name="", field_path="", reason=Reason.UNREADABLE_FILE, message=message)


def find_line(node: yaml.Node, path: str) -> int:
    """Return the 1-based line of ``path`` in a document, or of its nearest ancestor present."""
    current = node
    for segment in split_field_path(path):
        child: yaml.Node | None = None
        if isinstance(current, yaml.MappingNode):
            child = next((v for k, v in current.value if getattr(k, "value", None) == segment), None)
            if child is None:
                # An unknown or misplaced field is best shown at its key.
                child = next((k for k, _ in current.value if getattr(k, "value", None) == str(segment)), None)
        elif isinstance(current, yaml.SequenceNode) and isinstance(segment, int):
            child = current.value[segment] if 0 <= segment < len(current.value) else None
        if child is None:
            break
        current = child
    return int(current.start_mark.line) + 1


def _with_lines(issues: Sequence[ValidationIssue], nodes: dict[tuple[str, int], yaml.Node]) -> list[ValidationIssue]:
    out = []
    for issue in issues:
        node = nodes.get((issue.file, issue.document))
        line = find_line(node, issue.field_path) if node is not None else None
        out.append(dataclasses.replace(issue, line=line))
    return out


def _emit(report: ValidationReport, issues: list[ValidationIssue], files: int, output: ValidateFormat) -> None:
    if output is ValidateFormat.JSON:
        payload: dict[str, Any] = {
            "valid": not issues,
            "files": files,
            "objects": report.objects,
            "issues": [i.to_json() for i in issues],
            "skipped": [{"file": s.file, "document": s.document, "why": s.why} for s in report.skipped],
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    for issue in issues:
        typer.echo(issue.render())
    for skip in report.skipped:
        typer.echo(f"skipped {skip.file} document {skip.document + 1}: {skip.why}", err=True)
    if issues:
        typer.echo(
            f"{len(issues)} error{'s' if len(issues) != 1 else ''} "
            f"({report.objects} Helmhive objects in {files} files)",
            err=True,
        )
    else:
        typer.echo(f"{report.objects} Helmhive objects in {files} files are valid", err=True)


def run(
    paths: Annotated[
        list[Path],
        typer.Argument(metavar="PATH", help="Manifest files, or directories searched for *.yaml, *.yml, *.json."),
    ],
    output: Annotated[
        ValidateFormat, typer.Option("--output", "-o", metavar="text|json", help="text, or json for CI.")
    ] = (ValidateFormat.TEXT),
    external_profile: Annotated[
        list[str] | None,
        typer.Option(
            "--external-profile",
            metavar="NAME",
            help="A profile that exists outside these files (NAME or NAMESPACE/NAME); repeatable. "
            f"Objects can also list them in the {EXTERNAL_PROFILES_ANNOTATION} annotation.",
        ),
    ] = None,
) -> None:
    """Validate Helmhive manifests offline: schema, envelopes, profiles, memory and references."""
    loaded = load_paths(paths)
    report = validate_documents(documents=loaded.documents, external_profiles=external_profile or ())
    issues = [*loaded.issues, *_with_lines(report.issues, loaded.nodes)]
    if report.objects == 0 and not issues:
        issues.append(
            ValidationIssue(
                file=", ".join(str(p) for p in paths),
                kind="",
                name="",
                field_path="",
                reason=Reason.NO_OBJECTS,
                message="no Helmhive objects found; nothing was validated",
            )
        )
    _emit(report, issues, loaded.files, output)
    if issues:
        raise typer.Exit(1)

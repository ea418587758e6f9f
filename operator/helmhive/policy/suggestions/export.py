"""From a ``policy-suggestion`` job's output to ready MemoryRecord files. Pure.

:func:`decide_job_suggestions` reads the job (a dict as the API server returns it): each suggestion
in ``status.result.output.suggestions`` gets its digest (:func:`suggestion_digest`), the name of the
record it becomes, and either the record (:func:`build_suggested_record`) or every reason it cannot
be one. The records are checked exactly as ``helmhive validate`` checks files
(:func:`~helmhive.policy.validation.manifests.validate_documents`), together, and with the job's
Workspace when the caller has it (a service scope must name one of its services).

The record's source is always the job: ``source.type: policy-suggestion``, ``source.url`` the job's
API path, ``source.job`` its name, uid and the suggestion's digest. Whatever the agent wrote is
data here, never a decision: nothing is applied, and a file is memory only once a human commits it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml
from pydantic import ValidationError

from helmhive.api.common import JobKind
from helmhive.api.kinds import API_VERSION, GROUP, VERSION
from helmhive.api.manifest_yaml import ManifestDumper
from helmhive.api.memory import MemorySourceType
from helmhive.api.reasons import Reason
from helmhive.api.suggestion import MAX_SUGGESTIONS, ExportedSuggestion, Suggestion, SuggestionExportSpec
from helmhive.policy.validation.manifests import SourceDocument, validate_documents
from helmhive.policy.validation.model import one_line
from helmhive.policy.violations import Violation, field_path

__all__ = [
    "JobSuggestions",
    "StoredOutput",
    "SuggestingJobRef",
    "SuggestionError",
    "SuggestionView",
    "build_record_file",
    "build_stored_output",
    "build_suggested_record",
    "build_suggestion_export",
    "decide_job_suggestions",
    "decide_stored_output",
    "job_api_path",
    "suggestion_digest",
]

_OUTPUT_PATH = ("status", "result", "output", "suggestions")
_NAME_ROOM = 63 - 1 - 10  # a DNS label: the job's name, a dash, ten hex digits of the digest


class SuggestionError(Exception):
    """The job has nothing to export: a fixed reason and a message for a human."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, kw_only=True)
class SuggestingJobRef:
    """The job suggestions come from: what a record's source and the export name."""

    namespace: str
    name: str
    uid: str
    workspace: str


@dataclass(frozen=True, kw_only=True)
class SuggestionView:
    """One suggestion: its position, digest and record name, and the record or why there is none."""

    index: int
    digest: str
    record_name: str
    suggestion: Suggestion | None
    record: dict[str, Any] | None
    problems: tuple[Violation, ...] = ()

    @property
    def valid(self) -> bool:
        return self.record is not None and not self.problems


@dataclass(frozen=True, kw_only=True)
class JobSuggestions:
    job: SuggestingJobRef
    views: tuple[SuggestionView, ...] = field(default=())

    @property
    def valid(self) -> tuple[SuggestionView, ...]:
        return tuple(v for v in self.views if v.valid)


def job_api_path(job: SuggestingJobRef) -> str:
    """The job's path on its API server: what ``kubectl get --raw`` reads, and a record's ``source.url``."""
    return f"/apis/{GROUP}/{VERSION}/namespaces/{job.namespace}/agentjobs/{job.name}"


def suggestion_digest(item: Any) -> str:
    """``sha256:<hex>`` of the suggestion as the agent wrote it (canonical JSON: sorted keys, no spaces)."""
    canonical = json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _default_name(job: SuggestingJobRef, digest: str) -> str:
    stem = job.name.replace(".", "-")[:_NAME_ROOM].rstrip("-")
    return f"{stem}-{digest.removeprefix('sha256:')[:10]}"


def build_suggested_record(*, job: SuggestingJobRef, suggestion: Suggestion, digest: str, name: str) -> dict[str, Any]:
    """The MemoryRecord a suggestion becomes, its source the job (no namespace: it is applied beside its Workspace)."""
    spec: dict[str, Any] = {
        "workspace": job.workspace,
        "scope": suggestion.scope.to_wire(),
        "kind": suggestion.kind.value,
        "text": suggestion.text,
        "source": {
            "type": MemorySourceType.POLICY_SUGGESTION.value,
            "url": job_api_path(job),
            "job": {"name": job.name, "uid": job.uid, "digest": digest},
        },
        "sensitivity": suggestion.sensitivity.value,
    }
    if suggestion.expires_at is not None:
        spec["expiresAt"] = suggestion.model_dump(mode="json", by_alias=True)["expiresAt"]
    return {"apiVersion": API_VERSION, "kind": "MemoryRecord", "metadata": {"name": name}, "spec": spec}


def _parse_problems(err: ValidationError, index: int) -> tuple[Violation, ...]:
    base = (*_OUTPUT_PATH, index)
    return tuple(
        Violation(
            field_path=field_path(*base, *e["loc"]),
            reason=Reason.INVALID_SUGGESTION,
            message=one_line(str(e["msg"]))[:300],
        )
        for e in err.errors()
    )


def _job_ref(job: Mapping[str, Any]) -> SuggestingJobRef:
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    where = f"agentjob {meta.get('namespace')}/{meta.get('name')}"
    if spec.get("jobKind") != JobKind.POLICY_SUGGESTION.value:
        raise SuggestionError(
            Reason.NOT_A_SUGGESTION_JOB,
            f"{where} is a {spec.get('jobKind')!s} job, not a {JobKind.POLICY_SUGGESTION.value} job",
        )
    return SuggestingJobRef(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        workspace=str(spec.get("workspace") or ""),
    )


_OUTPUT_KEY = "output.json"


@dataclass(frozen=True, slots=True)
class StoredOutput:
    """Where the runner kept a job's output too large to be inline (over 16 KiB): its artifacts ConfigMap."""

    config_map: str
    key: str
    sha256: str
    truncated: bool


def _result(job: Mapping[str, Any]) -> Mapping[str, Any]:
    status = job.get("status")
    result = status.get("result") if isinstance(status, Mapping) else None
    return result if isinstance(result, Mapping) else {}


def decide_stored_output(job: Mapping[str, Any]) -> StoredOutput | None:
    """The job's output in its artifacts ConfigMap, when it is not inline; None otherwise."""
    result = _result(job)
    if isinstance(result.get("output"), Mapping):
        return None
    for artifact in result.get("artifacts") or []:
        if isinstance(artifact, Mapping) and artifact.get("key") == _OUTPUT_KEY and artifact.get("kind") == "ConfigMap":
            return StoredOutput(
                config_map=str(artifact.get("name") or ""),
                key=_OUTPUT_KEY,
                sha256=str(artifact.get("sha256") or ""),
                truncated=bool(artifact.get("truncated")),
            )
    return None


def build_stored_output(stored: StoredOutput, text: str | None, *, where: str) -> dict[str, Any]:
    """The output read from ``stored``'s ConfigMap (``text``: its key's value, None if absent), checked.

    Raises :class:`SuggestionError` (``OutputNotReadable``) when the key is missing, the runner cut
    it short (over the artifacts' budget), or its SHA-256 is not the one the job recorded.
    """
    source = f"ConfigMap {stored.config_map} key {stored.key}"
    if stored.truncated:
        raise SuggestionError(Reason.OUTPUT_NOT_READABLE, f"{where}'s output in {source} was cut short; not exported")
    if text is None:
        raise SuggestionError(Reason.OUTPUT_NOT_READABLE, f"{where}'s output: {source} is not there")
    if hashlib.sha256(text.encode()).hexdigest() != stored.sha256:
        raise SuggestionError(
            Reason.OUTPUT_NOT_READABLE, f"{where}'s output in {source} is not the one the job recorded (SHA-256)"
        )
    try:
        output = json.loads(text)
    except ValueError:
        raise SuggestionError(Reason.OUTPUT_NOT_READABLE, f"{where}'s output in {source} is not JSON") from None
    if not isinstance(output, dict):
        raise SuggestionError(Reason.OUTPUT_NOT_READABLE, f"{where}'s output in {source} is not a JSON object")
    return output


def decide_job_suggestions(
    *,
    job: Mapping[str, Any],
    workspace: Mapping[str, Any] | None = None,
    stored_output: Mapping[str, Any] | None = None,
) -> JobSuggestions:
    """Each suggestion of ``job`` with its digest and record, or its problems. Raises :class:`SuggestionError`.

    ``workspace`` is the job's Workspace as read from the cluster, if the caller could read it:
    then a service scope is checked against its services, as ``helmhive validate`` would with
    both files. ``stored_output`` is the output read from the job's artifacts ConfigMap
    (:func:`decide_stored_output`, :func:`build_stored_output`) when it was too large to be inline.
    """
    ref = _job_ref(job)
    result = _result(job)
    output = result.get("output")
    if not isinstance(output, Mapping):
        output = stored_output
    items = output.get("suggestions") if isinstance(output, Mapping) else None
    where = f"agentjob {ref.namespace}/{ref.name}"
    if not isinstance(items, list):
        stored = decide_stored_output(job)
        if stored is not None:  # the caller did not read it
            raise SuggestionError(
                Reason.OUTPUT_NOT_READABLE,
                f"{where} keeps its output in ConfigMap {stored.config_map} (key {stored.key}); read it first",
            )
        raise SuggestionError(
            Reason.NO_SUGGESTIONS, f"{where} has no structured output with suggestions (has it succeeded?)"
        )
    if not items:
        raise SuggestionError(Reason.NO_SUGGESTIONS, f"{where} suggested nothing")
    drafts: list[SuggestionView] = []
    for index, item in enumerate(items[:MAX_SUGGESTIONS]):
        digest = suggestion_digest(item)
        try:
            suggestion = Suggestion.model_validate(item)
        except ValidationError as err:
            drafts.append(
                SuggestionView(
                    index=index,
                    digest=digest,
                    record_name=_default_name(ref, digest),
                    suggestion=None,
                    record=None,
                    problems=_parse_problems(err, index),
                )
            )
            continue
        name = suggestion.name or _default_name(ref, digest)
        record = build_suggested_record(job=ref, suggestion=suggestion, digest=digest, name=name)
        drafts.append(
            SuggestionView(index=index, digest=digest, record_name=name, suggestion=suggestion, record=record)
        )
    return JobSuggestions(job=ref, views=tuple(_checked(drafts, workspace)))


def _checked(drafts: Sequence[SuggestionView], workspace: Mapping[str, Any] | None) -> list[SuggestionView]:
    """Check every record together (duplicate names too) and with the Workspace, as ``helmhive validate`` would."""
    documents = [SourceDocument(file=f"suggestion-{v.index}", body=v.record) for v in drafts if v.record is not None]
    if workspace is not None:
        slim = {
            "apiVersion": API_VERSION,
            "kind": "Workspace",
            "metadata": {"name": str((workspace.get("metadata") or {}).get("name") or "")},
            "spec": dict(workspace.get("spec") or {}),
        }
        documents.append(SourceDocument(file="workspace", body=slim))
    report = validate_documents(documents=documents)
    found: dict[str, list[Violation]] = {}
    for issue in report.issues:
        violation = Violation(field_path=issue.field_path, reason=issue.reason, message=issue.message)
        found.setdefault(issue.file, []).append(violation)
    return [
        replace(view, record=None, problems=problems)
        if (problems := tuple(found.get(f"suggestion-{view.index}", ())))
        else view
        for view in drafts
    ]


def _comment(text: str) -> list[str]:
    """Agent-written text as YAML comment lines: one ``#`` line per line, control characters escaped."""
    return [f"#   {one_line(line)}".rstrip() for line in text.splitlines() or [""]]


def build_record_file(*, job: SuggestingJobRef, view: SuggestionView, total: int, exported_by: str) -> str:
    """The file a valid suggestion is written as: a comment for the reviewer, then the record.

    The comment names the job, the digest and who exported it, and quotes the agent's rationale
    (escaped, each line commented out: it cannot end the comment or add YAML of its own).
    """
    if view.record is None or view.suggestion is None:
        raise ValueError(f"suggestion {view.index} has no record to write")
    lines = [
        f"# Suggested by policy-suggestion job {job.namespace}/{job.name} (uid {job.uid}),",
        f"# suggestion {view.index + 1} of {total}, digest {view.digest};",
        f"# exported by {one_line(exported_by)}. Nothing was applied: this record becomes memory",
        "# only when a reviewer merges it and it is applied like any other MemoryRecord.",
        "# The agent's rationale (for the reviewer; not part of the record):",
        *_comment(view.suggestion.rationale),
    ]
    body = yaml.dump(view.record, sort_keys=False, width=100, allow_unicode=True, Dumper=ManifestDumper)
    return "\n".join(lines) + "\n" + body


def build_suggestion_export(
    *, job: SuggestingJobRef, views: Sequence[SuggestionView], exported_by: str
) -> dict[str, Any]:
    """The SuggestionExport the CLI creates before writing files: the audit request, in the requester's name."""
    spec = SuggestionExportSpec(
        job=job.name,
        job_uid=job.uid,
        suggestions=[ExportedSuggestion(digest=v.digest, record=v.record_name) for v in views],
        exported_by=exported_by,
    )
    prefix = job.name.replace(".", "-")[:40].rstrip("-") + "-"
    return {
        "apiVersion": API_VERSION,
        "kind": "SuggestionExport",
        "metadata": {"generateName": prefix, "namespace": job.namespace},
        "spec": spec.to_wire(),
    }

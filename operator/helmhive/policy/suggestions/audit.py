"""The ``SuggestionsExported`` AuditRecord, built from a SuggestionExport. Pure.

The record is about the job (``object`` is the AgentJob, with its uid, and the record carries the
job's ``job.audit.helmhive.dev/<uid>`` label as routing decisions do), names the actor the
``helmhive-suggestion-export`` admission policy checked (``spec.exportedBy`` equals the requester's
username), and lists each suggestion by digest and record name, never its text. Each digest is
compared with the job's output as the operator read it (``matchesJob``), so a request naming a
digest the job never produced says so.

Its name is deterministic (:func:`suggestion_export_audit_name`): written again after a crash, it
is a 409, which counts as done.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from typing import Any

from helmhive.api.audit import AuditAction, AuditActor, AuditState, AuditSuggestion
from helmhive.api.kinds import API_VERSION
from helmhive.api.suggestion import SuggestionExportSpec
from helmhive.policy.audit.records import build_audit_record
from helmhive.policy.audit.routing import job_audit_label
from helmhive.policy.suggestions.export import suggestion_digest

__all__ = ["build_suggestions_exported_audit", "decide_job_digests", "suggestion_export_audit_name"]


def suggestion_export_audit_name(name: str, uid: str) -> str:
    """The record's name: the export's name and uid, so each export has exactly one."""
    stem = f"suggestionexport-{name}"[:200].rstrip("-.")
    return f"{stem}-{hashlib.sha256(uid.encode()).hexdigest()[:8]}"


def decide_job_digests(job: Mapping[str, Any] | None) -> frozenset[str] | None:
    """The digests of the suggestions in ``job``'s output; None if the job is gone or has none to read."""
    if job is None:
        return None
    result = (job.get("status") or {}).get("result") or {}
    output = result.get("output") if isinstance(result, Mapping) else None
    items = output.get("suggestions") if isinstance(output, Mapping) else None
    if not isinstance(items, list):
        return None
    return frozenset(suggestion_digest(item) for item in items)


def build_suggestions_exported_audit(
    *, export: Mapping[str, Any], job: Mapping[str, Any] | None, now: dt.datetime
) -> dict[str, Any]:
    """The ``SuggestionsExported`` record of ``export`` (a SuggestionExport as a dict).

    ``job`` is the AgentJob as the operator read it (None: not found). A job found with another
    uid than the export names is a different job of the same name, so it counts as gone.
    """
    meta = export.get("metadata") or {}
    name, namespace, uid = str(meta.get("name", "")), str(meta.get("namespace", "")), str(meta.get("uid", ""))
    spec = SuggestionExportSpec.model_validate(export.get("spec") or {})
    if job is not None and str((job.get("metadata") or {}).get("uid", "")) != spec.job_uid:
        job = None
    digests = decide_job_digests(job)
    suggestions = [
        AuditSuggestion(digest=s.digest, record=s.record, matches_job=None if digests is None else s.digest in digests)
        for s in spec.suggestions
    ]
    matched = sum(1 for s in suggestions if s.matches_job)
    job_obj = {
        "apiVersion": API_VERSION,
        "kind": "AgentJob",
        "metadata": {"name": spec.job, "namespace": namespace, "uid": spec.job_uid},
    }
    record = build_audit_record(
        action=AuditAction.SUGGESTIONS_EXPORTED,
        obj=job_obj,
        actor=AuditActor(username=spec.exported_by),
        after=AuditState(value=f"{len(suggestions)} suggestions exported"),
        message=(
            f"{spec.exported_by} exported {len(suggestions)} suggestion(s) of job {spec.job} to files "
            "for a pull request; nothing was applied"
        ),
        details={
            "export": name,
            "exportUid": uid,
            "jobFound": "true" if digests is not None else "false",
            "matchingDigests": "unknown" if digests is None else f"{matched} of {len(suggestions)}",
            "actorSource": "admission-policy",
        },
        now=now,
    )
    record["metadata"].pop("generateName", None)
    record["metadata"]["name"] = suggestion_export_audit_name(name, uid)
    record["metadata"]["labels"][job_audit_label(spec.job_uid)] = AuditAction.SUGGESTIONS_EXPORTED.value
    record["spec"]["suggestions"] = [s.to_wire() for s in suggestions]
    return record

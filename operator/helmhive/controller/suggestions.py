"""Suggestion exports, audited: each SuggestionExport becomes one ``SuggestionsExported`` AuditRecord.

``helmhive suggestions export`` creates a SuggestionExport before it writes any file; the
``helmhive-suggestion-export`` admission policy has already made sure its ``exportedBy`` is the
requester's own username. This handler reads the job (to compare the digests with its output),
writes the record (:func:`~helmhive.policy.suggestions.audit.build_suggestions_exported_audit`,
a deterministic name: a 409 is "recorded before") and sets the export's ``Recorded`` condition.
It applies nothing: no MemoryRecord and no Profile is ever created or changed here.

An export created while the operator was down is recorded when it starts (Kopf runs the create
handler for an object it has not handled).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.door import Conflict, NotFound
from helmhive.controller.runtime import Runtime
from helmhive.policy.conditions import set_condition
from helmhive.policy.suggestions.audit import build_suggestions_exported_audit

__all__ = ["ensure_export_recorded", "register"]

EXPORT = kind_by_name("SuggestionExport")
JOB = kind_by_name("AgentJob")


async def ensure_export_recorded(runtime: Runtime, export: Mapping[str, Any]) -> str | None:
    """Write ``export``'s AuditRecord (if not written before) and its ``Recorded`` condition; the record's name.

    None if its namespace is being deleted (the record would go with it).
    """
    meta = export["metadata"]
    namespace = str(meta["namespace"])
    job_name = str((export.get("spec") or {}).get("job", ""))
    try:
        job: dict[str, Any] | None = await runtime.kube.get(JOB, job_name, namespace=namespace)
    except NotFound:
        job = None
    now = runtime.clock()
    try:
        record = build_suggestions_exported_audit(export=export, job=job, now=now)
    except ValidationError as err:  # the CRD schema admits only valid specs; an older object may not be
        raise kopf.PermanentError(f"suggestion export {meta['name']}: {err.errors()[0]['msg']}") from None
    name = str(record["metadata"]["name"])
    try:
        written = await ensure_audit_unless_terminating(
            runtime.kube, record, involved=dict(export), event_reason="SuggestionsExported", now=now
        )
    except Conflict:
        written = True  # recorded before: a retry, or a restart before Kopf noted it
    if not written:
        return None
    status = dict(export.get("status") or {})
    update = set_condition(
        status.get("conditions"),
        type=ConditionType.RECORDED,
        status=True,
        reason=Reason.AUDIT_RECORDED,
        message=f"AuditRecord {name} (SuggestionsExported)",
        generation=meta.get("generation"),
        now=now,
    )
    if update.changed or status.get("auditRecord") != name:
        patch = {
            "status": {
                "conditions": update.conditions,
                "auditRecord": name,
                "observedGeneration": meta.get("generation"),
            }
        }
        with contextlib.suppress(NotFound):  # deleted meanwhile: the record stands
            await runtime.kube.patch_status(EXPORT, str(meta["name"]), patch, namespace=namespace)
    return name


def register(runtime: Runtime) -> None:
    @kopf.on.create(GROUP, VERSION, EXPORT.plural, id="suggestion-export-audit")
    async def export_created(body: kopf.Body, **_: Any) -> None:
        await ensure_export_recorded(runtime, body)

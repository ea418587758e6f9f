"""Asking the real API server about a manifest, and ``helmhive validate`` about the same one alone.

:func:`server_verdict` sends a server-side dry-run create (``dryRun=All``, strict field
validation as ``kubectl apply`` uses): the schema, the CEL rules and the admission webhooks
run, nothing is stored. :func:`offline_verdict` validates the object alone and keeps only its
single-object issues (references to other objects are not the API server's business).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from helmhive.api.kinds import API_VERSION, GROUP, KINDS, VERSION
from helmhive.api.reasons import Reason
from helmhive.policy.validation.manifests import SourceDocument, ValidationIssue, validate_documents

from .mutants import CROSS_OBJECT, SCHEMAS, schema_at, walk

_BY_KIND = {k.kind: k for k in KINDS}


@dataclass(frozen=True)
class ServerVerdict:
    accepted: bool
    status: int
    fields: tuple[str, ...]
    message: str


def sendable(body: Any) -> bool:
    """Whether ``body`` names a Helmhive kind, so there is an endpoint to send it to."""
    return (
        isinstance(body, dict)
        and body.get("apiVersion") == API_VERSION
        and isinstance(body.get("kind"), str)
        and body["kind"] in _BY_KIND
        and isinstance(body.get("metadata"), dict)
        and set(body["metadata"]) <= {"name"}
    )


def place(body: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The body as sent: in the test's namespace (or none, for a cluster-scoped kind)."""
    placed = copy.deepcopy(body)
    if _BY_KIND[body["kind"]].namespaced:
        placed["metadata"]["namespace"] = namespace
    return placed


def server_verdict(custom: client.CustomObjectsApi, body: dict[str, Any]) -> ServerVerdict:
    """Dry-run create ``body``; accepted when the schema, CEL and the webhooks let it through.

    A ValidatingAdmissionPolicy that only lets the operator write a kind (Envelopes, AuditRecords)
    runs after the schema, as does the storage's AlreadyExists: both mean the object itself passed.
    """
    definition = _BY_KIND[body["kind"]]
    try:
        if definition.namespaced:
            custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                body["metadata"]["namespace"],
                definition.plural,
                body,
                dry_run="All",
                field_validation="Strict",
            )
        else:
            custom.create_cluster_custom_object(
                GROUP, VERSION, definition.plural, body, dry_run="All", field_validation="Strict"
            )
    except client.ApiException as err:
        try:
            status = json.loads(err.body or "{}")
        except ValueError:
            status = {}
        message = str(status.get("message") or err.reason)
        causes = (status.get("details") or {}).get("causes") or []
        fields = tuple(str(c.get("field", "")) for c in causes if c.get("field"))
        if err.status == 409 or (err.status == 403 and "ValidatingAdmissionPolicy" in message):
            return ServerVerdict(accepted=True, status=err.status, fields=fields, message=message)
        if err.status in (400, 422):
            return ServerVerdict(accepted=False, status=err.status, fields=fields, message=message)
        raise
    return ServerVerdict(accepted=True, status=201, fields=(), message="")


def offline_issues(body: dict[str, Any]) -> list[ValidationIssue]:
    """``helmhive validate``'s single-object issues for ``body`` alone."""
    report = validate_documents(documents=[SourceDocument(file="mutant.yaml", body=body)])
    issues = [i for i in report.issues if i.reason not in CROSS_OBJECT]
    if body.get("kind") == "Envelope":
        # Which envelopes exist is the operator's catalogue, not a rule of the object's own.
        issues = [i for i in issues if i.reason is not Reason.UNKNOWN_ENVELOPE]
    return issues


def known_server_leniency(body: dict[str, Any]) -> str | None:
    """Why the API server admits ``body`` though ``helmhive validate`` rightly refuses it, if known.

    kube-openapi skips the type check of a ``format: date-time`` string when the value is a list,
    so ``expiresAt: [...]`` is stored; the operator then marks the object ``InvalidSpec``
    (``test_operator_fuzz.py`` checks it). Nothing else is excused.
    """
    schema = SCHEMAS[body["kind"]]
    for path, value in walk(body):
        node = schema_at(schema, path) if path else None
        if isinstance(value, list) and node is not None and node.get("format") == "date-time":
            return f"a list at the date-time field {'.'.join(map(str, path))}"
    return None

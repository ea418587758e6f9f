"""Credential rotation, decided purely: a content hash of the pool's Secret and its generation.

The Secret's ``data`` goes in; only ``sha256:<hex>`` (over a fixed prefix and the canonical
JSON of the referenced key) comes out, and that hash is all the operator ever stores. A new
hash bumps the pool's credential generation; runners that reported an older generation are
not schedulable until they report again. Also here: the pool's ``CredentialAvailable`` verdict
(:func:`build_credential_verdict`) and the audit record of a rotation
(:func:`build_rotation_record`), which names the Secret and the generations, never its content.
Nothing here does I/O.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.audit import AuditAction, AuditState
from helmhive.api.kinds import API_VERSION
from helmhive.api.reasons import Reason
from helmhive.api.runnerpool import CredentialSpec
from helmhive.policy.audit.records import build_audit_record
from helmhive.policy.runners.pool import PoolRef
from helmhive.policy.runners.state import ConditionVerdict

__all__ = [
    "CredentialDecision",
    "build_credential_hash",
    "build_credential_verdict",
    "build_pool_object",
    "build_rotation_record",
    "decide_credential",
]


def build_credential_hash(*, data: Mapping[str, str], key: str | None) -> str | None:
    """``sha256:<hex>`` of the referenced key (or of every key); None if the key is absent.

    ``data`` is the Secret's ``data`` as stored (base64); only this digest leaves this function.
    """
    if key is not None:
        if key not in data:
            return None
        material: dict[str, str] = {key: data[key]}
    else:
        material = dict(data)
    canonical = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(b"helmhive-credential-v1\0" + canonical.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class CredentialDecision:
    """What the pool's status should say about its credential."""

    hash: str | None
    generation: int
    available: bool
    changed: bool
    previous_hash: str | None


def decide_credential(
    *, uses_secret: bool, observed_hash: str | None, observed_generation: int, digest: str | None
) -> CredentialDecision:
    """Bump the generation when the Secret's content hash differs from the stored one.

    ``digest`` is None when the Secret (or its key) is missing: the stored hash is kept, so a
    Secret restored with the same content is not a rotation. Volume logins have no hash.
    """
    if not uses_secret:
        return CredentialDecision(
            hash=None, generation=observed_generation, available=True, changed=False, previous_hash=None
        )
    if digest is None:
        return CredentialDecision(
            hash=observed_hash,
            generation=observed_generation,
            available=False,
            changed=False,
            previous_hash=observed_hash,
        )
    changed = digest != observed_hash
    return CredentialDecision(
        hash=digest,
        generation=observed_generation + 1 if changed else observed_generation,
        available=True,
        changed=changed,
        previous_hash=observed_hash,
    )


def build_credential_verdict(credential: CredentialSpec, decision: CredentialDecision) -> ConditionVerdict:
    """The pool's ``CredentialAvailable`` condition: a volume login needs no Secret; else the
    Secret (and key) is there, at its generation, or missing."""
    if credential.secret_ref is None:
        claim = credential.volume.claim_name if credential.volume else "none"
        return ConditionVerdict(
            status=True, reason=Reason.CREDENTIAL_NOT_REQUIRED, message=f"a login on volume claim {claim}"
        )
    name = credential.secret_ref.name
    if not decision.available:
        key = f" (key {credential.secret_ref.key})" if credential.secret_ref.key else ""
        return ConditionVerdict(
            status=False, reason=Reason.CREDENTIAL_MISSING, message=f"Secret {name}{key} is missing"
        )
    return ConditionVerdict(
        status=True, reason=Reason.CREDENTIAL_FOUND, message=f"Secret {name}, generation {decision.generation}"
    )


def build_pool_object(pool: PoolRef) -> dict[str, Any]:
    """The pool as an audit record's (and an Event's) object: its kind, name, namespace and uid."""
    return {
        "apiVersion": API_VERSION,
        "kind": "RunnerPool",
        "metadata": {"name": pool.name, "namespace": pool.namespace, "uid": pool.uid},
    }


def build_rotation_record(
    pool: PoolRef, *, secret: str, decision: CredentialDecision, now: dt.datetime
) -> dict[str, Any]:
    """The ``RunnerCredentialRotated`` AuditRecord of a new hash: the Secret's name, the generations
    and the hashes before and after (never the Secret's content)."""
    before = decision.generation - 1
    message = (
        f"credential Secret {secret} recorded as generation {decision.generation}"
        if decision.previous_hash is None
        else f"credential Secret {secret} changed: generation {before} -> {decision.generation}; "
        "runners re-authenticate before they are schedulable again"
    )
    return build_audit_record(
        action=AuditAction.RUNNER_CREDENTIAL_ROTATED,
        obj=build_pool_object(pool),
        before=AuditState(revision=str(before), hash=decision.previous_hash) if decision.previous_hash else None,
        after=AuditState(revision=str(decision.generation), hash=decision.hash),
        message=message,
        details={"secretRef": secret, "credentialGeneration": str(decision.generation)},
        now=now,
    )

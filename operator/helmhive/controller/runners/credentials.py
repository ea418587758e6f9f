"""A RunnerPool's credential Secret, checked: its hash, a rotation audited and stored in the pool's status.

Owns :func:`check_credential`, one step of the pool's loop (:mod:`helmhive.controller.runners.pools`):
it reads the Secret, hashes it (:func:`~helmhive.policy.runners.credentials.build_credential_hash`),
and on a new hash writes the rotation's AuditRecord, then ``status.credentialHash`` and
``status.credentialGeneration``. Must not log, store or post the Secret's content: only its hash.
"""

from __future__ import annotations

import kopf

from helmhive.api.audit import AuditAction
from helmhive.api.kinds import kind_by_name
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.door import KubeError, NotFound
from helmhive.controller.runtime import Runtime
from helmhive.policy.runners.credentials import (
    CredentialDecision,
    build_credential_hash,
    build_pool_object,
    build_rotation_record,
    decide_credential,
)
from helmhive.policy.runners.pool import PoolRef

__all__ = ["check_credential"]

POOL = kind_by_name("RunnerPool")


async def check_credential(
    runtime: Runtime, *, pool: PoolRef, spec: RunnerPoolSpec, known: CredentialDecision, logger: kopf.Logger
) -> CredentialDecision | None:
    """The credential's decision now (``known`` is the last one); None when the Secret could not be read."""
    ref = spec.credential.secret_ref
    digest: str | None = None
    if ref is not None:
        try:
            digest = build_credential_hash(
                data=await runtime.kube.read_secret_data(ref.name, pool.namespace), key=ref.key
            )
        except NotFound:
            digest = None
        except KubeError as err:
            logger.warning("credential Secret %s not read (will retry): %s", ref.name, err.message)
            return None
    decision = decide_credential(
        uses_secret=ref is not None,
        observed_hash=known.hash,
        observed_generation=known.generation,
        digest=digest,
    )
    if decision.available != known.available:
        logger.warning("credential Secret of pool %s is %s", pool.name, "back" if decision.available else "missing")
    if decision.changed and ref is not None:
        now = runtime.clock()
        record = build_rotation_record(pool, secret=ref.name, decision=decision, now=now)
        await ensure_audit_unless_terminating(
            runtime.kube,
            record,
            involved=build_pool_object(pool),
            event_reason=AuditAction.RUNNER_CREDENTIAL_ROTATED.value,
            now=now,
        )
        patch = {"status": {"credentialHash": decision.hash, "credentialGeneration": decision.generation}}
        await runtime.kube.patch_status(POOL, pool.name, patch, namespace=pool.namespace)
    return decision

"""Session resets, audited by the operator: witnessed at admission, recorded from the watch.

A reset is recorded however it was done -- ``helmhive sessions reset``, ``kubectl patch
--subresource=status`` or deleting the SessionBinding -- with the actor from the request, not
from the client. Two halves, in the operator's one process:

* **The witness** (:class:`ResetWitness`). Validating webhooks on ``sessionbindings/status``
  UPDATE and ``sessionbindings`` DELETE (``failurePolicy: Ignore``; they never refuse) note the
  user the API server authenticated for each request that raises ``status.resets`` or deletes a
  binding, keyed by the binding's uid and the new count. The actor cannot be stamped on the
  object as for Profiles: the API server keeps only ``status`` from a ``/status`` request (it
  drops metadata changes after mutating admission), and a delete leaves no object to stamp. The
  notes are in memory, bounded (4096, ten minutes); dry runs are not noted.
* **The recorder.** Kopf change handlers on SessionBindings write ``SessionReset`` when
  ``status.resets`` grows, when a binding is first seen already reset, and when a binding is
  deleted (through a finalizer, so a deletion cannot be missed). Kopf keeps the last handled count
  in the binding's ``last-handled-configuration`` annotation: a reset made while the operator was
  down is recorded when it starts (actor ``unknown``: nobody witnessed it), and one recorded is
  never recorded again. Record names are deterministic
  (:mod:`helmhive.policy.sessions.audit`), so a 409 means "already recorded".

Compactions are recorded here too: when the runner raises ``status.compactions`` (with
``status.lastCompaction`` in the same write), ``SessionCompacted`` is written for the new count,
actor the binding's runner, figures only (:mod:`helmhive.policy.sessions.compaction`).

A binding deleted with its namespace cannot have its record written (a terminating namespace
refuses new objects): its trail goes with the namespace, and the finalizer is released.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from helmhive.api.audit import AuditActor
from helmhive.api.kinds import GROUP, VERSION
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.door import Conflict
from helmhive.controller.runtime import Runtime
from helmhive.policy.sessions.audit import (
    actor_from_userinfo,
    build_session_deleted_audit,
    build_session_reset_audit,
    decide_reset_audits,
    reset_count,
    resets_of,
)
from helmhive.policy.sessions.compaction import build_session_compacted_audit, compaction_count

__all__ = ["ResetWitness", "ensure_compaction_audit", "ensure_deletion_audit", "ensure_reset_audits", "register"]

log = logging.getLogger(__name__)
BINDINGS = "sessionbindings"
_DELETED = -1


class ResetWitness:
    """Who the API server said made each reset or deletion, as the admission webhook saw it.

    Keyed by (binding uid, new reset count), or (uid, deletion). Bounded by ``limit`` notes and
    ``ttl_seconds``; a later note for the same key replaces the earlier one. Used only from the
    event loop (the admission handlers are coroutines), so it needs no lock.
    """

    def __init__(
        self, *, ttl_seconds: float = 600.0, limit: int = 4096, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.limit = limit
        self.clock = clock
        self._notes: OrderedDict[tuple[str, int], tuple[float, AuditActor]] = OrderedDict()

    def note_reset(self, uid: str, count: int, actor: AuditActor) -> None:
        self._note((uid, count), actor)

    def note_deletion(self, uid: str, actor: AuditActor) -> None:
        self._note((uid, _DELETED), actor)

    def resets(self, uid: str) -> dict[int, AuditActor]:
        """The witnessed reset counts of binding ``uid`` and their actors."""
        self._prune()
        return {count: actor for (who, count), (_, actor) in self._notes.items() if who == uid and count >= 0}

    def deleted_by(self, uid: str) -> AuditActor | None:
        self._prune()
        found = self._notes.get((uid, _DELETED))
        return found[1] if found is not None else None

    def _note(self, key: tuple[str, int], actor: AuditActor) -> None:
        self._notes.pop(key, None)
        self._notes[key] = (self.clock(), actor)
        self._prune()

    def _prune(self) -> None:
        horizon = self.clock() - self.ttl_seconds
        while self._notes and (len(self._notes) > self.limit or next(iter(self._notes.values()))[0] < horizon):
            self._notes.popitem(last=False)


async def _create(runtime: Runtime, record: dict[str, Any], binding: Mapping[str, Any]) -> bool:
    """Create ``record`` and its Event; False if it exists already or the namespace is going away."""
    try:
        return await ensure_audit_unless_terminating(
            runtime.kube, record, involved=dict(binding), event_reason="SessionReset", now=runtime.clock()
        )
    except Conflict:
        return False  # recorded before (a retry, or a restart before Kopf noted it)


async def ensure_reset_audits(
    runtime: Runtime, witness: ResetWitness, binding: Mapping[str, Any], *, before: int | None
) -> int:
    """Record each reset of ``binding`` since ``before`` (None: first seen); how many were written."""
    uid = str((binding.get("metadata") or {}).get("uid") or "")
    written = 0
    for reset in decide_reset_audits(before=before, after=resets_of(binding), witnessed=witness.resets(uid)):
        record = build_session_reset_audit(binding=binding, reset=reset, now=runtime.clock())
        written += await _create(runtime, record, binding)
    return written


async def ensure_deletion_audit(runtime: Runtime, witness: ResetWitness, binding: Mapping[str, Any]) -> bool:
    """Record ``binding``'s deletion; False if it was recorded before (or its namespace is going)."""
    uid = str((binding.get("metadata") or {}).get("uid") or "")
    record = build_session_deleted_audit(binding=binding, actor=witness.deleted_by(uid), now=runtime.clock())
    return await _create(runtime, record, binding)


async def ensure_compaction_audit(runtime: Runtime, binding: Mapping[str, Any]) -> bool:
    """Record ``binding``'s latest compaction (``SessionCompacted``); False if recorded before or none."""
    record = build_session_compacted_audit(binding=binding, now=runtime.clock())
    if record is None:
        return False
    try:
        return await ensure_audit_unless_terminating(
            runtime.kube, record, involved=dict(binding), event_reason="SessionCompacted", now=runtime.clock()
        )
    except Conflict:
        return False


def register(runtime: Runtime) -> ResetWitness:
    """Register the witnessing webhooks and the recording handlers; return the witness."""
    witness = ResetWitness()

    @kopf.on.validate(
        GROUP,
        VERSION,
        BINDINGS,
        id="witness-session-resets",
        subresource="status",
        operations=["UPDATE"],
        ignore_failures=True,
        side_effects=True,
    )
    async def witness_reset(body: kopf.Body, userinfo: kopf.UserInfo, dryrun: bool, **kwargs: Any) -> None:
        # ``body`` is the object as it would be stored; Kopf passes the stored one as ``old``.
        after = resets_of(body)
        uid = str(body.get("metadata", {}).get("uid") or "")
        actor = actor_from_userinfo(dict(userinfo))
        if not dryrun and uid and actor is not None and after > resets_of(kwargs.get("old")):
            witness.note_reset(uid, after, actor)

    @kopf.on.validate(
        GROUP,
        VERSION,
        BINDINGS,
        id="witness-session-deletes",
        operations=["DELETE"],
        ignore_failures=True,
        side_effects=True,
    )
    async def witness_delete(body: kopf.Body, userinfo: kopf.UserInfo, dryrun: bool, **_: Any) -> None:
        uid = str(body.get("metadata", {}).get("uid") or "")
        actor = actor_from_userinfo(dict(userinfo))
        if not dryrun and uid and actor is not None:
            witness.note_deletion(uid, actor)

    @kopf.on.create(GROUP, VERSION, BINDINGS, id="session-first-seen")
    async def binding_first_seen(body: kopf.Body, **_: Any) -> None:
        if resets_of(body) > 0:  # reset before the operator first saw it (or before this version)
            await ensure_reset_audits(runtime, witness, body, before=None)
        if compaction_count(body) > 0:  # compacted before the operator first saw it
            await ensure_compaction_audit(runtime, body)

    @kopf.on.update(GROUP, VERSION, BINDINGS, id="session-resets", field="status.resets")
    async def binding_resets_changed(body: kopf.Body, old: Any, **_: Any) -> None:
        await ensure_reset_audits(runtime, witness, body, before=reset_count(old))

    @kopf.on.update(GROUP, VERSION, BINDINGS, id="session-compactions", field="status.compactions")
    async def binding_compacted(body: kopf.Body, old: Any, **_: Any) -> None:
        # The runner counts each compaction and writes its figures in the same status patch.
        if compaction_count(body) > compaction_count({"status": {"compactions": old}}):
            await ensure_compaction_audit(runtime, body)

    @kopf.on.delete(GROUP, VERSION, BINDINGS, id="session-deleted")
    async def binding_deleted(body: kopf.Body, **_: Any) -> None:
        await ensure_deletion_audit(runtime, witness, body)

    return witness

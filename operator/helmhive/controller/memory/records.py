"""MemoryRecords: the ``Active`` condition, on time and on events, and the audit of every change.

``Active`` follows :func:`~helmhive.policy.memory.status.decide_memory_status`. A record is decided
again only when something it depends on changes, never by polling:

- **its own events** (created, edited, and the initial listing after a restart);
- **its Workspace's events**: records are indexed by (namespace, workspace), and a Workspace
  that appears, changes its spec or goes away has its records decided again at once
  (``WaitingForWorkspace`` → ``InEffect`` the moment a late Workspace is created); a
  Workspace event that changes only its status wakes nobody;
- **moments in time**: at its ``expiresAt``, and at the end of its wait for a Workspace that
  does not exist yet, through the operator's one
  :class:`~helmhive.controller.deadlines.DeadlineScheduler` (one entry per record, no task
  or timer per record).

The Workspace is read from a Kopf index, not from the API server, so deciding costs no
request; the status is patched only when it changes, conditional on the record's
``resourceVersion`` (a 409 re-reads and decides again, so an expiry is audited once).

Why no wake-up is lost: Kopf updates its indexes before it runs the handlers of the same
event. A record's handler reads the Workspace index after its own index entry exists, and
a Workspace's handler reads the record index after the Workspace entry exists; whichever
runs second sees the other.

Create, update, expiry and delete are audited (delete through a finalizer, so it cannot be
missed).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from pydantic import ValidationError

from helmhive.api.audit import AuditAction, AuditState
from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.memory import MemoryRecordSpec, WorkspaceSpec
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.deadlines import KeyedLocks
from helmhive.controller.kube.door import Conflict, KubeError, NotFound
from helmhive.controller.profiles import actor_from
from helmhive.controller.runtime import Runtime
from helmhive.policy.audit.records import build_audit_record
from helmhive.policy.conditions import find_condition, set_condition
from helmhive.policy.kstatus import with_kstatus
from helmhive.policy.memory.selection import MemoryActivity
from helmhive.policy.memory.status import decide_memory_status
from helmhive.policy.waiting import parse_timestamp

__all__ = ["MemoryReconciler", "WorkspaceSeen", "memory_hash", "register", "snapshot"]

MEMORY = kind_by_name("MemoryRecord")
WORKSPACE = kind_by_name("Workspace")
_CONFLICT_RETRIES = 5
_RETRY = dt.timedelta(seconds=5)
log = logging.getLogger("helmhive.controller.memory.records")

RecordKey = tuple[str, str]


@dataclass(frozen=True)
class WorkspaceSeen:
    """A Workspace as the memory index holds it: its spec, or None when the spec is unreadable."""

    spec: WorkspaceSpec | None


def memory_hash(spec: Mapping[str, Any]) -> str:
    canonical = json.dumps(dict(spec), sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of what deciding and auditing a record reads (Kopf's body views are not kept)."""
    meta = body.get("metadata") or {}
    kept = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp")
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {k: meta[k] for k in kept if k in meta},
        "spec": _plain(body.get("spec") or {}),
        "status": _plain(body.get("status") or {}),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _ref(key: RecordKey) -> dict[str, Any]:
    return {
        "k8s_ref": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MemoryRecord", "namespace": key[0], "name": key[1]}
    }


class MemoryReconciler:
    """Decides records on their events, their Workspace's events and their deadlines."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.locks = KeyedLocks()
        # Kopf indexes, bound at startup: (namespace, name) -> WorkspaceSeen; (namespace, workspace) -> records.
        self.workspaces: Mapping[Any, Iterable[WorkspaceSeen]] = {}
        self.records: Mapping[Any, Iterable[dict[str, Any]]] = {}
        # The last Workspace state whose records were decided again, so status-only events wake nobody.
        self._handled: dict[tuple[str, str], WorkspaceSeen] = {}

    def bind(self, indexes: Mapping[str, Any]) -> None:
        """Take the Kopf indexes (the same objects for the operator's lifetime)."""
        self.workspaces = indexes["memory_workspaces"]
        self.records = indexes["memory_by_workspace"]

    @staticmethod
    def _entry(key: RecordKey) -> tuple[str, str, str]:
        return ("MemoryRecord", *key)

    def workspace(self, namespace: str, name: str) -> WorkspaceSeen | None:
        """The Workspace as indexed, or None when it does not exist."""
        for seen in self.workspaces.get((namespace, name), ()):
            return seen
        return None

    def forget(self, key: RecordKey) -> None:
        """Drop the record's pending deadline (it is gone, or has no next transition)."""
        self.runtime.deadlines.cancel(self._entry(key))

    async def reconcile_or_retry(self, body: Mapping[str, Any]) -> None:
        """:meth:`reconcile` for an event handler: the scheduler retries a failure (Kopf does not retry events)."""
        meta = body["metadata"]
        key: RecordKey = (str(meta["namespace"]), str(meta["name"]))
        try:
            await self.reconcile(body)
        except KubeError as err:
            log.warning("memory record %s/%s not reconciled (%s); retrying", *key, err, extra=_ref(key))
            self.runtime.deadlines.at(
                self._entry(key), self.runtime.clock() + _RETRY, functools.partial(self.refresh, key)
            )

    def workspace_changed(self, namespace: str, name: str) -> int:
        """A Workspace event: if what records depend on changed, decide its records again now. Returns how many.

        Records are decided from their copies in the index (no read); a stale copy loses the
        conditional write and is read again. After a restart every Workspace counts as changed
        once, which costs no request for records whose status is already right.
        """
        wkey = (namespace, name)
        seen = self.workspace(namespace, name)
        if self._handled.get(wkey) == seen:
            return 0
        if seen is None:
            self._handled.pop(wkey, None)
        else:
            self._handled[wkey] = seen
        bodies = list(self.records.get(wkey, ()))
        for body in bodies:
            key = (namespace, str(body["metadata"]["name"]))
            self.runtime.deadlines.soon(self._entry(key), functools.partial(self.reconcile, body))
        return len(bodies)

    async def refresh(self, key: RecordKey) -> None:
        """Read the record and decide it (its deadline came, or its Workspace changed)."""
        try:
            body = await self.runtime.kube.get(MEMORY, key[1], namespace=key[0])
        except NotFound:
            self.forget(key)
            return
        await self.reconcile(body)

    async def reconcile(self, body: Mapping[str, Any]) -> None:
        """Decide one record and patch ``Active`` if it changed; one decision per record at a time."""
        meta = body["metadata"]
        key: RecordKey = (str(meta["namespace"]), str(meta["name"]))
        async with self.locks.hold(key):
            for _ in range(_CONFLICT_RETRIES):
                if await self._once(key, body):
                    return
                try:
                    body = await self.runtime.kube.get(MEMORY, key[1], namespace=key[0])
                except NotFound:
                    self.forget(key)
                    return
        raise Conflict(409, f"memoryrecord {key[0]}/{key[1]} kept changing")

    def decide(self, body: Mapping[str, Any]) -> MemoryActivity:
        """The record's ``Active`` condition now, its Workspace as indexed."""
        meta = body["metadata"]
        now = self.runtime.clock()
        try:
            spec = MemoryRecordSpec.model_validate(dict(body.get("spec") or {}))
        except ValidationError as err:
            return MemoryActivity(
                active=False, reason=Reason.INVALID_SPEC, message=str(err.errors()[0]["msg"]), next_transition=None
            )
        seen = self.workspace(str(meta["namespace"]), spec.workspace)
        return decide_memory_status(
            record=spec,
            namespace=str(meta["namespace"]),
            workspace=seen.spec if seen is not None else None,
            workspace_exists=seen is not None,
            created_at=parse_timestamp(meta.get("creationTimestamp")),
            now=now,
            wait_limit=self.runtime.config.reference_wait,
        )

    async def _once(self, key: RecordKey, body: Mapping[str, Any]) -> bool:
        """Decide and write once; False when the write lost a race (the caller re-reads)."""
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            self.forget(key)
            return True
        status = dict(body.get("status") or {})
        now = self.runtime.clock()
        activity = self.decide(body)
        if activity.next_transition is not None:
            self.runtime.deadlines.at(self._entry(key), activity.next_transition, functools.partial(self.refresh, key))
        else:
            self.forget(key)
        previous = find_condition(status.get("conditions"), ConditionType.ACTIVE)
        update = set_condition(
            status.get("conditions"),
            type=ConditionType.ACTIVE,
            status=activity.active,
            reason=activity.reason,
            message=activity.message,
            generation=meta.get("generation"),
            now=now,
        )
        generation = meta.get("generation")
        conditions = with_kstatus("MemoryRecord", {"conditions": update.conditions}, generation=generation, now=now)
        conditions = conditions.get("conditions", update.conditions)
        digest = memory_hash(body.get("spec") or {})
        if conditions == status.get("conditions") and status.get("contentHash") == digest:
            return True
        patch: dict[str, Any] = {
            "conditions": conditions,
            "contentHash": digest,
            "observedGeneration": meta.get("generation"),
        }
        if activity.reason == Reason.EXPIRED:
            patch["expiredAt"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            await self.runtime.kube.patch_status(
                MEMORY,
                key[1],
                {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": patch},
                namespace=key[0],
            )
        except Conflict:
            return False
        except NotFound:
            self.forget(key)
            return True
        if (previous or {}).get("reason") != activity.reason:
            log.info("memory record %s/%s is Active=%s: %s", *key, activity.active, activity.reason, extra=_ref(key))
        if activity.reason == Reason.EXPIRED and (previous or {}).get("reason") != Reason.EXPIRED:
            record = build_audit_record(
                action=AuditAction.MEMORY_EXPIRED,
                obj=body,
                before=AuditState(hash=digest, value="Active"),
                after=AuditState(hash=digest, value="Expired"),
                message=f"memory record {key[1]} expired",
                now=now,
            )
            await ensure_audit_unless_terminating(
                self.runtime.kube, record, involved=dict(body), event_reason="Expired", now=now
            )
        return True


async def _audit_change(
    runtime: Runtime, body: Mapping[str, Any], action: AuditAction, before: str | None, after: str | None
) -> None:
    now = runtime.clock()
    record = build_audit_record(
        action=action,
        obj=body,
        actor=actor_from(body["metadata"]),
        before=AuditState(hash=before) if before else None,
        after=AuditState(hash=after) if after else None,
        message=f"memory record {body['metadata']['name']}: {action.value}",
        details={"workspace": str((body.get("spec") or {}).get("workspace", ""))[:253]},
        now=now,
    )
    # A record deleted with its namespace cannot be audited (its namespace refuses new objects).
    await ensure_audit_unless_terminating(runtime.kube, record, involved=dict(body), event_reason=action.value, now=now)


def register(runtime: Runtime) -> MemoryReconciler:
    """Register the memory record handlers and indexes; return the reconciler."""
    reconciler = MemoryReconciler(runtime)

    @kopf.on.startup()
    async def bind_memory_indexes(**kwargs: Any) -> None:
        reconciler.bind(kwargs)

    @kopf.on.cleanup()
    async def stop_memory_deadlines(**_: Any) -> None:
        await runtime.deadlines.stop()

    # Index functions return {} rather than None (Kopf keeps an object's old values on None).
    @kopf.index(GROUP, VERSION, "workspaces", id="memory_workspaces")
    async def memory_workspaces(body: kopf.Body, **_: Any) -> dict[tuple[str, str], WorkspaceSeen]:
        try:
            spec: WorkspaceSpec | None = WorkspaceSpec.model_validate(dict(body.get("spec") or {}))
        except ValidationError:
            spec = None
        meta = body["metadata"]
        return {(str(meta["namespace"]), str(meta["name"])): WorkspaceSeen(spec)}

    @kopf.index(GROUP, VERSION, "memoryrecords", id="memory_by_workspace")
    async def memory_by_workspace(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
        meta = body["metadata"]
        workspace = (body.get("spec") or {}).get("workspace")
        return {(str(meta["namespace"]), str(workspace)): snapshot(body)} if workspace else {}

    @kopf.on.create(GROUP, VERSION, "memoryrecords")
    async def memory_created(body: kopf.Body, **_: Any) -> None:
        await _audit_change(runtime, body, AuditAction.MEMORY_CREATED, None, memory_hash(body.get("spec") or {}))

    @kopf.on.update(GROUP, VERSION, "memoryrecords", field="spec")
    async def memory_updated(body: kopf.Body, old: Any, new: Any, **_: Any) -> None:
        await _audit_change(runtime, body, AuditAction.MEMORY_UPDATED, memory_hash(old or {}), memory_hash(new or {}))

    @kopf.on.delete(GROUP, VERSION, "memoryrecords")
    async def memory_deleted(body: kopf.Body, **_: Any) -> None:
        await _audit_change(runtime, body, AuditAction.MEMORY_DELETED, memory_hash(body.get("spec") or {}), None)

    # Event handlers run after the indexes took the same event in (see the module docstring).
    @kopf.on.event(GROUP, VERSION, "memoryrecords")
    async def memory_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        meta = body["metadata"]
        if event.get("type") == "DELETED":
            reconciler.forget((str(meta["namespace"]), str(meta["name"])))
            return
        await reconciler.reconcile_or_retry(snapshot(body))

    @kopf.on.event(GROUP, VERSION, "workspaces")
    async def memory_workspace_event(body: kopf.Body, **_: Any) -> None:
        meta = body["metadata"]
        reconciler.workspace_changed(str(meta["namespace"]), str(meta["name"]))

    return reconciler

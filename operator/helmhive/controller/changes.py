"""Changes: fetch a Change, its jobs and its Workspace, call :func:`decide_change`, apply the result.

A Change is reconciled when it changes (a new approval), when one of its jobs changes, and
when the Workspace it waits for appears -- events, not timers. One reconcile of one Change
runs at a time (a lock per Change), and it reads the Change and its jobs from the API server
itself rather than from a cache, so a job this operator just created is always seen.

Applying a decision: audit records first (deterministic names; a 409 means already recorded),
then the job to create (deterministic name; a 409 means it exists), then the status, replaced
whole under the Change's ``resourceVersion`` (a 409 re-reads and decides again). A crash at
any point therefore repeats nothing and loses nothing.

Deleting a Change deletes its jobs (they are owned by it), which cancels a running one on its
runner, and their artifacts with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from helmhive.api.kinds import kind_by_name
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.door import Conflict, NotFound
from helmhive.controller.runtime import Runtime
from helmhive.policy.change.decision import TERMINAL_REASONS, ChangeDecision, decide_change
from helmhive.policy.change.jobs import LABEL_CHANGE, build_label_value
from helmhive.policy.conditions import find_condition

__all__ = ["ChangeReconciler", "register"]

CHANGE = kind_by_name("Change")
AGENT_JOB = kind_by_name("AgentJob")
WORKSPACE = kind_by_name("Workspace")
_RETRIES = 5
log = logging.getLogger("helmhive.controller.changes")


class ChangeReconciler:
    """Serialises the reconciles of each Change and applies their decisions."""

    def __init__(self, runtime: Runtime, *, retry_delay: float = 2.0) -> None:
        self.runtime = runtime
        self.retry_delay = retry_delay
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._retries: dict[tuple[str, str], asyncio.Task[None]] = {}

    def forget(self, namespace: str, name: str) -> None:
        """The Change is gone: drop its lock and any pending retry."""
        self._locks.pop((namespace, name), None)
        task = self._retries.pop((namespace, name), None)
        if task is not None:
            task.cancel()

    async def reconcile(self, namespace: str, name: str) -> None:
        """Reconcile one Change; a failure is logged and retried once after a delay (events alone may not come)."""
        key = (namespace, name)
        try:
            async with self._locks.setdefault(key, asyncio.Lock()):
                for _ in range(_RETRIES):
                    if await self._once(namespace, name):
                        return
                raise Conflict(409, f"change {namespace}/{name} kept changing")
        except Exception as exc:
            log.warning("change %s/%s not reconciled (%s: %s); retrying", namespace, name, type(exc).__name__, exc)
            if key not in self._retries:
                self._retries[key] = asyncio.create_task(self._retry(key))

    async def _retry(self, key: tuple[str, str]) -> None:
        await asyncio.sleep(self.retry_delay)
        self._retries.pop(key, None)
        await self.reconcile(*key)

    async def _once(self, namespace: str, name: str) -> bool:
        """One fetch-decide-apply pass; False when the status write lost a race and must be re-decided."""
        kube = self.runtime.kube
        try:
            change = await kube.get(CHANGE, name, namespace=namespace)
        except NotFound:
            return True
        if change["metadata"].get("deletionTimestamp"):
            return True
        selector = f"{LABEL_CHANGE}={build_label_value(name)}"
        uid = change["metadata"].get("uid")
        jobs = {
            job["metadata"]["name"]: job
            for job in await kube.list(AGENT_JOB, namespace, label_selector=selector)
            if any(ref.get("uid") == uid for ref in job["metadata"].get("ownerReferences") or ())
        }
        workspace = str((change.get("spec") or {}).get("workspace") or "")
        decision = decide_change(
            change=change,
            jobs=jobs,
            workspace_exists=await self._exists(workspace, namespace),
            now=self.runtime.clock(),
        )
        await self._apply(change, decision)
        previous = change.get("status") or {}
        if decision.status == previous:
            return True
        body = {
            "apiVersion": change["apiVersion"],
            "kind": change["kind"],
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": change["metadata"]["resourceVersion"],
            },
            "status": decision.status,
        }
        try:
            await kube.replace_status(CHANGE, name, body, namespace=namespace)
        except Conflict:
            return False
        except NotFound:
            return True
        self._log_transition(change, previous, decision)
        return True

    async def _exists(self, workspace: str, namespace: str) -> bool:
        if not workspace:
            return False
        try:
            await self.runtime.kube.get(WORKSPACE, workspace, namespace=namespace)
        except NotFound:
            return False
        return True

    async def _apply(self, change: Mapping[str, Any], decision: ChangeDecision) -> None:
        kube, now = self.runtime.kube, self.runtime.clock()
        namespace = change["metadata"]["namespace"]
        for record in decision.audits:
            with contextlib.suppress(Conflict):  # recorded by an earlier pass
                await ensure_audit_unless_terminating(
                    kube, record, involved=dict(change), event_reason=record["spec"]["action"], now=now
                )
        if decision.create is not None:
            try:
                await kube.create(AGENT_JOB, decision.create, namespace=namespace)
                log.info(
                    "change %s/%s created job %s",
                    namespace,
                    change["metadata"]["name"],
                    decision.create["metadata"]["name"],
                )
            except Conflict:
                pass  # created by an earlier pass

    def _log_transition(self, change: Mapping[str, Any], previous: Mapping[str, Any], decision: ChangeDecision) -> None:
        before = find_condition(previous.get("conditions"), ConditionType.READY) or {}
        after = find_condition(decision.status.get("conditions"), ConditionType.READY) or {}
        if (before.get("status"), before.get("reason")) != (after.get("status"), after.get("reason")):
            log.info(
                "change %s/%s is Ready=%s %s: %s",
                change["metadata"]["namespace"],
                change["metadata"]["name"],
                after.get("status"),
                after.get("reason"),
                after.get("message"),
            )


def _owning_change(body: Mapping[str, Any]) -> str | None:
    for ref in (body.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == "Change" and str(ref.get("apiVersion", "")).startswith("helmhive.dev/"):
            return str(ref.get("name"))
    return None


def _is_final(body: Mapping[str, Any]) -> bool:
    """A finished Change whose spec has not changed since: nothing can happen to it any more."""
    status = body.get("status") or {}
    ready = find_condition(status.get("conditions"), ConditionType.READY)
    current = status.get("observedGeneration") == (body.get("metadata") or {}).get("generation")
    return current and ready is not None and ready.get("reason") in TERMINAL_REASONS


def _waits_for_workspace(body: Mapping[str, Any]) -> bool:
    ready = find_condition((body.get("status") or {}).get("conditions"), ConditionType.READY)
    return ready is None or ready.get("reason") == Reason.WAITING_FOR_WORKSPACE.value


def register(runtime: Runtime) -> ChangeReconciler:
    reconciler = ChangeReconciler(runtime)

    @kopf.index("helmhive.dev", "v1alpha1", "changes", id="changes_by_workspace")
    async def changes_by_workspace(body: kopf.Body, **_: Any) -> dict[tuple[str, str], str]:
        if not _waits_for_workspace(body):
            return {}
        meta = body["metadata"]
        return {(str(meta["namespace"]), str((body.get("spec") or {}).get("workspace"))): str(meta["name"])}

    @kopf.on.event("helmhive.dev", "v1alpha1", "changes")
    async def change_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        namespace, name = str(body["metadata"]["namespace"]), str(body["metadata"]["name"])
        if event.get("type") == "DELETED":
            reconciler.forget(namespace, name)
            return
        if not _is_final(body):
            await reconciler.reconcile(namespace, name)

    # A step of the operator's AgentJob watch (helmhive.controller.jobs.watch): only a change's jobs
    # (labelled) matter. A job that vanished while nobody watched is delivered by name only (no
    # label): its Change is reconciled at its own next event.
    async def change_job_event(event_type: str | None, body: Mapping[str, Any]) -> None:
        if LABEL_CHANGE not in ((body.get("metadata") or {}).get("labels") or {}):
            return
        owner = _owning_change(body)
        if owner is not None:
            await reconciler.reconcile(str(body["metadata"]["namespace"]), owner)

    runtime.job_events.subscribe("change", change_job_event)

    @kopf.on.event("helmhive.dev", "v1alpha1", "workspaces")
    async def workspace_event(event: kopf.RawEvent, body: kopf.Body, **kwargs: Any) -> None:
        changes_by_workspace: kopf.Index[tuple[str, str], str] = kwargs["changes_by_workspace"]
        if event.get("type") == "DELETED":
            return
        key = (str(body["metadata"]["namespace"]), str(body["metadata"]["name"]))
        for name in list(changes_by_workspace.get(key, ())):
            await reconciler.reconcile(key[0], name)

    return reconciler

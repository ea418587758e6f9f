"""Workspaces: the ``Ready`` condition says whether every active profile resolves.

Decided on every change of the workspace (and on resume), and again for every workspace of a
namespace whenever a profile in it changes (created, deleted, or its ``Valid`` condition moved):
the only inputs are the workspace and its namespace's profiles, so those events are all it takes,
with no timer per workspace. The status is patched only when the verdict changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from helmhive.api.kinds import kind_by_name
from helmhive.api.memory import WorkspaceSpec
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.runtime import Runtime
from helmhive.policy.conditions import set_condition
from helmhive.policy.workspaces import WorkspaceVerdict, decide_workspace

__all__ = ["register"]

WORKSPACE = kind_by_name("Workspace")
PROFILE = kind_by_name("Profile")


async def reconcile_workspace(
    runtime: Runtime, body: Mapping[str, Any], profiles: Mapping[str, Mapping[str, Any]] | None = None
) -> None:
    """Decide and patch one workspace; ``profiles`` (by name) saves a list when the caller has them."""
    meta = body["metadata"]
    status = dict(body.get("status") or {})
    try:
        spec = WorkspaceSpec.model_validate(dict(body.get("spec") or {}))
    except ValidationError as err:
        verdict = WorkspaceVerdict(
            ready=False, reason=Reason.INVALID_SPEC, message=str(err.errors()[0]["msg"]), unresolved=[]
        )
    else:
        if profiles is None:
            profiles = {p["metadata"]["name"]: p for p in await runtime.kube.list(PROFILE, meta["namespace"])}
        verdict = decide_workspace(spec=spec, profiles=profiles)
    update = set_condition(
        status.get("conditions"),
        type=ConditionType.READY,
        status=verdict.ready,
        reason=verdict.reason,
        message=verdict.message,
        generation=meta.get("generation"),
        now=runtime.clock(),
    )
    if update.changed or status.get("unresolvedProfiles", []) != verdict.unresolved:
        patch = {
            "status": {
                "conditions": update.conditions,
                "unresolvedProfiles": verdict.unresolved,
                "observedGeneration": meta.get("generation"),
            }
        }
        await runtime.kube.patch_status(WORKSPACE, meta["name"], patch, namespace=meta["namespace"])


def register(runtime: Runtime) -> None:
    @kopf.on.resume("helmhive.dev", "v1alpha1", "workspaces")
    @kopf.on.create("helmhive.dev", "v1alpha1", "workspaces")
    @kopf.on.update("helmhive.dev", "v1alpha1", "workspaces", field="spec")
    async def workspace_changed(body: kopf.Body, **_: Any) -> None:
        await reconcile_workspace(runtime, body)

    @kopf.on.event("helmhive.dev", "v1alpha1", "profiles")
    async def profile_changed(namespace: str | None, **_: Any) -> None:
        # A profile appearing, going or turning Valid (or not) changes its workspaces' readiness now.
        workspaces = await runtime.kube.list(WORKSPACE, namespace)
        if not workspaces:
            return
        profiles = {p["metadata"]["name"]: p for p in await runtime.kube.list(PROFILE, namespace)}
        for workspace in workspaces:
            await reconcile_workspace(runtime, workspace, profiles)

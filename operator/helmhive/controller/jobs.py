"""AgentJobs at queue time: bind the exact profile revision, or fail closed with a reason.

When a job is first seen, the operator resolves its profile (``spec.profile``, else the
Workspace's active profile for the job kind), requires it to be Valid at its current
revision, and writes ``status.profile``: name, revision, hash and the full effective
snapshot. Routing (a later step) reads only that binding, so editing the profile later
changes nothing about this job. A missing or invalid profile fails the job closed with
``Routed=False`` and a named reason; it never waits silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from helmhive.api.job import AgentJobSpec
from helmhive.api.kinds import kind_by_name
from helmhive.api.memory import WorkspaceSpec
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.kube import NotFound
from helmhive.controller.profiles import decide_profile_body, format_violations
from helmhive.controller.runtime import Runtime
from helmhive.policy.conditions import set_condition
from helmhive.policy.revisions import profile_hash, revision_name

__all__ = ["FailClosed", "bind_profile", "register"]

AGENT_JOB = kind_by_name("AgentJob")
PROFILE = kind_by_name("Profile")
WORKSPACE = kind_by_name("Workspace")


class FailClosed(Exception):
    """The job cannot be queued: ``reason`` is the fixed name for ``Routed=False``."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


async def _resolve_profile_name(runtime: Runtime, spec: AgentJobSpec, namespace: str) -> str:
    if spec.profile:
        return spec.profile
    try:
        workspace = await runtime.kube.get(WORKSPACE, spec.workspace, namespace=namespace)
    except NotFound:
        raise FailClosed(Reason.WORKSPACE_NOT_FOUND, f"workspace {spec.workspace} does not exist") from None
    parsed = WorkspaceSpec.model_validate(workspace.get("spec") or {})
    for binding in parsed.profiles:
        if binding.job_kind == spec.job_kind:
            return binding.profile
    raise FailClosed(
        Reason.PROFILE_NOT_FOUND, f"workspace {spec.workspace} names no active profile for {spec.job_kind.value}"
    )


async def bind_profile(runtime: Runtime, body: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``status.profile`` binding for a queued job, or raise FailClosed."""
    meta = body["metadata"]
    namespace = meta["namespace"]
    try:
        spec = AgentJobSpec.model_validate(dict(body.get("spec") or {}))
    except ValidationError as err:
        raise FailClosed(Reason.INVALID_SPEC, str(err.errors()[0]["msg"])) from None
    name = await _resolve_profile_name(runtime, spec, namespace)
    try:
        profile = await runtime.kube.get(PROFILE, name, namespace=namespace)
    except NotFound:
        raise FailClosed(Reason.PROFILE_NOT_FOUND, f"profile {name} does not exist in {namespace}") from None
    parsed, verdict = decide_profile_body(profile.get("spec") or {})
    if parsed is None or verdict.effective is None:
        raise FailClosed(
            Reason.PROFILE_NOT_VALID, f"profile {name} is not valid: {format_violations(verdict.violations)}"
        )
    if parsed.envelope != spec.job_kind:
        raise FailClosed(
            Reason.PROFILE_NOT_VALID,
            f"profile {name} is for envelope {parsed.envelope.value}, not job kind {spec.job_kind.value}",
        )
    digest = profile_hash(parsed)
    status = profile.get("status") or {}
    if status.get("currentHash") != digest:
        # The profile's revision for this spec does not exist yet; the profile reconciler makes it.
        raise kopf.TemporaryError(f"profile {name} has no revision for its current spec yet", delay=1)
    effective = verdict.effective
    return {
        "name": name,
        "revision": revision_name(name, digest),
        "hash": digest,
        "snapshot": effective.to_wire(),
        "boundAt": runtime.clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


async def queue_job(runtime: Runtime, body: Mapping[str, Any], logger: kopf.Logger) -> None:
    """Bind the profile of a newly seen job, or fail it closed."""
    meta = body["metadata"]
    status = dict(body.get("status") or {})
    if status.get("profile") is not None:
        return
    now = runtime.clock()
    try:
        binding = await bind_profile(runtime, body)
    except FailClosed as closed:
        conditions = status.get("conditions")
        for ctype in (ConditionType.ROUTED, ConditionType.READY):
            conditions = set_condition(
                conditions,
                type=ctype,
                status=False,
                reason=closed.reason,
                message=closed.message,
                generation=meta.get("generation"),
                now=now,
            ).conditions
        await runtime.kube.patch_status(
            AGENT_JOB, meta["name"], {"status": {"conditions": conditions}}, namespace=meta["namespace"]
        )
        logger.warning(
            "job %s/%s failed closed: %s: %s", meta["namespace"], meta["name"], closed.reason, closed.message
        )
        return
    await runtime.kube.patch_status(
        AGENT_JOB, meta["name"], {"status": {"profile": binding}}, namespace=meta["namespace"]
    )
    logger.info("job %s/%s bound to profile revision %s", meta["namespace"], meta["name"], binding["revision"])


def register(runtime: Runtime) -> None:
    @kopf.on.resume("helmhive.dev", "v1alpha1", "agentjobs")
    @kopf.on.create("helmhive.dev", "v1alpha1", "agentjobs")
    async def job_queued(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        await queue_job(runtime, body, logger)

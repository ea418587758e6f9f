"""Profiles: admission (refuse widening), reconcile (``Valid``, effective, revisions) and audit.

One logic, three places: :func:`helmhive.policy.profiles.narrowing.decide_profile` decides; the
validating webhook refuses a bad profile at ``kubectl apply``; the reconciler writes the
``Valid`` condition whatever path the object took (created before the operator ran, or
with the webhook bypassed), so a profile that is not Valid is never used.

Each distinct valid spec becomes an immutable ControllerRevision; ``status.currentRevision``
names the latest, history is bounded, and a revision a running job references is kept.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from helmhive.api.audit import AuditAction, AuditActor, AuditState
from helmhive.api.kinds import kind_by_name
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.door import Conflict
from helmhive.controller.runtime import Runtime
from helmhive.policy.agentjob.life import parse_agent_job
from helmhive.policy.audit.records import build_audit_record
from helmhive.policy.conditions import set_condition
from helmhive.policy.kstatus import with_kstatus
from helmhive.policy.profiles.narrowing import decide_profile_body, format_violations
from helmhive.policy.profiles.revisions import (
    LABEL_PROFILE,
    build_profile_revision,
    decide_revision_pruning,
    profile_hash,
    revision_name,
)
from helmhive.policy.routing.job_store import job_binding

__all__ = ["ACTOR_ANNOTATION", "actor_from", "decide_profile_body", "format_violations", "register"]

PROFILE = kind_by_name("Profile")
AGENT_JOB = kind_by_name("AgentJob")
ACTOR_ANNOTATION = "helmhive.dev/changed-by"
_MESSAGE_LIMIT = 1000
_JOB_PAGE = 500


def actor_from(meta: Mapping[str, Any]) -> AuditActor:
    """The last human (or controller) that changed the object, as the mutating webhook stamped it."""
    raw = (meta.get("annotations") or {}).get(ACTOR_ANNOTATION)
    try:
        data = json.loads(raw) if raw else None
        if isinstance(data, dict) and data.get("username"):
            return AuditActor.model_validate(data)
    except (ValueError, ValidationError):
        pass
    return AuditActor(username="unknown")


def _stamp_actor(userinfo: Mapping[str, Any], operator_username: str) -> str | None:
    username = str(userinfo.get("username", ""))[:256]
    if not username or username == operator_username:
        return None
    actor = AuditActor(
        username=username, uid=(userinfo.get("uid") or None), groups=list(userinfo.get("groups") or [])[:16]
    )
    return json.dumps(actor.to_wire(), separators=(",", ":"))


async def _referenced_revisions(runtime: Runtime, namespace: str, profile: str) -> set[str]:
    """The revisions of ``profile`` that unfinished jobs are bound to (never pruned).

    From the operator's job store once it is synced (a profile event then reads nothing). Before
    that (the operator reconciles every profile when it starts, while the store is still
    listing), a paginated LIST: one LIST of 10,000 jobs held whole was most of a restarted
    operator's memory peak (issue 12 §5).
    """
    if runtime.job_store.synced.is_set():
        return runtime.job_store.store.revisions_in_use(namespace, profile)
    referenced = set()
    async for page in runtime.kube.list_pages(AGENT_JOB, namespace, limit=_JOB_PAGE):
        for body in page:
            binding = job_binding(parse_agent_job(body))
            if binding is not None and binding[0] == profile:
                referenced.add(binding[1])
    return referenced


def _with_kstatus(conditions: list[dict[str, Any]], meta: Mapping[str, Any], now: dt.datetime) -> list[dict[str, Any]]:
    """``conditions`` with kstatus's ``Stalled`` for a profile that is not valid (helmhive.policy.kstatus)."""
    derived = with_kstatus("Profile", {"conditions": conditions}, generation=meta.get("generation"), now=now)
    return list(derived.get("conditions", conditions))


async def reconcile_profile(runtime: Runtime, body: Mapping[str, Any], logger: kopf.Logger) -> None:
    """Write ``Valid``, the effective profile and the current revision; create revisions; prune."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    status = dict(body.get("status") or {})
    now = runtime.clock()
    parsed, verdict = decide_profile_body(body.get("spec") or {})
    if parsed is None or verdict.effective is None:
        update = set_condition(
            status.get("conditions"),
            type=ConditionType.VALID,
            status=False,
            reason=verdict.violations[0].reason if verdict.violations else Reason.INVALID_SPEC,
            message=format_violations(verdict.violations),
            generation=meta.get("generation"),
            now=now,
        )
        conditions = _with_kstatus(update.conditions, meta, now)
        if conditions != status.get("conditions") or status.get("effective") is not None:
            patch = {
                "status": {
                    "conditions": conditions,
                    "effective": None,
                    "observedGeneration": meta.get("generation"),
                }
            }
            await runtime.kube.patch_status(PROFILE, name, patch, namespace=namespace)
            logger.warning("profile %s/%s is not valid: %s", namespace, name, format_violations(verdict.violations))
        return

    digest = profile_hash(parsed)
    current = revision_name(name, digest)
    revisions = await runtime.kube.list_revisions(namespace, f"{LABEL_PROFILE}={name}")
    known = {r["metadata"]["name"]: r for r in revisions}
    if current not in known:
        number = max((int(r.get("revision", 0)) for r in revisions), default=0) + 1
        manifest = build_profile_revision(profile=body, spec=parsed, effective=verdict.effective, number=number)
        try:
            known[current] = await runtime.kube.create_revision(namespace, manifest)
        except Conflict:
            known[current] = manifest
    if status.get("currentRevision") != current:
        record = build_audit_record(
            action=AuditAction.PROFILE_REVISION_CREATED,
            obj=body,
            actor=actor_from(meta),
            before=AuditState(revision=status.get("currentRevision"), hash=status.get("currentHash"))
            if status.get("currentRevision")
            else None,
            after=AuditState(revision=current, hash=digest),
            message=f"profile {name} is now at revision {current}",
            details={"envelope": parsed.envelope.value},
            now=now,
        )
        await ensure_audit_unless_terminating(
            runtime.kube, record, involved=dict(body), event_reason="RevisionCreated", now=now
        )
        logger.info("profile %s/%s is at revision %s", namespace, name, current)

    def prune(referenced: set[str]) -> list[str]:
        return decide_revision_pruning(
            revisions=list(known.values()),
            keep=runtime.config.revision_history_limit,
            current=current,
            referenced=referenced,
        )

    # References only ever save a revision: look them up only when something is past the history.
    doomed_revisions = prune(set())
    if doomed_revisions:
        doomed_revisions = prune(await _referenced_revisions(runtime, namespace, name))
    for doomed in doomed_revisions:
        await runtime.kube.delete_revision(namespace, doomed)
        known.pop(doomed, None)

    update = set_condition(
        status.get("conditions"),
        type=ConditionType.VALID,
        status=True,
        reason=Reason.VALID,
        message=f"narrowed to envelope {parsed.envelope.value}",
        generation=meta.get("generation"),
        now=now,
    )
    ordered = sorted(known.values(), key=lambda r: int(r.get("revision", 0)))
    desired = {
        "conditions": _with_kstatus(update.conditions, meta, now),
        "effective": verdict.effective.to_wire(),
        "currentRevision": current,
        "currentHash": digest,
        "revisions": [r["metadata"]["name"] for r in ordered][-64:],
        "observedGeneration": meta.get("generation"),
    }
    if any(status.get(k) != v for k, v in desired.items()):
        await runtime.kube.patch_status(PROFILE, name, {"status": desired}, namespace=namespace)


def register(runtime: Runtime, *, operator_username: str) -> None:
    """Register the profile handlers (and the actor-stamping webhook for profiles and memory)."""

    @kopf.on.validate("helmhive.dev", "v1alpha1", "profiles", id="profile-narrowing", operations=["CREATE", "UPDATE"])
    def validate_profile(spec: kopf.Spec, **_: Any) -> None:
        verdict = decide_profile_body(dict(spec))[1]
        if not verdict.valid:
            raise kopf.AdmissionError(format_violations(verdict.violations, limit=4000), code=422)

    for plural in ("profiles", "memoryrecords"):

        @kopf.on.mutate(
            "helmhive.dev",
            "v1alpha1",
            plural,
            id=f"stamp-actor-{plural}",
            operations=["CREATE", "UPDATE"],
            ignore_failures=True,
        )
        def stamp_actor(userinfo: kopf.UserInfo, patch: kopf.Patch, **_: Any) -> None:
            stamped = _stamp_actor(dict(userinfo), operator_username)
            if stamped is not None:
                patch.meta.annotations[ACTOR_ANNOTATION] = stamped

    @kopf.on.resume("helmhive.dev", "v1alpha1", "profiles")
    @kopf.on.create("helmhive.dev", "v1alpha1", "profiles")
    @kopf.on.update("helmhive.dev", "v1alpha1", "profiles", field="spec")
    async def profile_changed(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        await reconcile_profile(runtime, body, logger)

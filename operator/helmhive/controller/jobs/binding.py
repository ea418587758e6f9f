"""Binding a job's profile at queue time: the exact revision and snapshot, or why not (yet).

:func:`bind_profile` resolves the job's profile (``spec.profile``, else the Workspace's active
profile for the job kind), requires it to be Valid at its current revision, and returns the
``status.profile`` binding: name, revision, hash and the full effective snapshot. It reads the
Workspace and the Profile (each read a GET that started after the call, shared with the jobs
that asked meanwhile: :mod:`helmhive.controller.kube.shared_reads`) and writes nothing, so the operator's queue step
(:mod:`helmhive.controller.jobs.queueing`) and ``helmhive explain-routing`` bind the same way. No Kopf
here: the CLI imports it.

A profile's verdict (its parse, the envelope check and its hash) is a function of the object, so
it is kept per ``(namespace, name, resourceVersion)`` (:func:`_profile_verdict`, a small
bounded cache): a burst of jobs on one profile parses it once, not once per job.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from pydantic import ValidationError

from helmhive.api.job import AgentJobSpec
from helmhive.api.kinds import kind_by_name
from helmhive.api.memory import WorkspaceSpec
from helmhive.api.profile import ProfileSpec
from helmhive.api.reasons import Reason
from helmhive.controller.kube.door import NotFound
from helmhive.controller.runtime import Runtime
from helmhive.policy.profiles.narrowing import decide_profile_body, format_violations
from helmhive.policy.profiles.revisions import profile_hash, revision_name
from helmhive.policy.waiting import (
    MissingReference,
    Reference,
    missing_profile,
    missing_profile_binding,
    missing_workspace,
    pending_profile_revision,
)

__all__ = ["Expect", "FailClosed", "ProfileRevisionPending", "bind_profile"]

PROFILE = kind_by_name("Profile")
WORKSPACE = kind_by_name("Workspace")
Expect = Callable[[Reference], None]

_VERDICTS: OrderedDict[tuple[str, str, str], tuple[ProfileSpec | None, str, dict[str, Any] | None, str]] = OrderedDict()
_VERDICTS_KEPT = 256


def _profile_verdict(
    profile: Mapping[str, Any],
) -> tuple[ProfileSpec | None, str, dict[str, Any] | None, str]:
    """(the parsed spec, why it is invalid or "", the effective snapshot's wire form, its hash) of a Profile object.

    Kept per (namespace, name, resourceVersion): an object with the same resourceVersion is the same.
    """
    meta = profile.get("metadata") or {}
    version = str(meta.get("resourceVersion") or "")
    key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""), version)
    if version and key in _VERDICTS:
        _VERDICTS.move_to_end(key)
        return _VERDICTS[key]
    parsed, verdict = decide_profile_body(profile.get("spec") or {})
    if parsed is None or verdict.effective is None:
        found: tuple[ProfileSpec | None, str, dict[str, Any] | None, str] = (
            None,
            format_violations(verdict.violations),
            None,
            "",
        )
    else:
        found = (parsed, "", verdict.effective.to_wire(), profile_hash(parsed))
    if version:
        _VERDICTS[key] = found
        while len(_VERDICTS) > _VERDICTS_KEPT:
            _VERDICTS.popitem(last=False)
    return found


class FailClosed(Exception):
    """The job cannot be queued: ``reason`` is the fixed name for ``Routed=False``.

    ``missing`` is set when the reason is a reference that does not exist (yet); the queue
    step waits for it until the job's deadline instead of failing at once.
    """

    def __init__(self, reason: Reason, message: str, *, missing: MissingReference | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.missing = missing


class ProfileRevisionPending(Exception):
    """The profile is valid, but the revision for its current spec is not written yet."""

    def __init__(self, missing: MissingReference) -> None:
        super().__init__(missing.message)
        self.missing = missing


def _expect_nothing(_: Reference) -> None:
    return None


def _missing(missing: MissingReference) -> FailClosed:
    return FailClosed(missing.final_reason, missing.message, missing=missing)


async def _resolve_profile_name(runtime: Runtime, spec: AgentJobSpec, namespace: str, expect: Expect) -> str:
    if spec.profile:
        return spec.profile
    absent = missing_workspace(namespace=namespace, name=spec.workspace)
    expect(absent.reference)
    try:
        workspace = await runtime.reads.get(WORKSPACE, spec.workspace, namespace)
    except NotFound:
        raise _missing(absent) from None
    try:
        parsed: WorkspaceSpec | None = WorkspaceSpec.model_validate(workspace.get("spec") or {})
    except ValidationError:
        parsed = None  # an unreadable Workspace names no profile until it is fixed
    for binding in parsed.profiles if parsed is not None else ():
        if binding.job_kind == spec.job_kind:
            return binding.profile
    raise _missing(missing_profile_binding(namespace=namespace, workspace=spec.workspace, job_kind=spec.job_kind))


async def bind_profile(
    runtime: Runtime,
    body: Mapping[str, Any],
    *,
    expect: Expect = _expect_nothing,
    spec: AgentJobSpec | None = None,
) -> dict[str, Any]:
    """Return the ``status.profile`` binding for a queued job; raise FailClosed or ProfileRevisionPending.

    ``expect`` is told about each Workspace or Profile just before it is read. ``spec`` is the
    job's spec when the caller already validated it (it is validated here otherwise).
    """
    meta = body["metadata"]
    namespace = meta["namespace"]
    if spec is None:
        try:
            spec = AgentJobSpec.model_validate(dict(body.get("spec") or {}))
        except ValidationError as err:
            raise FailClosed(Reason.INVALID_SPEC, str(err.errors()[0]["msg"])) from None
    name = await _resolve_profile_name(runtime, spec, namespace, expect)
    absent = missing_profile(namespace=namespace, name=name)
    expect(absent.reference)
    try:
        profile = await runtime.reads.get(PROFILE, name, namespace)
    except NotFound:
        raise _missing(absent) from None
    parsed, invalid, snapshot, digest = _profile_verdict(profile)
    if parsed is None or snapshot is None:
        raise FailClosed(Reason.PROFILE_NOT_VALID, f"profile {name} is not valid: {invalid}")
    if parsed.envelope != spec.job_kind:
        raise FailClosed(
            Reason.PROFILE_NOT_VALID,
            f"profile {name} is for envelope {parsed.envelope.value}, not job kind {spec.job_kind.value}",
        )
    status = profile.get("status") or {}
    if status.get("currentHash") != digest:
        # The profile reconciler makes the revision; its status write wakes this job.
        raise ProfileRevisionPending(pending_profile_revision(namespace=namespace, name=name))
    return {
        "name": name,
        "revision": revision_name(name, digest),
        "hash": digest,
        # The cached copy is never handed out; it is plain JSON, and a JSON round trip copies it
        # several times faster than deepcopy (once per job).
        "snapshot": orjson.loads(orjson.dumps(snapshot)),
        "boundAt": runtime.clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
    }

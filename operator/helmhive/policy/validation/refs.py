"""Step 4 of offline validation: the rules across objects of one set. Pure.

Each object that parsed is checked against the others of its namespace (see
:mod:`helmhive.policy.validation.manifests` for the list): duplicates, profiles named by Workspaces,
AgentJobs and Changes (in the set, or declared external), their envelopes, Workspace bindings
and services, MemoryRecord scopes, and Envelope objects against the code catalogue. Issues are
added to the objects themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from helmhive.api.change import ChangeSpec
from helmhive.api.common import JobKind
from helmhive.api.envelope import EnvelopeSpec
from helmhive.api.job import AgentJobSpec
from helmhive.api.memory import MemoryRecordSpec, WorkspaceSpec
from helmhive.api.profile import ProfileSpec
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import ENVELOPES
from helmhive.policy.memory.selection import decide_memory_scope
from helmhive.policy.profiles.narrowing import decide_profile
from helmhive.policy.validation.model import CheckedObject
from helmhive.policy.violations import field_path

__all__ = ["EXTERNAL_PROFILES_ANNOTATION", "GOVERNED_STAGES", "apply_cross_object_rules"]

EXTERNAL_PROFILES_ANNOTATION = "helmhive.dev/external-profiles"
GOVERNED_STAGES = (JobKind.CHANGE_PLANNING, JobKind.CHANGE_IMPLEMENTATION, JobKind.CHANGE_REVIEW)


def apply_cross_object_rules(objects: list[CheckedObject], *, external: frozenset[str]) -> None:
    index: dict[tuple[str, str, str], CheckedObject] = {}
    for obj in objects:
        if not obj.name:
            continue
        namespace = "" if obj.kind == "Envelope" else obj.namespace
        key = (obj.kind, namespace, obj.name)
        first = index.get(key)
        if first is None:
            index[key] = obj
        else:
            obj.issue(
                "metadata.name",
                Reason.DUPLICATE_OBJECT,
                f"{obj.kind} {obj.name!r} is already defined in {first.doc.file} (document {first.doc.index + 1})",
            )
    refs = _References(index=index, external=external)
    for obj in objects:
        spec = obj.spec
        if isinstance(spec, ProfileSpec):
            envelope = ENVELOPES.get(spec.envelope)
            for violation in decide_profile(profile=spec, envelope=envelope).violations:
                obj.violation(violation)
        elif isinstance(spec, EnvelopeSpec):
            _check_envelope(obj, spec)
        elif isinstance(spec, WorkspaceSpec):
            for position, binding in enumerate(spec.profiles):
                refs.profile(
                    obj, binding.profile, binding.job_kind, field_path("spec", "profiles", position, "profile")
                )
        elif isinstance(spec, AgentJobSpec):
            _check_job(obj, spec, refs)
        elif isinstance(spec, ChangeSpec):
            _check_change(obj, spec, refs)
        elif isinstance(spec, MemoryRecordSpec):
            workspace = refs.workspace(obj, spec.workspace)
            if workspace is not None:
                for violation in decide_memory_scope(record=spec, workspace=workspace):
                    obj.violation(violation)


@dataclass(frozen=True, kw_only=True)
class _References:
    index: Mapping[tuple[str, str, str], CheckedObject]
    external: frozenset[str]

    def _is_external(self, obj: CheckedObject, name: str) -> bool:
        if name in self.external or f"{obj.namespace}/{name}" in self.external:
            return True
        listed = str(obj.annotations.get(EXTERNAL_PROFILES_ANNOTATION, ""))
        names = {n.strip() for n in listed.split(",")}
        return "*" in names or name in names

    def profile(self, obj: CheckedObject, name: str, job_kind: JobKind, where: str) -> None:
        target = self.index.get(("Profile", obj.namespace, name))
        if target is None:
            if not self._is_external(obj, name):
                obj.issue(
                    where,
                    Reason.PROFILE_NOT_FOUND,
                    f"profile {name!r} is not in the validated set"
                    + (f" (namespace {obj.namespace!r})" if obj.namespace else "")
                    + f"; add it, or mark it external with --external-profile {name} or the "
                    f"{EXTERNAL_PROFILES_ANNOTATION} annotation",
                )
            return
        if isinstance(target.spec, ProfileSpec) and target.spec.envelope != job_kind:
            obj.issue(
                where,
                Reason.PROFILE_KIND_MISMATCH,
                f"profile {name!r} names envelope {target.spec.envelope.value}, not {job_kind.value}",
            )

    def workspace(self, obj: CheckedObject, name: str) -> WorkspaceSpec | None:
        target = self.index.get(("Workspace", obj.namespace, name))
        return target.spec if target is not None and isinstance(target.spec, WorkspaceSpec) else None

    def binding(
        self, obj: CheckedObject, workspace_name: str, workspace: WorkspaceSpec, job_kind: JobKind, where: str
    ) -> None:
        if not any(b.job_kind == job_kind for b in workspace.profiles):
            obj.issue(
                where,
                Reason.PROFILE_NOT_FOUND,
                f"workspace {workspace_name!r} binds no profile for job kind {job_kind.value}",
            )

    def service(self, obj: CheckedObject, workspace_name: str, workspace: WorkspaceSpec, service: str | None) -> None:
        if service is None or any(s.name == service for s in workspace.services):
            return
        known = ", ".join(s.name for s in workspace.services) or "none"
        obj.issue(
            "spec.service",
            Reason.SERVICE_NOT_IN_WORKSPACE,
            f"service {service!r} is not a service of workspace {workspace_name!r} (services: {known})",
        )


def _check_job(obj: CheckedObject, spec: AgentJobSpec, refs: _References) -> None:
    if spec.profile is not None:
        refs.profile(obj, spec.profile, spec.job_kind, "spec.profile")
    workspace = refs.workspace(obj, spec.workspace)
    if workspace is None:
        return
    if spec.profile is None:
        refs.binding(obj, spec.workspace, workspace, spec.job_kind, "spec.jobKind")
    refs.service(obj, spec.workspace, workspace, spec.service)


def _check_change(obj: CheckedObject, spec: ChangeSpec, refs: _References) -> None:
    workspace = refs.workspace(obj, spec.workspace)
    if workspace is None:
        return
    for stage in GOVERNED_STAGES:
        refs.binding(obj, spec.workspace, workspace, stage, "spec.workspace")
    refs.service(obj, spec.workspace, workspace, spec.service)


def _check_envelope(obj: CheckedObject, spec: EnvelopeSpec) -> None:
    code = ENVELOPES.get(JobKind(obj.name)) if obj.name in set(JobKind) else None
    if code is None:
        obj.issue(
            "metadata.name",
            Reason.UNKNOWN_ENVELOPE,
            f"no envelope {obj.name!r} in the operator's catalogue; envelopes are published from code",
        )
        return
    wanted, given = code.to_wire(), spec.to_wire()
    for key in sorted({*wanted, *given}):
        if wanted.get(key) != given.get(key):
            obj.issue(
                field_path("spec", key),
                Reason.ENVELOPE_DIFFERS_FROM_CODE,
                "envelopes are published by the operator from code and cannot be changed; "
                "remove this object or make it equal to `kubectl get envelope "
                f"{obj.name} -o yaml`",
            )

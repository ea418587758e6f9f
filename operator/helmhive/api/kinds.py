"""The registry of every kind in ``helmhive.dev/v1alpha1``: names, scope, models and columns.

This is the one table the CRD generator, the offline validator and the operator read, so
a kind is added in exactly one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from helmhive.api.audit import AuditRecordSpec
from helmhive.api.change import ChangeSpec, ChangeStatus
from helmhive.api.egress import POOL_RULES
from helmhive.api.envelope import EnvelopeSpec, EnvelopeStatus
from helmhive.api.execution import EXECUTION_RULES
from helmhive.api.job import AgentJobSpec, AgentJobStatus
from helmhive.api.memory import MemoryRecordSpec, MemoryRecordStatus, WorkspaceSpec, WorkspaceStatus
from helmhive.api.pod_settings import RESOURCE_RULES
from helmhive.api.profile import ProfileSpec, ProfileStatus
from helmhive.api.runner import RunnerSpec, RunnerStatus
from helmhive.api.runnerpool import RunnerPoolSpec, RunnerPoolStatus
from helmhive.api.session import SessionBindingSpec, SessionBindingStatus
from helmhive.api.suggestion import SuggestionExportSpec, SuggestionExportStatus

__all__ = ["API_VERSION", "CATEGORY", "GROUP", "KINDS", "VERSION", "KindDef", "PrinterColumn", "kind_by_name"]

GROUP = "helmhive.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "helmhive"


@dataclass(frozen=True, kw_only=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    priority: int = 0
    description: str = ""


def _cond(name: str, ctype: str, *, priority: int = 0) -> PrinterColumn:
    return PrinterColumn(
        name=name,
        json_path=f'.status.conditions[?(@.type=="{ctype}")].status',
        priority=priority,
        description=f"Status of the {ctype} condition",
    )


def _reason(name: str, ctype: str, *, priority: int = 1) -> PrinterColumn:
    return PrinterColumn(
        name=name,
        json_path=f'.status.conditions[?(@.type=="{ctype}")].reason',
        priority=priority,
        description=f"Reason of the {ctype} condition",
    )


_AGE = PrinterColumn(name="Age", json_path=".metadata.creationTimestamp", type="date")


@dataclass(frozen=True, kw_only=True)
class KindDef:
    """Everything needed to publish one kind as a CRD."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool
    spec: type[BaseModel]
    status: type[BaseModel] | None
    columns: tuple[PrinterColumn, ...]
    description: str
    root_validations: tuple[dict[str, Any], ...] = field(default=())
    selectable_fields: tuple[str, ...] = field(default=())
    spec_required: bool = True

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


KINDS: tuple[KindDef, ...] = (
    KindDef(
        kind="Envelope",
        plural="envelopes",
        singular="envelope",
        short_names=("hhenv",),
        namespaced=False,
        spec=EnvelopeSpec,
        status=EnvelopeStatus,
        description="The fixed outer bounds of one job kind. Published by the operator from code; read-only.",
        columns=(
            PrinterColumn(name="Class", json_path=".spec.class"),
            PrinterColumn(name="Filesystem", json_path=".spec.filesystem"),
            PrinterColumn(name="Network", json_path=".spec.network"),
            PrinterColumn(name="Output", json_path=".spec.outputContract.format"),
            PrinterColumn(name="Memory", json_path=".spec.memory"),
            PrinterColumn(name="Tools", json_path=".spec.maxTools", priority=1),
            _cond("Published", "Published"),
            _AGE,
        ),
    ),
    KindDef(
        kind="Profile",
        plural="profiles",
        singular="profile",
        short_names=("hhprof",),
        namespaced=True,
        spec=ProfileSpec,
        status=ProfileStatus,
        description="How one kind of agent job runs: purpose, instructions, provider mappings and policies.",
        columns=(
            PrinterColumn(name="Envelope", json_path=".spec.envelope"),
            _cond("Valid", "Valid"),
            PrinterColumn(name="Revision", json_path=".status.currentRevision"),
            PrinterColumn(name="Providers", json_path=".spec.providerMappings[*].provider", priority=1),
            _reason("Reason", "Valid"),
            _AGE,
        ),
    ),
    KindDef(
        kind="MemoryRecord",
        plural="memoryrecords",
        singular="memoryrecord",
        short_names=("hhmem",),
        namespaced=True,
        spec=MemoryRecordSpec,
        status=MemoryRecordStatus,
        description="One approved decision or constraint, injected as context (never authority).",
        columns=(
            PrinterColumn(name="Workspace", json_path=".spec.workspace"),
            PrinterColumn(name="Scope", json_path=".spec.scope.type"),
            PrinterColumn(name="Service", json_path=".spec.scope.service"),
            PrinterColumn(name="Kind", json_path=".spec.kind"),
            PrinterColumn(name="Sensitivity", json_path=".spec.sensitivity"),
            _cond("Active", "Active"),
            PrinterColumn(name="Expires", json_path=".spec.expiresAt", type="date", priority=1),
            _AGE,
        ),
    ),
    KindDef(
        kind="Workspace",
        plural="workspaces",
        singular="workspace",
        short_names=("hhws",),
        namespaced=True,
        spec=WorkspaceSpec,
        status=WorkspaceStatus,
        description="Workspace intent: the repository, its services, and the active profile per job kind.",
        columns=(
            PrinterColumn(name="Repository", json_path=".spec.repository.url"),
            PrinterColumn(name="Services", json_path=".spec.services[*].name", priority=1),
            _cond("Ready", "Ready"),
            _AGE,
        ),
    ),
    KindDef(
        kind="RunnerPool",
        plural="runnerpools",
        singular="runnerpool",
        short_names=("rpool",),
        namespaced=True,
        spec=RunnerPoolSpec,
        status=RunnerPoolStatus,
        description="A managed set of runner pods that hold one provider login.",
        root_validations=POOL_RULES + RESOURCE_RULES + EXECUTION_RULES,
        columns=(
            PrinterColumn(name="Provider", json_path=".spec.provider"),
            PrinterColumn(name="Adapter", json_path=".spec.adapter.type"),
            PrinterColumn(name="Control", json_path=".spec.controlState"),
            PrinterColumn(name="Desired", json_path=".status.desiredReplicas", type="integer"),
            PrinterColumn(name="Ready", json_path=".status.readyReplicas", type="integer"),
            PrinterColumn(name="Schedulable", json_path=".status.schedulableRunners", type="integer"),
            PrinterColumn(name="Warm", json_path=".status.warmPodsReady", type="integer"),
            _AGE,
        ),
    ),
    KindDef(
        kind="Runner",
        plural="runners",
        singular="runner",
        short_names=("rnr",),
        namespaced=True,
        spec=RunnerSpec,
        status=RunnerStatus,
        description="One runner pod's registration: control state (spec), its own report and derived status.",
        columns=(
            PrinterColumn(name="Control", json_path=".status.effectiveControlState"),
            PrinterColumn(name="Status", json_path=".status.reportedStatus"),
            PrinterColumn(name="Auth", json_path=".status.report.authentication.state", priority=1),
            PrinterColumn(name="Provider", json_path=".status.report.provider"),
            PrinterColumn(name="Credential", json_path=".status.report.credentialIsolation"),
            PrinterColumn(name="Network", json_path=".status.report.sandbox.network"),
            PrinterColumn(name="Cgroups", json_path=".status.report.sandbox.cgroups", priority=1),
            PrinterColumn(name="Models", json_path=".status.models"),
            PrinterColumn(name="Default", json_path=".status.report.catalogue.default", priority=1),
            PrinterColumn(name="Jobs", json_path=".status.report.activeJobs", type="integer", priority=1),
            _cond("Schedulable", "Schedulable"),
            _cond("Qualified", "Qualified", priority=1),
            _AGE,
        ),
    ),
    KindDef(
        kind="AgentJob",
        plural="agentjobs",
        singular="agentjob",
        short_names=("ajob",),
        namespaced=True,
        spec=AgentJobSpec,
        status=AgentJobStatus,
        description="One agent job of one kind, routed at queue time or failed closed with a reason.",
        # A runner watches only its own assignments: --field-selector status.assignment.runner=<name>.
        selectable_fields=(".status.assignment.runner", ".spec.jobKind", ".spec.workspace"),
        columns=(
            PrinterColumn(name="Kind", json_path=".spec.jobKind"),
            PrinterColumn(name="Runner", json_path=".status.assignment.runner"),
            PrinterColumn(name="Model", json_path=".status.assignment.model"),
            _cond("Ready", "Ready"),
            _reason("Reason", "Ready", priority=0),
            PrinterColumn(name="Provider", json_path=".status.assignment.provider", priority=1),
            # A qualification probe names the runner it qualifies (docs/runners.md#qualification).
            PrinterColumn(name="Qualifies", json_path=r".metadata.labels.helmhive\.dev/qualification"),
            _AGE,
        ),
    ),
    KindDef(
        kind="Change",
        plural="changes",
        singular="change",
        short_names=("chg",),
        namespaced=True,
        spec=ChangeSpec,
        status=ChangeStatus,
        description="A governed change: plan, implement and review an immutable request at an exact commit.",
        columns=(
            PrinterColumn(name="Workspace", json_path=".spec.workspace"),
            PrinterColumn(name="Iteration", json_path=".status.iteration", type="integer"),
            _cond("Ready", "Ready"),
            _reason("Reason", "Ready", priority=0),
            PrinterColumn(name="Verdict", json_path=".status.review.verdict"),
            PrinterColumn(name="Patch-Bytes", json_path=".status.patch.bytes", type="integer", priority=1),
            PrinterColumn(name="Plan", json_path=".status.plan.digest", priority=1),
            _AGE,
        ),
    ),
    KindDef(
        kind="SessionBinding",
        plural="sessionbindings",
        singular="sessionbinding",
        short_names=("hhsess",),
        namespaced=True,
        spec=SessionBindingSpec,
        status=SessionBindingStatus,
        description="One chain of session continuity. The native session id lives only in the runner's Secret.",
        root_validations=(
            {"rule": "self.spec == oldSelf.spec", "message": "a session binding's key is immutable; reset it instead"},
        ),
        columns=(
            PrinterColumn(name="Workspace", json_path=".spec.workspace"),
            PrinterColumn(name="Profile", json_path=".spec.profile"),
            PrinterColumn(name="Provider", json_path=".spec.provider"),
            PrinterColumn(name="Runner", json_path=".spec.runner"),
            PrinterColumn(name="Scope", json_path=".spec.scope"),
            PrinterColumn(name="Service", json_path=".spec.service", priority=1),
            PrinterColumn(name="Stored", json_path=".status.stored", type="boolean"),
            PrinterColumn(name="Turns", json_path=".status.turns", type="integer"),
            PrinterColumn(name="Compactions", json_path=".status.compactions", type="integer", priority=1),
            PrinterColumn(name="Last-Used", json_path=".status.lastUsedAt", type="date"),
        ),
    ),
    KindDef(
        kind="SuggestionExport",
        plural="suggestionexports",
        singular="suggestionexport",
        short_names=("hhsugx",),
        namespaced=True,
        spec=SuggestionExportSpec,
        status=SuggestionExportStatus,
        description=(
            "One export of a policy-suggestion job's suggestions to files, in the requester's name; "
            "the operator audits it. Nothing is applied."
        ),
        root_validations=({"rule": "self.spec == oldSelf.spec", "message": "a suggestion export is immutable"},),
        columns=(
            PrinterColumn(name="Job", json_path=".spec.job"),
            PrinterColumn(name="Exported-By", json_path=".spec.exportedBy"),
            _cond("Recorded", "Recorded"),
            PrinterColumn(name="Audit", json_path=".status.auditRecord", priority=1),
            _AGE,
        ),
    ),
    KindDef(
        kind="AuditRecord",
        plural="auditrecords",
        singular="auditrecord",
        short_names=("hhaudit",),
        namespaced=True,
        spec=AuditRecordSpec,
        status=None,
        description="An append-only audit entry. Never holds a credential or a native session id.",
        root_validations=({"rule": "self.spec == oldSelf.spec", "message": "AuditRecords are append-only"},),
        columns=(
            PrinterColumn(name="Action", json_path=".spec.action"),
            PrinterColumn(name="Kind", json_path=".spec.object.kind"),
            PrinterColumn(name="Object", json_path=".spec.object.name"),
            PrinterColumn(name="Actor", json_path=".spec.actor.username"),
            PrinterColumn(name="Time", json_path=".spec.time", type="date"),
        ),
    ),
)


def kind_by_name(kind: str) -> KindDef:
    """Return the definition of ``kind``; KeyError names the known kinds otherwise."""
    for definition in KINDS:
        if definition.kind == kind:
            return definition
    raise KeyError(f"unknown kind {kind!r}; known: {', '.join(k.kind for k in KINDS)}")

"""The Runner kind: one runner pod of a RunnerPool (the pool is :mod:`helmhive.api.runnerpool`).

Each runner pod registers a Runner object and writes *only* ``status.report`` of its own Runner
(field manager ``helmhive-runner``); the operator writes everything it derives (field manager
``helmhive-operator``): the reported status, the effective control state and conditions.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
from typing import Annotated

from pydantic import Field

from helmhive.api.common import (
    ATOMIC_OBJECT,
    ApiModel,
    ControlState,
    LabelMap,
    LocalObjectRef,
    Message,
    Name,
    ShortText,
    StatusBase,
    immutable,
)
from helmhive.api.egress import CredentialIsolation
from helmhive.api.envelope import Capability
from helmhive.api.profile import ModelId, ProviderName
from helmhive.api.qualification import RunnerQualification
from helmhive.api.runnerpool import AdapterType

__all__ = [
    "REPORT_DIGEST_ANNOTATION",
    "AdapterInfo",
    "AuthReport",
    "AuthState",
    "CapabilitySource",
    "CgroupMode",
    "ModelCatalogue",
    "ModelEntry",
    "NetworkIsolation",
    "OfferedCapability",
    "ReportedStatus",
    "RunnerReport",
    "RunnerSpec",
    "RunnerStatus",
    "SandboxReport",
    "WithheldCapability",
    "WithheldReason",
    "build_report_digest",
]

REPORT_DIGEST_ANNOTATION = "helmhive.dev/report-digest"
"""The runner's Lease annotation: :func:`build_report_digest` of what its report says right now."""


class AuthState(enum.StrEnum):
    AUTHENTICATED = "Authenticated"
    UNAUTHENTICATED = "Unauthenticated"
    FAILING = "Failing"
    UNKNOWN = "Unknown"


class ReportedStatus(enum.StrEnum):
    """Derived by the operator from Lease freshness and authentication."""

    ONLINE = "Online"
    NEEDS_ATTENTION = "NeedsAttention"
    OFFLINE = "Offline"


class RunnerSpec(ApiModel):
    """Set by the operator at creation and by administrators afterwards."""

    pool_ref: Annotated[LocalObjectRef, Field(json_schema_extra=immutable("poolRef is immutable"))]
    control_state: ControlState | None = None


class ModelEntry(ApiModel):
    id: ModelId
    display_name: ShortText | None = None
    efforts: (
        Annotated[
            list[Annotated[str, Field(max_length=32)]] | None,
            Field(
                max_length=8,
                description=(
                    "The reasoning efforts the agent offers with this model (for an ACP agent, its effort option "
                    "once this model is set). Empty: no effort can be chosen, and routing refuses a job that "
                    "asks for one with this model (`EffortNotOffered`). Absent: the runner has not learnt them "
                    "(a model past the probe's bound, or one the agent would not set), and routing leaves the "
                    "check to the runner."
                ),
            ),
        ]
        | None
    ) = None


class ModelCatalogue(ApiModel):
    models: Annotated[list[ModelEntry], Field(max_length=64)] = []
    default: ModelId | None = None


class AdapterInfo(ApiModel):
    type: AdapterType
    name: ShortText
    version: Annotated[str, Field(max_length=64)]


class AuthReport(ApiModel):
    state: AuthState
    reason: Annotated[str, Field(max_length=128)] = ""
    message: Message = ""
    verified_at: Annotated[
        dt.datetime | None,
        Field(
            description=(
                "When the runner last checked this state with its agent (a probe). Older than the pool's "
                "`heartbeat.authMaxAgeSeconds`, or absent: the runner is not schedulable (`AuthStale`)."
            )
        ),
    ] = None


class NetworkIsolation(enum.StrEnum):
    """What confines the network of a job whose envelope disables it (``docs/security.md``)."""

    NAMESPACE = "Namespace"
    """A network namespace of its own with loopback only; its one way out is a relay to the egress proxy."""
    LANDLOCK = "Landlock"
    """Landlock's TCP rule: ``connect`` only to the proxy's (or the provider's) port, on any host."""
    NONE = "None"
    """No launcher (Landlock unavailable and optional): nothing but the pod's NetworkPolicy."""


class CgroupMode(enum.StrEnum):
    """How a job's totals (memory, processes, CPU rate) are bounded."""

    V2 = "V2"
    """A cgroup v2 per job under the runner's delegated cgroup."""
    V1 = "V1"
    """A cgroup per job in the writable cgroup v1 hierarchies (memory, pids, cpu)."""
    NONE = "None"
    """No cgroup is writable: per-process ``setrlimit`` limits only."""


class SandboxReport(ApiModel):
    """What this runner can enforce on its jobs, probed when it starts."""

    network: NetworkIsolation
    network_reason: Annotated[str, Field(max_length=512)] = ""
    """Why not ``Namespace`` (empty when it is)."""
    cgroups: CgroupMode = CgroupMode.NONE
    cgroups_reason: Annotated[str, Field(max_length=512)] = ""
    """Where the job cgroups are made, or why none can be."""
    disk_bytes: Annotated[int | None, Field(ge=0)] = None
    """Each job's disk limit (its workspace, HOME and TMPDIR together; ``jobLimits.diskBytes``)."""
    processes_contained: bool | None = None
    """Whether every process of a job ends with it without a cgroup: its agent runs under an init of its
    own in a pid namespace. False: only the job's cgroup (if any) finds a process that left its group."""
    files_read_only: bool | None = None
    """Whether a job's agent sees every mount read-only but its own directories (a mount namespace of its
    own), so it cannot change the runner's files, their metadata included."""


class CapabilitySource(enum.StrEnum):
    """Where an offered capability comes from (``docs/runners.md``, "Capabilities: declared and advertised")."""

    POOL = "Pool"
    """Declared by the pool and provided by Helmhive or the image; no agent advertisement decides it."""
    AGENT = "Agent"
    """Declared by the pool and advertised by the agent when the runner probed it."""


class WithheldReason(enum.StrEnum):
    NOT_ADVERTISED = "NotAdvertised"
    """The pool declares it; the agent's advertisement does not include it."""
    AGENT_NOT_PROBED = "AgentNotProbed"
    """The pool declares it, and no probe has yet learnt what the agent advertises."""


class OfferedCapability(ApiModel):
    name: Capability
    source: CapabilitySource


class WithheldCapability(ApiModel):
    """A capability the pool declares that the runner does not offer."""

    name: Capability
    reason: WithheldReason


class RunnerReport(ApiModel):
    """What a runner says about itself. Written only by that runner."""

    provider: ProviderName
    adapter: AdapterInfo
    authentication: AuthReport
    placement_labels: LabelMap = {}
    capabilities: Annotated[
        list[Capability],
        Field(
            max_length=32,
            description=(
                "The capabilities this runner offers (routing reads these): the pool's declaration, less any "
                "agent capability the agent did not advertise (see `withheldCapabilities`)."
            ),
        ),
    ] = []
    offered_capabilities: Annotated[list[OfferedCapability], Field(max_length=32)] = []
    """Each of ``capabilities`` with where it comes from."""
    withheld_capabilities: Annotated[list[WithheldCapability], Field(max_length=32)] = []
    """Declared by the pool, not offered: the agent did not advertise them (or was not probed yet)."""
    agent_capabilities: Annotated[list[Capability] | None, Field(max_length=16)] = None
    """What the agent advertised, in Helmhive's names (``session-load``, ``session-fork``, ``mcp-http``…);
    absent until a probe initialised the agent."""
    concurrency: Annotated[int, Field(ge=0, le=64)] = 1
    active_jobs: Annotated[int, Field(ge=0, le=64)] = 0
    environment_fingerprint: Annotated[str, Field(max_length=80)]
    catalogue: ModelCatalogue = ModelCatalogue()
    credential_generation: Annotated[int, Field(ge=0)] = 0
    credential_isolation: CredentialIsolation | None = None
    """Where this runner keeps its provider credential while agents run (Proxy or InSandbox)."""
    sandbox: SandboxReport | None = None
    """What confines its jobs' network and totals (a runner that runs no jobs reports none)."""
    pod_name: Name
    reported_at: dt.datetime
    registered_at: dt.datetime | None = None
    """When this runner process registered; a new value means a new registration (audited by the operator)."""


class RunnerStatus(StatusBase):
    """``report`` is the runner's; every other field is the operator's."""

    report: RunnerReport | None = None
    reported_status: ReportedStatus | None = None
    effective_control_state: ControlState | None = None
    last_heartbeat_time: dt.datetime | None = None
    """The Lease's renewTime when the operator last wrote this status (the Lease is the live heartbeat)."""
    registered_at: dt.datetime | None = None
    """The registration (``report.registeredAt``) the operator has audited; a differing report is a new one."""
    models: Annotated[str, Field(max_length=256)] | None = None
    """The advertised model ids, default first, for ``kubectl get runners`` (derived from the report)."""
    qualification: Annotated[RunnerQualification | None, Field(json_schema_extra=ATOMIC_OBJECT)] = None
    """The current qualification round, when the pool names probes (``spec.qualification``)."""


def build_report_digest(report: RunnerReport) -> str:
    """``sha256:<hex>`` of the report's catalogue and authentication (state, reason, ``verifiedAt``).

    The runner puts it on its Lease at every renewal; the operator computes it from the Runner's
    report, and a disagreement means the report is stale. The auth message is prose and left out.
    """
    auth = report.authentication
    document = {
        "catalogue": report.catalogue.model_dump(mode="json", by_alias=True, exclude_none=True),
        "auth": [auth.state.value, auth.reason, auth.verified_at.isoformat() if auth.verified_at else None],
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()

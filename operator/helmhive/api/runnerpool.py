"""The RunnerPool kind: a managed set of runner pods that share a provider login.

The pool's spec says what its pods run (the adapter and its image), which login they hold
(``credential``) and where it stays while agents run (``credentialIsolation``, ``egress``), what
they offer to routing (placement labels, capabilities, concurrency), how many there are, and the
limits they put on every job, and where those jobs run (``execution``: in the runner pod, or each
in a Pod of its own, :mod:`helmhive.api.execution`). The operator derives the pool's status; the
Runner kind each pod registers is :mod:`helmhive.api.runner`.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from helmhive.api.common import (
    ApiModel,
    ControlState,
    LabelMap,
    LabelSelector,
    LocalObjectRef,
    Name,
    SecretKeyRef,
    StatusBase,
)
from helmhive.api.egress import CredentialIsolation, EgressSpec, decide_isolation, decide_isolation_problems
from helmhive.api.envelope import Capability
from helmhive.api.execution import ExecutionSpec, decide_execution_problems
from helmhive.api.pod_settings import (
    DEFAULT_JOB_MEMORY_BYTES,
    ContainerResources,
    NodeSelector,
    PodMetadata,
    Toleration,
    decide_resource_problems,
)
from helmhive.api.profile import ModelId, ProviderName
from helmhive.api.qualification import QUALIFICATION_RULES, QualificationSpec

__all__ = [
    "DEFAULT_JOB_DISK_BYTES",
    "AcpAdapterSpec",
    "AdapterSpec",
    "AdapterType",
    "ClaudeCliAdapterSpec",
    "CompactionSettings",
    "CredentialSpec",
    "EnvVar",
    "HeartbeatSettings",
    "JobLimits",
    "PoolSourceSpec",
    "RunnerPoolSpec",
    "RunnerPoolStatus",
    "VolumeCredential",
]

ImageRef = Annotated[str, StringConstraints(min_length=1, max_length=512)]
Arg = Annotated[str, StringConstraints(max_length=1024)]


class AdapterType(enum.StrEnum):
    ACP = "acp"
    CLAUDE_CLI = "claude-cli"


class EnvVar(ApiModel):
    """A plain environment variable for the agent. Secrets go through ``credential``."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    value: Annotated[str, StringConstraints(max_length=4096)] = ""


class AcpAdapterSpec(ApiModel):
    command: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    args: Annotated[list[Arg], Field(max_length=32)] = []
    env: Annotated[list[EnvVar], Field(max_length=32)] = []


class ClaudeCliAdapterSpec(ApiModel):
    path: Annotated[str, StringConstraints(min_length=1, max_length=1024)] = "claude"
    extra_args: Annotated[list[Arg], Field(max_length=32)] = []
    models: Annotated[
        list[ModelId],
        Field(
            max_length=32,
            description=(
                "Pins the runners' model catalogue: exactly these ids (aliases or full names, passed to "
                "`claude --model` as written). Empty (the default): the runner advertises the aliases `claude "
                "--help` names and the full ids the CLI resolves them to."
            ),
        ),
    ] = []
    default_model: Annotated[
        ModelId | None,
        Field(
            description=(
                "The model a job without an explicit model runs with (passed as `--model`). Must be one of "
                "`models` when those are pinned. Unset: the first of `models` when pinned, else the CLI's own default "
                "(`ANTHROPIC_MODEL`, its settings file's `model`, or its choice) as the CLI resolves it."
            )
        ),
    ] = None

    @model_validator(mode="after")
    def _default_is_pinned(self) -> ClaudeCliAdapterSpec:
        if self.models and self.default_model is not None and self.default_model not in self.models:
            raise ValueError(f"defaultModel {self.default_model!r} must be one of models when models are pinned")
        return self


class AdapterSpec(ApiModel):
    type: AdapterType
    acp: AcpAdapterSpec | None = None
    claude_cli: Annotated[
        ClaudeCliAdapterSpec | None,
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [
                    {
                        "rule": "!has(self.defaultModel) || !has(self.models) || size(self.models) == 0 "
                        "|| self.defaultModel in self.models",
                        "message": "defaultModel must be one of models when models are pinned",
                        "fieldPath": ".defaultModel",
                        "reason": "FieldValueInvalid",
                    }
                ]
            }
        ),
    ] = None


class VolumeCredential(ApiModel):
    """A persistent volume holding a subscription login that keeps state on disk."""

    claim_name: Name
    mount_path: Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^/")]


class CredentialSpec(ApiModel):
    """Exactly one of a Secret key (an API key) or a volume (a subscription login)."""

    secret_ref: SecretKeyRef | None = None
    volume: VolumeCredential | None = None
    env_name: Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = (
        "PROVIDER_API_KEY"
    )


class PoolSourceSpec(ApiModel):
    """How the pool's runners fetch a governed change's exact source (see docs/source.md)."""

    credentials_secret: Annotated[
        LocalObjectRef | None,
        Field(
            description=(
                "A Secret in the pool's namespace with keys `username` and `password` (a password or token) for "
                "private git repositories over HTTPS. Mounted read-only for the runner's own fetch; "
                "never given to the agent."
            )
        ),
    ] = None


class HeartbeatSettings(ApiModel):
    lease_duration_seconds: Annotated[int, Field(ge=5, le=600)] = 20
    renew_interval_seconds: Annotated[int, Field(ge=1, le=120)] = 5
    report_refresh_seconds: Annotated[int, Field(ge=30, le=3600)] = 300
    auth_max_age_seconds: Annotated[
        int,
        Field(
            ge=120,
            le=86400,
            description=(
                "How old a runner's last authentication check (`report.authentication.verifiedAt`) may be before "
                "the runner is unschedulable (`AuthStale`). The runner re-verifies at least every quarter of it. "
                "Default 3600."
            ),
        ),
    ] = 3600


_MIB = 1024 * 1024


class CompactionSettings(ApiModel):
    """When the runner compacts a resumed session chain, and how long it waits for the agent.

    See ``docs/sessions.md#compaction``: after a turn that leaves the session at or above the
    watermark (from the agent's ACP ``usage_update``, or the Claude CLI's stream-json usage), the
    runner sends the agent's advertised compact command, or archives the session and starts a
    fresh one carrying the system prompt.
    """

    watermark_percent: Annotated[
        int,
        Field(
            ge=10,
            le=95,
            description=(
                "Compact after a turn that leaves the session's context at or above this percent of its "
                "window, as the agent last reported it (ACP usage_update used/size; for the Claude CLI, "
                "the turn's last model call usage and the model's contextWindow). Default 80."
            ),
        ),
    ] = 80
    command_timeout_seconds: Annotated[
        int,
        Field(
            ge=5,
            le=600,
            description=(
                "How long the agent's compact command may send nothing before it is cancelled and the "
                "session is archived instead (also bounded by the agent's idle timeout). Default 180."
            ),
        ),
    ] = 180
    checkpoint_prompt: Annotated[
        str | None,
        Field(
            max_length=2000,
            description=(
                "The checkpoint turn: a prompt sent on the session before it is compacted, asking the agent "
                "to write down what a successor needs. Its answer (at most 8000 characters) is carried into the "
                "fresh session when the session is archived, after the profile's instructions; with a compact "
                "command it stays in the session being compacted. Run once per compaction. Unset: a built-in "
                "prompt; an empty string: no checkpoint turn."
            ),
        ),
    ] = None


DEFAULT_JOB_DISK_BYTES = 4 * 1024 * _MIB
"""A job's disk by default (``jobLimits.diskBytes``): 4 GiB."""


class JobLimits(ApiModel):
    """Limits on each job's agent and every process it starts (and on a governed job's checks).

    Enforced with ``setrlimit`` by the sandbox launcher, and as the job's totals in a cgroup of its
    own where the pod allows one; what each one covers, and where it is not enforced, is in
    ``docs/security.md``. A job that hits one ends ``ResourceLimitExceeded:<limit>``.
    """

    memory_bytes: Annotated[
        int,
        Field(
            ge=64 * _MIB,
            le=1024 * 1024 * _MIB,
            description=(
                "Private writable memory (heap and anonymous mappings) of each process, in bytes "
                "(RLIMIT_DATA), and with a job cgroup all the job's memory together, no swap. Default 1 GiB, "
                "below the runner pod's default memory limit (resources.limits.memory, 2Gi); a limit the pool "
                "sets must hold it."
            ),
        ),
    ] = DEFAULT_JOB_MEMORY_BYTES
    cpu_seconds: Annotated[
        int,
        Field(
            ge=1,
            le=7 * 24 * 3600,
            description=(
                "CPU time of each process, in seconds (RLIMIT_CPU: SIGXCPU, then SIGKILL 5 s later). Default 3600."
            ),
        ),
    ] = 3600
    processes: Annotated[
        int,
        Field(
            ge=8,
            le=65536,
            description=(
                "Processes and threads of the whole job: its cgroup's pids.max where the runner can make job "
                "cgroups, and RLIMIT_NPROC in the job's own user namespace; with neither (no cgroup, and a root "
                "runner or no user namespaces) not enforced. Default 512."
            ),
        ),
    ] = 512
    open_files: Annotated[
        int,
        Field(
            ge=32,
            le=1048576,
            description="Open file descriptors of each process (RLIMIT_NOFILE). Default 4096.",
        ),
    ] = 4096
    cpu_millicores: Annotated[
        int,
        Field(
            ge=100,
            le=256000,
            description=(
                "CPU rate of the whole job, in thousandths of a core (cpu.max, or cpu.cfs_quota_us on cgroup v1); "
                "only with a job cgroup. Default 2000 (two cores)."
            ),
        ),
    ] = 2000
    disk_bytes: Annotated[
        int,
        Field(
            ge=16 * _MIB,
            le=16 * 1024 * 1024 * _MIB,
            description=(
                "Disk of the whole job, in bytes: its workspace, HOME and TMPDIR together, measured by the runner "
                "while the job runs and when its agent ends, and no file of the job larger (RLIMIT_FSIZE). "
                "Default 4 GiB, below the runner pod's state volume."
            ),
        ),
    ] = DEFAULT_JOB_DISK_BYTES


class RunnerPoolSpec(ApiModel):
    provider: ProviderName
    adapter: Annotated[
        AdapterSpec,
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [
                    {
                        "rule": "self.type == 'acp' ? has(self.acp) : !has(self.acp)",
                        "message": "adapter.acp is required when type is acp, and forbidden otherwise",
                    }
                ]
            }
        ),
    ]
    image: ImageRef
    image_pull_policy: Annotated[str, Field(pattern=r"^(Always|IfNotPresent|Never)$", max_length=16)] = "IfNotPresent"
    image_pull_secrets: Annotated[
        list[LocalObjectRef],
        Field(
            max_length=8,
            description="Secrets in the pool's namespace for pulling the runner image (the pods' imagePullSecrets).",
        ),
    ] = []
    credential: Annotated[
        CredentialSpec,
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [
                    {
                        "rule": "has(self.secretRef) != has(self.volume)",
                        "message": "credential needs exactly one of secretRef or volume",
                    }
                ]
            }
        ),
    ]
    credential_isolation: Annotated[
        CredentialIsolation | None,
        Field(
            description=(
                "Where the provider credential is while an agent runs. Proxy: only in the runner process, whose "
                "egress proxy adds it to requests for the provider's API host; the agent gets a placeholder and "
                "its network is reduced to the proxy. InSandbox: in the agent's environment or login directory. "
                "Default: Proxy for an API key (credential.secretRef) when the upstream is known (egress.upstream, "
                "or the provider is anthropic, openai, google or reference); InSandbox for a login volume (the CLI "
                "refreshes its tokens itself: see docs/security.md) and for other providers."
            )
        ),
    ] = None
    egress: Annotated[
        EgressSpec,
        Field(description="Where the egress proxy forwards, with credentialIsolation Proxy (defaults per provider)."),
    ] = EgressSpec()
    source: PoolSourceSpec = PoolSourceSpec()
    placement_labels: LabelMap = {}
    capabilities: Annotated[
        list[Capability],
        Field(
            max_length=32,
            description=(
                "What the pool's runners offer to routing. A name of an agent feature (session-load, "
                "session-resume, session-fork, mcp-http, mcp-sse, prompt-image, prompt-embedded-context) "
                "is offered only when the agent advertises it; the CapabilitiesAdvertised condition names "
                "any the agent lacks (docs/runners.md)."
            ),
        ),
    ] = []
    concurrency: Annotated[int, Field(ge=1, le=64)] = 1
    replicas: Annotated[int, Field(ge=0, le=100)] = 1
    serves_namespaces: Annotated[
        LabelSelector,
        Field(
            description=(
                "Namespaces, by label, whose jobs this pool may run besides its own. "
                "Empty (the default): only the pool's own namespace; a login is never lent cluster-wide by default."
            )
        ),
    ] = LabelSelector()
    control_state: ControlState = ControlState.ACTIVE
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    job_limits: Annotated[
        JobLimits,
        Field(description="Per-job limits on the agent and its checks (goes into runner.json); safe defaults."),
    ] = JobLimits()
    execution: Annotated[
        ExecutionSpec,
        Field(
            description=(
                "Where each job's agent runs: in the runner pod (mode InRunner, the default) or in a Pod of its own "
                "(mode JobPod, which needs credentialIsolation Proxy)."
            )
        ),
    ] = ExecutionSpec()
    compaction: Annotated[
        CompactionSettings,
        Field(description="When resumed session chains are compacted (goes into runner.json); safe defaults."),
    ] = CompactionSettings()
    resources: Annotated[
        ContainerResources,
        Field(
            description=(
                "The runner container's requests and limits (Kubernetes quantities); the runner and its jobs share "
                "them. Default: requests cpu 100m and memory 256Mi, limits memory 2Gi."
            )
        ),
    ] = ContainerResources()
    node_selector: Annotated[NodeSelector, Field(description="Node labels the runner pods must be scheduled on.")] = {}
    tolerations: Annotated[list[Toleration], Field(max_length=32, description="Taints the runner pods tolerate.")] = []
    priority_class_name: Annotated[
        Name | None, Field(description="The runner pods' PriorityClass (it must exist when the pods are created).")
    ] = None
    pod_metadata: Annotated[
        PodMetadata,
        Field(description="Labels and annotations for the runner pods; Helmhive's own keys are reserved."),
    ] = PodMetadata()
    qualification: Annotated[
        QualificationSpec | None,
        Field(
            description=(
                "Probes that qualify each runner before (and while) it takes user jobs: run by the operator as "
                "AgentJobs routed to that runner, labelled helmhive.dev/qualification=<runner> (docs/runners.md)."
            ),
            json_schema_extra={"x-kubernetes-validations": QUALIFICATION_RULES},
        ),
    ] = None

    @model_validator(mode="after")
    def _pool_rules(self) -> RunnerPoolSpec:
        """POOL_RULES, RESOURCE_RULES and EXECUTION_RULES: every broken one is reported, as by the API server."""
        problems = decide_isolation_problems(
            provider=self.provider,
            requested=self.credential_isolation,
            volume=self.credential.volume is not None,
            upstream=self.egress.upstream,
            replicas=self.replicas,
        )
        own_limits = "resources" in self.model_fields_set and "limits" in self.resources.model_fields_set
        job_memory = self.job_limits.memory_bytes if own_limits else None  # see RESOURCE_RULES
        problems += decide_resource_problems(self.resources, job_memory_bytes=job_memory)
        isolation = decide_isolation(
            requested=self.credential_isolation,
            volume=self.credential.volume is not None,
            provider=self.provider,
            upstream=self.egress.upstream,
        )
        problems += decide_execution_problems(execution=self.execution, isolation=isolation)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class RunnerPoolStatus(StatusBase):
    desired_replicas: Annotated[int, Field(ge=0)] = 0
    ready_replicas: Annotated[int, Field(ge=0)] = 0
    schedulable_runners: Annotated[int, Field(ge=0)] = 0
    warm_pods_ready: Annotated[int, Field(ge=0)] | None = None
    """Mode JobPod: the warm pods ready to be claimed (condition ``WarmPodsReady`` says why not more)."""
    credential_hash: Annotated[str, Field(max_length=80)] | None = None
    credential_generation: Annotated[int, Field(ge=0)] = 0

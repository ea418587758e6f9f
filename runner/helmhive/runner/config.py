"""The runner's configuration: its environment (downward API, mounts) and the pool's ``runner.json``.

Two sources, both read once at startup (see ``docs/runner-program.md``):

- the **environment**: who this runner is (``HELMHIVE_RUNNER_NAME``, ``HELMHIVE_NAMESPACE``,
  ``HELMHIVE_POOL``), where its files are (``HELMHIVE_RUNNER_CONFIG``, ``HELMHIVE_CREDENTIAL_FILE``
  or ``HELMHIVE_CREDENTIAL_DIR``, ``HELMHIVE_STATE_DIR``, the git credentials in
  ``HELMHIVE_SOURCE_CREDENTIALS_DIR``), the credential generation, and a few tunables;
- **runner.json**, written by the operator into the ConfigMap ``helmhive-runner-<pool>``: the
  pool-derived settings (provider, adapter, placement labels, capabilities, concurrency,
  heartbeat settings, per-job limits, where jobs run and, for ``execution.mode: JobPod``, the
  warm job pod the runner claims or copies: ``jobPodTemplate``), in the API's camelCase.

:func:`load_config` is pure given its inputs (a mapping and the file's text); it gathers every
problem, each named by the variable or field path, and raises them together as one
:class:`ConfigError`. Nothing here reads the credential itself.
"""

from __future__ import annotations

import enum
import ipaddress
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from helmhive.api.common import ApiModel, LabelMap, Name
from helmhive.api.egress import CredentialIsolation, EgressSpec, decide_isolation, decide_isolation_problems
from helmhive.api.envelope import Capability
from helmhive.api.execution import ExecutionMode, ExecutionSpec, decide_execution_problems
from helmhive.api.jobpod import LINK_KEY_FILE
from helmhive.api.profile import ProviderName
from helmhive.api.runnerpool import AdapterSpec, AdapterType, CompactionSettings, HeartbeatSettings, JobLimits

__all__ = [
    "ENV",
    "ConfigError",
    "LandlockMode",
    "RunnerConfig",
    "RunnerEnvironment",
    "RunnerFileConfig",
    "SandboxSettings",
    "load_config",
]

EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
AbsolutePath = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=r"^/")]


def _ip_address(text: str) -> str:
    return str(ipaddress.ip_address(text))  # ValueError: pydantic names the variable


IPAddressText = Annotated[str, StringConstraints(max_length=64), AfterValidator(_ip_address)]

ENV = {
    "runner_name": "HELMHIVE_RUNNER_NAME",
    "namespace": "HELMHIVE_NAMESPACE",
    "pool": "HELMHIVE_POOL",
    "config_path": "HELMHIVE_RUNNER_CONFIG",
    "credential_generation": "HELMHIVE_CREDENTIAL_GENERATION",
    "credential_file": "HELMHIVE_CREDENTIAL_FILE",
    "credential_dir": "HELMHIVE_CREDENTIAL_DIR",
    "source_credentials_dir": "HELMHIVE_SOURCE_CREDENTIALS_DIR",
    "state_dir": "HELMHIVE_STATE_DIR",
    "kubeconfig": "KUBECONFIG",
    "image": "HELMHIVE_RUNNER_IMAGE",
    "shutdown_grace_seconds": "HELMHIVE_SHUTDOWN_GRACE_SECONDS",
    "probe_interval_seconds": "HELMHIVE_PROBE_INTERVAL_SECONDS",
    "probe_timeout_seconds": "HELMHIVE_PROBE_TIMEOUT_SECONDS",
    "metrics_port": "HELMHIVE_METRICS_PORT",
    "metrics_addr": "HELMHIVE_METRICS_ADDR",
    "api_patience_seconds": "HELMHIVE_API_PATIENCE_SECONDS",
    "watch_round_seconds": "HELMHIVE_WATCH_ROUND_SECONDS",
    "pod_ip": "HELMHIVE_POD_IP",
    "jobpod_link_key_file": "HELMHIVE_JOBPOD_LINK_KEY_FILE",
}
"""Field of :class:`RunnerEnvironment` -> the environment variable it is read from."""


class ConfigError(Exception):
    """The configuration is unusable; ``problems`` lists each one with its variable or field path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class RunnerEnvironment(BaseModel):
    """What the pod's environment says (see :data:`ENV` for the variable names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runner_name: Name
    namespace: Name
    pool: Name
    config_path: Path
    credential_generation: Annotated[int, Field(ge=0)] = 0
    credential_file: Path | None = None
    credential_dir: Path | None = None
    source_credentials_dir: Path | None = None
    """The mounted git credentials Secret (``username``, ``password``) for private repositories;
    read only by the runner's source fetch (:mod:`helmhive.runner.source.fetch`)."""
    state_dir: Path = Path("/var/lib/helmhive-runner")
    kubeconfig: Path | None = None
    image: Annotated[str, Field(max_length=512)] = ""
    shutdown_grace_seconds: Annotated[float, Field(gt=0, le=600)] = 30.0
    """SIGTERM: how long running jobs may take to finish before they are cancelled."""
    probe_interval_seconds: Annotated[float, Field(ge=1, le=3600)] = 300.0
    """How often the adapter is probed again (authentication, catalogue). An ACP probe opens a
    session (ACP has no other way to ask about the login), so this is not a heartbeat."""
    probe_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 60.0
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """The port of the Prometheus ``/metrics`` endpoint (:mod:`helmhive.runner.metrics`); 0 serves none.
    A pool's pods set it to the container port named ``metrics``."""
    metrics_addr: Annotated[str, Field(min_length=1, max_length=255)] = "0.0.0.0"
    api_patience_seconds: Annotated[float, Field(ge=1, le=86400)] = 900.0
    """How long a job's status reads and writes are retried while the API server is unreachable
    (:mod:`helmhive.runner.patience`); past it a finished job's result waits in the journal."""
    watch_round_seconds: Annotated[int, Field(ge=5, le=1800)] = 300
    """The longest one watch request lasts (its Runner's, its jobs'); the next resumes from the
    last version seen, without a list (:meth:`helmhive.runner.kube.RunnerKube.watch_objects`)."""
    pod_ip: IPAddressText | None = None
    """The runner pod's IP (downward API ``status.podIP``); with ``execution.mode: JobPod`` its job pods'
    agents reach its proxy there (:data:`~helmhive.api.jobpod.RUNNER_PROXY_PORT`), so it is required then."""
    jobpod_link_key_file: Path = Path(LINK_KEY_FILE)
    """The pool's job pod link key (JobPod mode): the contract's mount; set only where that is elsewhere (tests)."""


class LandlockMode(enum.StrEnum):
    REQUIRED = "required"
    """Without Landlock every job fails closed with ``SandboxUnavailable`` (the default)."""
    OPTIONAL = "optional"
    """Without Landlock jobs run with permission bits and the ACP checks only; each job says so."""


class SandboxSettings(ApiModel):
    """How the job sandbox is built (``docs/security.md``); every field is optional."""

    landlock: LandlockMode = LandlockMode.REQUIRED
    read_paths: Annotated[list[AbsolutePath], Field(max_length=32)] = []
    """Extra paths the agent may read (beyond the system directories and the runtime's own)."""
    write_paths: Annotated[list[AbsolutePath], Field(max_length=32)] = []
    """Extra paths the agent may write (beyond its HOME, the job's tmp and, for write jobs, the workspace)."""
    provider_ports: Annotated[list[Annotated[int, Field(ge=1, le=65535)]], Field(max_length=8)] = [443]
    """With network disabled and ``credentialIsolation: InSandbox``: the only TCP ports the agent may
    connect to (its provider's API). With ``Proxy`` the only port is the egress proxy's."""


class RunnerFileConfig(ApiModel):
    """``runner.json``: the pool-derived settings, camelCase as in the RunnerPool spec."""

    provider: ProviderName
    adapter: AdapterSpec
    placement_labels: LabelMap = {}
    capabilities: Annotated[list[Capability], Field(max_length=32)] = []
    concurrency: Annotated[int, Field(ge=1, le=64)] = 1
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    credential_env_name: EnvName = "PROVIDER_API_KEY"
    """The agent's environment variable that receives the credential file's content."""
    credential_dir_env_name: EnvName | None = None
    """The agent's environment variable that names the login directory (claude-cli: ``CLAUDE_CONFIG_DIR``)."""
    sandbox: SandboxSettings = SandboxSettings()
    job_limits: JobLimits = JobLimits()
    """The pool's ``spec.jobLimits``: setrlimit values the sandbox launcher applies to each job's agent and checks."""
    compaction: CompactionSettings = CompactionSettings()
    """The pool's ``spec.compaction``: when a resumed session chain is compacted (``docs/sessions.md``)."""
    credential_isolation: CredentialIsolation | None = None
    """Proxy or InSandbox; absent: as :func:`helmhive.api.egress.decide_isolation` decides (Proxy for a
    credential file whose upstream is known, InSandbox for a login directory)."""
    egress: EgressSpec = EgressSpec()
    """Where the egress proxy forwards (``helmhive.runner.egress.proxy``), with ``Proxy``."""
    execution: ExecutionSpec = ExecutionSpec()
    """The pool's ``spec.execution``: each job's agent in the runner (InRunner) or in a pod of its own (JobPod)."""
    job_pod_template: Annotated[dict[str, Any] | None, Field(max_length=16)] = None
    """JobPod only: a warm job pod of the pool as the operator builds it
    (:func:`helmhive.policy.jobpods.pod.build_job_pod` with no job), which the runner makes cold
    (:func:`~helmhive.policy.jobpods.pod.build_cold_job_pod`) when no warm pod is free."""

    @property
    def job_pods(self) -> bool:
        return self.execution.mode is ExecutionMode.JOB_POD


class RunnerConfig(BaseModel):
    """Everything the runner was told, from both sources."""

    model_config = ConfigDict(frozen=True)

    env: RunnerEnvironment
    file: RunnerFileConfig

    @property
    def isolation(self) -> CredentialIsolation:
        """Where the credential is while agents run (runner.json's, else by the credential's kind)."""
        return decide_isolation(
            requested=self.file.credential_isolation,
            volume=self.env.credential_dir is not None,
            provider=self.file.provider,
            upstream=self.file.egress.upstream,
        )


def _field_path(loc: tuple[int | str, ...], *, prefix: str) -> str:
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _env_problems(error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors():
        field = str(item["loc"][0]) if item["loc"] else ""
        problems.append(f"{ENV.get(field, field)}: {item['msg']}")
    return problems


def _template_problems(template: Mapping[str, Any], namespace: str | None) -> list[str]:
    """What makes ``jobPodTemplate`` no warm job pod the runner could create in its namespace."""
    where = "runner.json.jobPodTemplate"
    problems = []
    if template.get("apiVersion") != "v1" or template.get("kind") != "Pod":
        problems.append(f"{where}: must be a v1 Pod")
    metadata = template.get("metadata")
    if not isinstance(metadata, Mapping) or not metadata.get("generateName"):
        problems.append(f"{where}.metadata.generateName: required (each job's pod gets a name of its own)")
    elif namespace is not None and metadata.get("namespace") not in (None, namespace):
        problems.append(f"{where}.metadata.namespace: must be the runner's namespace {namespace}")
    spec = template.get("spec")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        problems.append(f"{where}.spec.containers: required")
    return problems


def _execution_problems(file: RunnerFileConfig, env: RunnerEnvironment | None) -> list[str]:
    """The rules of ``execution`` across runner.json and the environment, each named by its field."""
    problems = []
    if env is not None:
        isolation = decide_isolation(
            requested=file.credential_isolation,
            volume=env.credential_dir is not None,
            provider=file.provider,
            upstream=file.egress.upstream,
        )
        # The API's messages name spec.execution.*: here the same fields are runner.json's.
        problems += [
            "runner.json." + p.removeprefix("spec.")
            for p in decide_execution_problems(execution=file.execution, isolation=isolation)
        ]
    if not file.job_pods:
        if file.job_pod_template is not None:
            problems.append("runner.json.jobPodTemplate: forbidden when execution.mode is InRunner")
        return problems
    if file.adapter.type is AdapterType.CLAUDE_CLI:
        # A job pod starts its agent once; the Claude CLI is one process per turn (and per repair turn).
        problems.append(
            "runner.json.execution.mode: JobPod needs adapter.type acp (the Claude CLI starts a process per "
            "turn, and a job pod starts one agent)"
        )
    if file.job_pod_template is None:
        problems.append("runner.json.jobPodTemplate: required when execution.mode is JobPod")
    else:
        problems += _template_problems(file.job_pod_template, env.namespace if env is not None else None)
    if env is not None and env.pod_ip is None:
        problems.append(f"{ENV['pod_ip']}: required when runner.json.execution.mode is JobPod")
    return problems


def load_config(*, environ: Mapping[str, str], read_text: Callable[[Path], str]) -> RunnerConfig:
    """Build the configuration from ``environ`` and the runner.json text ``read_text(path)`` returns.

    Raises :class:`ConfigError` with every problem found: missing or malformed variables, an
    unreadable or invalid runner.json (each error with its field path), and rules across both
    (exactly one credential source; an adapter section matching the adapter type).
    """
    problems: list[str] = []
    values = {field: environ[var] for field, var in ENV.items() if environ.get(var, "").strip()}
    env: RunnerEnvironment | None = None
    try:
        env = RunnerEnvironment.model_validate(values)
    except ValidationError as exc:
        problems.extend(_env_problems(exc))
    file: RunnerFileConfig | None = None
    path = values.get("config_path")
    if path:
        try:
            text = read_text(Path(path))
        except OSError as exc:
            problems.append(f"{ENV['config_path']}: cannot read {path}: {exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            problems.append(f"runner.json: not UTF-8 (byte {exc.start})")
        else:
            try:
                file = RunnerFileConfig.model_validate(json.loads(text))
            except json.JSONDecodeError as exc:
                problems.append(f"runner.json: not JSON: {exc.msg} (line {exc.lineno})")
            except RecursionError:
                problems.append("runner.json: nested too deeply to read")
            except ValidationError as exc:
                problems.extend(
                    f"{_field_path(tuple(i['loc']), prefix='runner.json')}: {i['msg']}" for i in exc.errors()
                )
    if env is not None and (env.credential_file is None) == (env.credential_dir is None):
        problems.append(f"{ENV['credential_file']} / {ENV['credential_dir']}: set exactly one")
    if env is not None and file is not None:
        problems.extend(
            f"runner.json.credentialIsolation: {problem}"
            for problem in decide_isolation_problems(
                provider=file.provider,
                requested=file.credential_isolation,
                volume=env.credential_dir is not None,
                upstream=file.egress.upstream,
            )
        )
    if file is not None:
        adapter = file.adapter
        if adapter.type is AdapterType.ACP and adapter.acp is None:
            problems.append("runner.json.adapter.acp: required when adapter.type is acp")
        if adapter.type is AdapterType.CLAUDE_CLI and adapter.acp is not None:
            problems.append("runner.json.adapter.acp: forbidden when adapter.type is claude-cli")
        problems.extend(_execution_problems(file, env))
    if problems or env is None or file is None:
        raise ConfigError(problems or ["configuration incomplete"])
    return RunnerConfig(env=env, file=file)

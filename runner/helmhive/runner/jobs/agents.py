"""Building adapters from the runner's configuration: the slot adapters and each job's sandboxed one.

The agent's environment is explicit (nothing is inherited from the runner): ``PATH``, ``HOME``,
``LANG``, the pool's ``adapter.acp.env``, the login directory's variable, and either (with
``credentialIsolation: Proxy``) the egress proxy's base URL and a placeholder key
(:func:`helmhive.runner.egress.proxy.build_proxy_env`), or (``InSandbox``) the credential in
``credentialEnvName`` (kept apart as a secret, redacted from every message). The probe's HOME is
``<state>/home``, which no job is granted. A job's adapter sets the job's own HOME (its session
binding's, or its own: :mod:`helmhive.runner.sandbox.workdir`), adds ``TMPDIR``, points the base URLs at
the job's own listener on the proxy, and runs the agent under the job's sandbox, with the job's
working directory as its cwd.

An ``openai`` runner with Proxy also gets Codex's configuration in the agent's home
(:mod:`helmhive.runner.egress.codex_config`: ``CODEX_HOME`` and ``openai_base_url``, since Codex reads no
base-URL variable). An ACP agent is told which variable holds the API key, so that an agent that
requires ACP ``authenticate`` gets the method naming it (:mod:`helmhive.runner.adapters.acp_auth`).

A job pod's agent (``execution.mode: JobPod``, :func:`build_pod_job_adapter`) runs under
``helmhive-jobpod attach`` instead of the sandbox (:class:`PodAgent`: the wrapper, the pod's paths):
HOME and TMPDIR are the pod's, the session's cwd is the pod's workspace while the wrapper runs in a
directory of the runner's, the base URLs name the shim's relay on the pod's loopback, the key
variable holds the job's phantom key (kept as a secret: redacted like a credential), and the ACP
``fs/*`` methods are not offered (the runner cannot serve the pod's files).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from helmhive.api.egress import CredentialIsolation
from helmhive.api.runnerpool import AdapterType
from helmhive.runner.adapters.acp import AcpAdapter, AcpAdapterConfig
from helmhive.runner.adapters.acp_process import FsAccess
from helmhive.runner.adapters.base import AgentAdapter
from helmhive.runner.adapters.claude_cli import ClaudeCliAdapter, ClaudeCliConfig
from helmhive.runner.config import RunnerConfig
from helmhive.runner.credentials import CredentialHolder
from helmhive.runner.egress.codex_config import ensure_codex_config
from helmhive.runner.egress.proxy import EgressEndpoint, build_pod_proxy_env, build_proxy_env
from helmhive.runner.sandbox.workdir import SandboxPlan, build_wrapper

__all__ = [
    "AdapterFactory",
    "JobAdapterFactory",
    "PodAdapterFactory",
    "PodAgent",
    "agent_env",
    "build_adapter",
    "build_job_adapter",
    "build_pod_job_adapter",
]


@dataclass(frozen=True, kw_only=True)
class PodAgent:
    """Where a job's agent runs in its job pod, and how the runner's adapter starts it there."""

    wrapper: tuple[str, ...]
    """``helmhive-jobpod attach ... --``: the adapter spawns it in place of the agent."""
    workspace: str
    home: str
    tmp: str
    """The pod's paths: the session's cwd, the agent's HOME and TMPDIR."""
    relay_port: int
    """The shim's egress relay on the pod's loopback: the agent's provider base URL."""
    key: SecretStr
    """The job's phantom key (:mod:`helmhive.runner.egress.pods`)."""
    local_cwd: Path
    """The wrapper's working directory on the runner (the runner's own directory of the job)."""
    local_home: Path
    """The runner's copy of the agent's HOME, put into the pod: Codex's configuration is written there."""


AdapterFactory = Callable[[RunnerConfig, CredentialHolder], AgentAdapter]
JobAdapterFactory = Callable[[SandboxPlan], AgentAdapter]
PodAdapterFactory = Callable[[PodAgent], AgentAdapter]

_FS_ACCESS: dict[str, FsAccess] = {"none": "none", "read": "read", "write": "write"}


def agent_env(config: RunnerConfig, credential: CredentialHolder) -> tuple[dict[str, str], dict[str, SecretStr]]:
    """The agent's whole environment (nothing else is inherited) and its secret part."""
    state = config.env.state_dir
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(state / "home"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    if config.file.adapter.acp is not None:
        env.update({item.name: item.value for item in config.file.adapter.acp.env})
    directory_var = config.file.credential_dir_env_name or (
        "CLAUDE_CONFIG_DIR" if config.file.adapter.type is AdapterType.CLAUDE_CLI else None
    )
    if credential.directory is not None and directory_var:
        env[directory_var] = str(credential.directory)
    if config.isolation is CredentialIsolation.PROXY:
        if credential.proxy_port is None:  # never fall back to handing the agent the key
            raise RuntimeError("credentialIsolation is Proxy but the egress proxy is not listening")
        env.update(
            build_proxy_env(
                provider=config.file.provider,
                credential_env_name=config.file.credential_env_name,
                endpoint=EgressEndpoint(port=credential.proxy_port),
            )
        )
        return env, {}
    secret = {config.file.credential_env_name: credential.value} if credential.value is not None else {}
    return env, secret


def _prepare_codex(config: RunnerConfig, env: dict[str, str]) -> None:
    """Codex's base URL in the agent's own ``CODEX_HOME`` (an ``openai`` runner with Proxy only)."""
    if config.file.provider != "openai" or config.isolation is not CredentialIsolation.PROXY:
        return
    codex_home = Path(env["HOME"]) / ".codex"
    env["CODEX_HOME"] = str(codex_home)  # the runner's choice, never the pool's: one per home
    ensure_codex_config(codex_home, env["OPENAI_BASE_URL"])


def _make_adapter(
    config: RunnerConfig,
    env: dict[str, str],
    secret_env: Any,
    *,
    cwd: str,
    cli_extra: dict[str, Any],
    acp_extra: dict[str, Any],
) -> AgentAdapter:
    """The adapter runner.json asks for; ``*_extra`` hold the per-use settings (sandbox, fs root)."""
    spec = config.file.adapter
    if spec.type is AdapterType.CLAUDE_CLI:
        cli = spec.claude_cli
        return ClaudeCliAdapter(
            ClaudeCliConfig(
                path=cli.path if cli else "claude",
                extra_args=tuple(cli.extra_args) if cli else (),
                models=tuple(cli.models) if cli else (),
                default_model=cli.default_model if cli else None,
                env=env,
                secret_env=secret_env,
                request_timeout_s=config.env.probe_timeout_seconds,
                **cli_extra,
            )
        )
    assert spec.acp is not None
    return AcpAdapter(
        AcpAdapterConfig(
            command=spec.acp.command,
            args=tuple(spec.acp.args),
            env=env,
            secret_env=secret_env,
            cwd=cwd,
            probe_cwd=cwd,
            request_timeout_s=config.env.probe_timeout_seconds,
            credential_env=config.file.credential_env_name,
            **acp_extra,
        )
    )


def build_adapter(config: RunnerConfig, credential: CredentialHolder) -> AgentAdapter:
    """The adapter runner.json asks for, with the credential in the agent's environment."""
    env, secret_env = agent_env(config, credential)
    home = Path(env["HOME"])
    home.mkdir(parents=True, exist_ok=True)
    _prepare_codex(config, env)
    return _make_adapter(config, env, secret_env, cwd=str(home), cli_extra={}, acp_extra={})


def build_job_adapter(config: RunnerConfig, credential: CredentialHolder, plan: SandboxPlan) -> AgentAdapter:
    """A fresh adapter for one job: its agent runs in the job's sandbox and ends with the job."""
    env, secret_env = agent_env(config, credential)
    env["HOME"] = str(plan.home)
    env["TMPDIR"] = str(plan.tmpdir)
    if config.isolation is CredentialIsolation.PROXY and plan.egress_port is not None:  # the job's own listener
        env.update(
            build_proxy_env(
                provider=config.file.provider,
                credential_env_name=config.file.credential_env_name,
                endpoint=EgressEndpoint(port=plan.egress_port),
            )
        )
    _prepare_codex(config, env)
    wrapper = build_wrapper(plan)
    workdir = str(plan.workdir)
    return _make_adapter(
        config,
        env,
        secret_env,
        cwd=workdir,
        cli_extra={"cwd": workdir, "wrapper": wrapper},
        acp_extra={"wrapper": wrapper, "fs_root": workdir, "fs_access": _FS_ACCESS[plan.fs_access]},
    )


def build_pod_job_adapter(config: RunnerConfig, credential: CredentialHolder, agent: PodAgent) -> AgentAdapter:
    """A fresh adapter for one job whose agent runs in its job pod (one ACP process for the job: the
    shim starts one agent per pod). Raises ValueError for the Claude CLI (a process per turn)."""
    if config.file.adapter.type is not AdapterType.ACP:
        raise ValueError("a job pod's agent is driven over ACP only (the Claude CLI starts a process per turn)")
    env, _ = agent_env(config, credential)  # Proxy (JobPod needs it): nothing secret in it
    env["HOME"], env["TMPDIR"] = agent.home, agent.tmp
    pod = build_pod_proxy_env(
        provider=config.file.provider,
        credential_env_name=config.file.credential_env_name,
        key=agent.key,
        relay_port=agent.relay_port,
    )
    secret_env = {config.file.credential_env_name: SecretStr(pod.pop(config.file.credential_env_name))}
    env.update(pod)
    if config.file.provider == "openai":  # the pod's CODEX_HOME, its file written in the HOME put into the pod
        env["CODEX_HOME"] = f"{agent.home}/.codex"
        ensure_codex_config(agent.local_home / ".codex", env["OPENAI_BASE_URL"])
    return _make_adapter(
        config,
        env,
        secret_env,
        cwd=str(agent.local_cwd),
        cli_extra={},
        acp_extra={"wrapper": agent.wrapper, "fs_root": None, "fs_access": "none"},
    )

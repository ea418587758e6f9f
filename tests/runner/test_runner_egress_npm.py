"""The real npm CLIs (Claude Code, Gemini CLI, Codex, codex-acp) in a job's sandbox, behind the egress proxy.

Each CLI gets what a ``credentialIsolation: Proxy`` runner gives an agent -- its provider's
base-URL variables pointing at the proxy and the placeholder in its key variable
(:func:`build_proxy_env`) -- and runs under the real launcher with the sandbox of a job whose
network is disabled (a network namespace of its own whose only way out is the relay to the job's
socket on the proxy; Landlock: TCP ``connect`` only to the proxy's port; seccomp: no datagram
sockets). The fake provider (its own CA) answers in the provider's API. The CLI prints the
provider's answer, the provider saw the real key on every request and never the placeholder, and
the key is in nothing the CLI printed or wrote.

What each CLI needs besides the runner's variables (found from the CLIs themselves):

- Gemini CLI 0.61.0 over ACP (``gemini --acp``, driven by the runner's ACP adapter): nothing.
  Headless (``gemini -p``): ``GOOGLE_GEMINI_BASE_URL`` alone makes it pick the auth type
  ``gateway``, which headless mode refuses ("Invalid auth method selected.", exit 41); a settings
  file choosing ``gemini-api-key`` fixes that, and ``--skip-trust`` (else exit 55: untrusted
  directory). Auto-update, usage statistics and telemetry are switched off in the same file.
- Codex 0.171.0 reads neither ``OPENAI_BASE_URL`` (it resolves ``api.openai.com`` itself, which
  fails in the sandbox: "failed to lookup address information") nor ``OPENAI_API_KEY`` (it sends
  no key). Its config key ``openai_base_url`` (here ``-c openai_base_url=...`` from the variable
  the runner set) and ``CODEX_API_KEY`` (the pool's ``credential.envName``) make it use the proxy.
  It first tries a WebSocket on ``GET /v1/responses``, then falls back to ``POST /v1/responses``.
- codex-acp 0.16.0 over ACP (driven by the runner's own job adapter): the same configuration key,
  which the runner writes into ``$CODEX_HOME/config.toml`` in the job's home, and ACP
  ``authenticate`` with the ``env_var`` method naming the pool's key variable (``codex-api-key``
  for ``CODEX_API_KEY``), which the adapter sends when ``session/new`` answers "Authentication
  required". codex-acp then stores that variable's value (the placeholder) in
  ``$CODEX_HOME/auth.json``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tomllib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pydantic import SecretStr

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.egress import provider_egress
from helmhive.api.runner import NetworkIsolation
from helmhive.api.runnerpool import AdapterType
from helmhive.runner.adapters import AdapterReport, AuthReason, AuthState, TurnOutcome, TurnRequest, TurnResult
from helmhive.runner.adapters.acp import AcpAdapter
from helmhive.runner.adapters.acp_process import AcpAdapterConfig
from helmhive.runner.config import RunnerConfig, SandboxSettings, load_config
from helmhive.runner.credentials import CredentialHolder
from helmhive.runner.egress.proxy import PLACEHOLDER, EgressEndpoint, EgressProxy, build_proxy_env
from helmhive.runner.jobs.agents import build_job_adapter
from helmhive.runner.sandbox.landlock import landlock_abi
from helmhive.runner.sandbox.workdir import (
    SandboxPlan,
    build_sandbox_plan,
    build_wrapper,
    prepare_sandbox,
    runtime_read_paths,
)

from .fake_provider import ANSWER, FakeProvider, fake_provider
from .npm_agents import CLAUDE_CODE, CODEX, CODEX_ACP, GEMINI_CLI, npm_bin, npm_root

CANARY = "sk-canary-91d04e7b3c52a8f6"

Argv = Callable[[SandboxPlan, dict[str, str]], Sequence[str]]
"""The CLI's command line, given the job's sandbox and its environment."""


@dataclass
class Job:
    """A job's sandbox behind a running proxy, and the environment a Proxy runner gives its agent."""

    upstream: FakeProvider
    plan: SandboxPlan
    env: dict[str, str]


def _started_here(pid: int) -> bool:
    """Whether ``pid`` is a process this test started: the runner serves a job's socket to the process it
    started for that job only (:mod:`helmhive.runner.egress.listeners`), and here the test is the runner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()


@asynccontextmanager
async def _job_behind_proxy(
    tmp_path: Path, *, provider: str, key_env: str, extra_env: dict[str, str], adapter: AdapterType
) -> AsyncIterator[Job]:
    with fake_provider(tmp_path / "pki", canary=CANARY) as upstream:
        upstream.release.set()
        defaults = provider_egress(provider)
        assert defaults is not None
        proxy = EgressProxy(
            upstream=upstream.url,
            credential=lambda: SecretStr(CANARY),
            ca_bundle=upstream.ca_file,
            allowed_paths=defaults.allowed_paths,  # the provider's defaults: the real CLI must fit them
        )
        await proxy.start()
        # The job's own listener: a UNIX socket its relay reaches from the agent's network namespace.
        (tmp_path / "egress").mkdir()
        job = await proxy.open_job(socket_path=tmp_path / "egress" / "job.sock")
        job.authorize(_started_here)  # the job's launcher, which stays as its relay, is this test's child
        try:
            plan = build_sandbox_plan(
                state_dir=tmp_path / "state",
                job_dir=f"team-a.{provider}.0001",
                filesystem=FilesystemAccess.READ,
                network=NetworkAccess.DISABLED,
                tools=[ToolKind.READ],
                adapter_type=adapter,
                settings=SandboxSettings(readPaths=[str(npm_root())]),
                runtime_paths=runtime_read_paths(),
                credential_dir=None,
                landlock_abi=landlock_abi(),
                egress_port=job.port,
                relay_socket=job.socket,
            )
            assert plan.landlock and plan.tcp_connect == (job.port,) and not plan.datagrams
            assert plan.network_isolation is NetworkIsolation.NAMESPACE
            prepare_sandbox(plan)
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": str(plan.home),
                "TMPDIR": str(plan.tmpdir),
                **extra_env,
                **build_proxy_env(provider=provider, credential_env_name=key_env, endpoint=EgressEndpoint(job.port)),
            }
            yield Job(upstream, plan, env)
        finally:
            await job.close()
            await proxy.close()


async def _run_behind_proxy(
    tmp_path: Path, *, provider: str, key_env: str, extra_env: dict[str, str], argv: Argv, adapter: AdapterType
) -> tuple[FakeProvider, SandboxPlan, int, bytes, bytes]:
    async with _job_behind_proxy(
        tmp_path, provider=provider, key_env=key_env, extra_env=extra_env, adapter=adapter
    ) as job:
        proc = await asyncio.create_subprocess_exec(
            *build_wrapper(job.plan),
            *argv(job.plan, job.env),
            env=job.env,
            cwd=job.plan.workdir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode is not None
    return job.upstream, job.plan, proc.returncode, out, err


def _assert_key_only_upstream(upstream: FakeProvider, plan: SandboxPlan, out: bytes, err: bytes) -> None:
    written = b"".join(p.read_bytes() for p in plan.root.rglob("*") if p.is_file())
    assert CANARY.encode() not in out + err + written


def _claude_argv(claude: Path) -> Argv:
    return lambda plan, env: (str(claude), "-p", "Say hello.", "--max-turns", "1")


_GEMINI_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
}


def _gemini_argv(gemini: Path) -> Argv:
    def argv(plan: SandboxPlan, env: dict[str, str]) -> Sequence[str]:
        (plan.home / ".gemini").mkdir(parents=True, exist_ok=True)
        (plan.home / ".gemini" / "settings.json").write_text(json.dumps(_GEMINI_SETTINGS), encoding="utf-8")
        return (str(gemini), "--skip-trust", "-m", "gemini-2.5-flash", "-p", "Say hello.")

    return argv


def _codex_argv(codex: Path) -> Argv:
    def argv(plan: SandboxPlan, env: dict[str, str]) -> Sequence[str]:
        (plan.home / ".codex").mkdir(parents=True, exist_ok=True)
        env["CODEX_HOME"] = str(plan.home / ".codex")
        return (
            str(codex),
            "exec",
            "--skip-git-repo-check",
            "-c",
            f'openai_base_url="{env["OPENAI_BASE_URL"]}"',
            "-c",
            "check_for_update_on_startup=false",
            "-c",
            "analytics.enabled=false",
            "Say hello.",
        )

    return argv


Paths = set[tuple[str, str]]


def _claude_paths(paths: Paths) -> None:
    assert paths == {("POST", "/v1/messages")}, paths


def _gemini_paths(paths: Paths) -> None:
    assert ("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent") in paths, paths
    assert all(path.startswith("/v1beta/models/") for _, path in paths), paths


def _codex_paths(paths: Paths) -> None:
    assert ("POST", "/v1/responses") in paths, paths
    assert paths <= {("POST", "/v1/responses"), ("GET", "/v1/responses")}, paths


@dataclass(frozen=True)
class HeadlessCli:
    """One npm CLI run headless in a job's sandbox behind the proxy, and what its provider must see."""

    package: tuple[str, str, str]
    argv: Callable[[Path], Argv]
    provider: str
    key_env: str
    adapter: AdapterType
    auth: dict[str, str]
    """The one key header every request reached the provider with (the proxy's, never the placeholder)."""
    check_paths: Callable[[Paths], None]
    extra_env: dict[str, str] = field(default_factory=dict)
    answer_on_last_line: bool = False
    """Codex prints its progress before the answer; the others print only the answer."""


_HEADLESS = {
    "claude": HeadlessCli(
        package=CLAUDE_CODE,
        argv=_claude_argv,
        provider="anthropic",
        key_env="ANTHROPIC_API_KEY",
        adapter=AdapterType.CLAUDE_CLI,
        auth={"x-api-key": "canary"},
        check_paths=_claude_paths,
        extra_env={"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
    ),
    "gemini": HeadlessCli(
        package=GEMINI_CLI,
        argv=_gemini_argv,
        provider="google",
        key_env="GEMINI_API_KEY",
        adapter=AdapterType.ACP,
        auth={"x-goog-api-key": "canary"},
        check_paths=_gemini_paths,
    ),
    "codex": HeadlessCli(
        package=CODEX,
        argv=_codex_argv,
        provider="openai",
        key_env="CODEX_API_KEY",  # Codex reads no OPENAI_API_KEY (see the module's docstring)
        adapter=AdapterType.ACP,
        auth={"authorization": "canary"},
        check_paths=_codex_paths,
        answer_on_last_line=True,
    ),
}


@pytest.mark.parametrize("cli", list(_HEADLESS.values()), ids=list(_HEADLESS))
async def test_a_headless_cli_answers_through_the_proxy_without_ever_holding_the_key(
    tmp_path: Path, cli: HeadlessCli
) -> None:
    upstream, plan, code, out, err = await _run_behind_proxy(
        tmp_path,
        provider=cli.provider,
        key_env=cli.key_env,
        extra_env=dict(cli.extra_env),
        argv=cli.argv(npm_bin(*cli.package)),
        adapter=cli.adapter,
    )
    assert code == 0, err.decode(errors="replace")[-2000:]
    printed = out.decode().strip()
    answer = printed.splitlines()[-1] if cli.answer_on_last_line else printed
    assert answer == ANSWER, printed[-2000:]
    assert upstream.requests, "the CLI never reached the provider"
    cli.check_paths({(r.method, r.path) for r in upstream.requests})
    assert all(r.auth == cli.auth for r in upstream.requests), [r.auth for r in upstream.requests]
    _assert_key_only_upstream(upstream, plan, out, err)


async def test_the_gemini_cli_over_acp_answers_a_turn_of_the_runners_adapter_through_the_proxy(
    tmp_path: Path,
) -> None:
    """``gemini --acp`` as a pool would run it: the runner's ACP adapter drives it in the job's sandbox
    with nothing but what the runner gives it. Unlike headless mode, ACP mode accepts the auth type
    ``gateway`` that ``GOOGLE_GEMINI_BASE_URL`` selects, and asks for no trusted folder."""
    gemini = npm_bin(*GEMINI_CLI)
    async with _job_behind_proxy(
        tmp_path, provider="google", key_env="GEMINI_API_KEY", extra_env={}, adapter=AdapterType.ACP
    ) as job:
        wrapper = build_wrapper(job.plan)
        config = AcpAdapterConfig(
            command=wrapper[0],
            args=(*wrapper[1:], str(gemini), "--acp"),
            env=job.env,
            cwd=str(job.plan.workdir),
            probe_cwd=str(job.plan.workdir),
            idle_timeout_s=60,
            request_timeout_s=60,
        )
        async with AcpAdapter(config) as adapter:
            report = await adapter.probe()
            result = await adapter.run_turn(TurnRequest(prompt="Say hello.", cwd=str(job.plan.workdir)))
    assert (report.agent_name, report.agent_version) == ("gemini-cli", GEMINI_CLI[1])
    assert "gemini-api-key" in report.auth_methods
    assert result.outcome is TurnOutcome.COMPLETED, result.message
    assert result.text == ANSWER
    paths = [r.path for r in job.upstream.requests]
    assert any(p.endswith(":streamGenerateContent") for p in paths), paths
    assert all(p.startswith("/v1beta/models/") for p in paths), paths
    assert all(r.auth == {"x-goog-api-key": "canary"} for r in job.upstream.requests), [
        r.auth for r in job.upstream.requests
    ]
    _assert_key_only_upstream(job.upstream, job.plan, result.text.encode(), result.diagnostics.encode())


def _openai_runner(tmp_path: Path, *, codex_acp: Path, key_env: str) -> tuple[RunnerConfig, CredentialHolder]:
    """What an ``openai`` pool with ``credentialIsolation: Proxy`` running codex-acp tells its runner."""
    runner_json = {
        "provider": "openai",
        "adapter": {"type": "acp", "acp": {"command": str(codex_acp)}},
        "credentialEnvName": key_env,
        "credentialIsolation": "Proxy",
    }
    environ = {
        "HELMHIVE_RUNNER_NAME": "codex-0",
        "HELMHIVE_NAMESPACE": "team-a",
        "HELMHIVE_POOL": "codex",
        "HELMHIVE_RUNNER_CONFIG": str(tmp_path / "runner.json"),
        "HELMHIVE_CREDENTIAL_FILE": str(tmp_path / "credential"),
        "HELMHIVE_STATE_DIR": str(tmp_path / "state"),
    }
    config = load_config(environ=environ, read_text=lambda path: json.dumps(runner_json))
    credential = CredentialHolder(file=tmp_path / "credential", directory=None, state_dir=tmp_path / "state")
    return config, credential


async def _codex_acp_job(
    tmp_path: Path, *, key_env: str, caplog: pytest.LogCaptureFixture
) -> tuple[Job, AdapterReport, TurnResult]:
    """One probe and one turn of codex-acp through the runner's own job adapter (:func:`build_job_adapter`)."""
    caplog.set_level(logging.DEBUG)
    codex_acp = npm_bin(*CODEX_ACP)
    async with _job_behind_proxy(
        tmp_path, provider="openai", key_env=key_env, extra_env={}, adapter=AdapterType.ACP
    ) as job:
        config, credential = _openai_runner(tmp_path, codex_acp=codex_acp, key_env=key_env)
        assert job.plan.egress_port is not None
        credential.proxy_port = job.plan.egress_port  # the runner's own listener: the job's replaces it
        async with build_job_adapter(config, credential, job.plan) as adapter:
            report = await adapter.probe()
            result = await adapter.run_turn(TurnRequest(prompt="Say hello.", cwd=str(job.plan.workdir)))
    return job, report, result


@pytest.mark.parametrize(
    ("key_env", "method"), [("CODEX_API_KEY", "codex-api-key"), ("OPENAI_API_KEY", "openai-api-key")]
)
async def test_codex_acp_answers_a_turn_of_the_runners_job_adapter_through_the_proxy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, key_env: str, method: str
) -> None:
    """``codex-acp`` as an ``openai`` Proxy pool with ``credential.envName: CODEX_API_KEY`` runs it:
    the runner writes the job's listener into ``$CODEX_HOME/config.toml`` in the job's own home,
    puts the placeholder in ``CODEX_API_KEY``, and when codex-acp answers ``session/new`` with
    "Authentication required" the adapter calls ``authenticate`` with ``codex-api-key`` (never
    ``chatgpt``; ``openai-api-key`` for ``OPENAI_API_KEY``). Codex then answers the turn through the
    proxy, which alone holds the key."""
    job, report, result = await _codex_acp_job(tmp_path, key_env=key_env, caplog=caplog)
    assert (report.agent_name, report.agent_version) == ("codex-acp", CODEX_ACP[1])
    assert (report.auth, report.auth_reason) == (AuthState.AUTHENTICATED, AuthReason.SESSION_CREATED)
    assert report.auth_method == method and method in report.auth_message
    assert f"authenticated: method={method}" in caplog.text
    assert result.outcome is TurnOutcome.COMPLETED, (result.message, result.diagnostics[-2000:])
    # codex-acp first tells the client it falls back from the WebSocket to HTTPS (the fake provider
    # answers no upgrade), then streams the provider's answer.
    assert result.text.endswith(ANSWER), result.text[-2000:]
    paths = {(r.method, r.path) for r in job.upstream.requests}
    assert ("POST", "/v1/responses") in paths, paths
    assert paths <= {("POST", "/v1/responses"), ("GET", "/v1/responses")}, paths
    assert all(r.auth == {"authorization": "canary"} for r in job.upstream.requests), [
        r.auth for r in job.upstream.requests
    ]
    # Codex's configuration and the key it stored are in the job's own home: the proxy's URL, the placeholder.
    codex_home = job.plan.home / ".codex"
    config = tomllib.loads((codex_home / "config.toml").read_text(encoding="utf-8"))
    assert config["openai_base_url"] == f"http://127.0.0.1:{job.plan.egress_port}/v1"
    assert json.loads((codex_home / "auth.json").read_text(encoding="utf-8"))["OPENAI_API_KEY"] == PLACEHOLDER
    seen = result.text + result.message + result.diagnostics + report.model_dump_json() + caplog.text
    _assert_key_only_upstream(job.upstream, job.plan, seen.encode(), b"")


async def test_codex_acp_with_its_key_in_a_variable_no_method_names_is_refused_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pool's default ``credential.envName`` (``PROVIDER_API_KEY``) is no variable codex-acp's
    ``env_var`` methods name; the adapter never falls back to ``chatgpt`` (a browser login), reports
    ``Unauthenticated``/``NoAuthMethod``, and no request reaches the provider."""
    job, report, result = await _codex_acp_job(tmp_path, key_env="PROVIDER_API_KEY", caplog=caplog)
    assert (report.auth, report.auth_reason) == (AuthState.UNAUTHENTICATED, AuthReason.NO_AUTH_METHOD)
    assert {"chatgpt", "codex-api-key", "openai-api-key"} <= set(report.auth_methods)
    assert "PROVIDER_API_KEY" in report.auth_message and report.auth_method is None
    assert result.outcome is TurnOutcome.AUTH_REQUIRED and "NoAuthMethod" in result.message
    assert job.upstream.requests == []
    _assert_key_only_upstream(job.upstream, job.plan, (report.model_dump_json() + caplog.text).encode(), b"")

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
- codex-acp 0.16.0 cannot: it waits for ACP ``authenticate``, which the runner's adapter does not
  send (its test pins that refusal).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.egress import provider_egress
from helmhive.api.runner import AdapterType, NetworkIsolation
from helmhive.runner.adapters import AuthReason, AuthState, TurnOutcome, TurnRequest
from helmhive.runner.adapters.acp import AcpAdapter
from helmhive.runner.adapters.acp_process import AcpAdapterConfig
from helmhive.runner.config import SandboxSettings
from helmhive.runner.egress import EgressEndpoint, EgressProxy, build_proxy_env
from helmhive.runner.landlock import landlock_abi
from helmhive.runner.sandbox import SandboxPlan, build_sandbox_plan, build_wrapper, prepare_sandbox, runtime_read_paths

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


async def test_the_claude_cli_answers_through_the_proxy_without_ever_holding_the_key(tmp_path: Path) -> None:
    claude = npm_bin(*CLAUDE_CODE)
    upstream, plan, code, out, err = await _run_behind_proxy(
        tmp_path,
        provider="anthropic",
        key_env="ANTHROPIC_API_KEY",
        extra_env={"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
        argv=lambda plan, env: (str(claude), "-p", "Say hello.", "--max-turns", "1"),
        adapter=AdapterType.CLAUDE_CLI,
    )
    assert code == 0, err.decode(errors="replace")[-2000:]
    assert out.decode().strip() == ANSWER
    assert upstream.requests, "the CLI never reached the provider"
    assert {(r.method, r.path) for r in upstream.requests} == {("POST", "/v1/messages")}
    assert all(r.auth == {"x-api-key": "canary"} for r in upstream.requests), [r.auth for r in upstream.requests]
    _assert_key_only_upstream(upstream, plan, out, err)


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


async def test_the_gemini_cli_answers_through_the_proxy_without_ever_holding_the_key(tmp_path: Path) -> None:
    gemini = npm_bin(*GEMINI_CLI)
    upstream, plan, code, out, err = await _run_behind_proxy(
        tmp_path,
        provider="google",
        key_env="GEMINI_API_KEY",
        extra_env={},
        argv=_gemini_argv(gemini),
        adapter=AdapterType.ACP,
    )
    assert code == 0, err.decode(errors="replace")[-2000:]
    assert out.decode().strip() == ANSWER
    assert upstream.requests, "the CLI never reached the provider"
    paths = {(r.method, r.path) for r in upstream.requests}
    assert ("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent") in paths, paths
    assert all(r.path.startswith("/v1beta/models/") for r in upstream.requests), paths
    assert all(r.auth == {"x-goog-api-key": "canary"} for r in upstream.requests), [r.auth for r in upstream.requests]
    _assert_key_only_upstream(upstream, plan, out, err)


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


async def test_codex_answers_through_the_proxy_without_ever_holding_the_key(tmp_path: Path) -> None:
    codex = npm_bin(*CODEX)
    upstream, plan, code, out, err = await _run_behind_proxy(
        tmp_path,
        provider="openai",
        key_env="CODEX_API_KEY",
        extra_env={},
        argv=_codex_argv(codex),
        adapter=AdapterType.ACP,
    )
    assert code == 0, err.decode(errors="replace")[-2000:]
    assert out.decode().strip().splitlines()[-1] == ANSWER, out.decode()[-2000:]
    paths = {(r.method, r.path) for r in upstream.requests}
    assert ("POST", "/v1/responses") in paths, paths
    assert paths <= {("POST", "/v1/responses"), ("GET", "/v1/responses")}, paths
    assert all(r.auth == {"authorization": "canary"} for r in upstream.requests), [r.auth for r in upstream.requests]
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


async def test_codex_acp_is_refused_by_the_runners_adapter_which_never_authenticates(tmp_path: Path) -> None:
    """``codex-acp`` (Codex over ACP) answers ``session/new`` with "Authentication required" until the
    client calls ACP ``authenticate`` (methods ``chatgpt``, ``codex-api-key``, ``openai-api-key``);
    the runner's ACP adapter does not yet, so it reports the runner Unauthenticated/AuthRequired and
    no request reaches the provider. When it does, this test must change."""
    codex_acp = npm_bin(*CODEX_ACP)
    async with _job_behind_proxy(
        tmp_path, provider="openai", key_env="CODEX_API_KEY", extra_env={}, adapter=AdapterType.ACP
    ) as job:
        (job.plan.home / ".codex").mkdir(parents=True, exist_ok=True)
        job.env["CODEX_HOME"] = str(job.plan.home / ".codex")
        wrapper = build_wrapper(job.plan)
        base_url = f'openai_base_url="{job.env["OPENAI_BASE_URL"]}"'
        config = AcpAdapterConfig(
            command=wrapper[0],
            args=(*wrapper[1:], str(codex_acp), "-c", base_url),
            env=job.env,
            cwd=str(job.plan.workdir),
            probe_cwd=str(job.plan.workdir),
            idle_timeout_s=60,
            request_timeout_s=60,
        )
        async with AcpAdapter(config) as adapter:
            report = await adapter.probe()
            result = await adapter.run_turn(TurnRequest(prompt="Say hello.", cwd=str(job.plan.workdir)))
    assert (report.agent_name, report.agent_version) == ("codex-acp", CODEX_ACP[1])
    assert (report.auth, report.auth_reason) == (AuthState.UNAUTHENTICATED, AuthReason.AUTH_REQUIRED)
    assert {"codex-api-key", "openai-api-key"} <= set(report.auth_methods)
    assert result.outcome is TurnOutcome.AUTH_REQUIRED, result.message
    assert job.upstream.requests == []

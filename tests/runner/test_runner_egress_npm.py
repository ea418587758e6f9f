"""The real Claude CLI (npm ``@anthropic-ai/claude-code``) in a job's sandbox, behind the egress proxy.

The CLI gets what a ``credentialIsolation: Proxy`` runner gives an agent -- ``ANTHROPIC_BASE_URL``
pointing at the proxy and the placeholder in ``ANTHROPIC_API_KEY`` -- and runs under the real
launcher with the sandbox of a job whose network is disabled (a network namespace of its own whose
only way out is the relay to the job's socket on the proxy; Landlock: TCP ``connect`` only to the
proxy's port; seccomp: no datagram sockets). The fake provider answers with the Messages API's
server-sent events. The CLI prints the provider's answer, the provider saw the real key, and the
key is in nothing the CLI printed or wrote.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import SecretStr

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.runner import AdapterType, NetworkIsolation
from helmhive.runner.config import SandboxSettings
from helmhive.runner.egress import EgressEndpoint, EgressProxy, build_proxy_env
from helmhive.runner.landlock import landlock_abi
from helmhive.runner.sandbox import build_sandbox_plan, build_wrapper, prepare_sandbox, runtime_read_paths

from .fake_provider import ANSWER, fake_provider
from .npm_agents import CLAUDE_CODE, npm_bin, npm_root

CANARY = "sk-ant-canary-91d04e7b3c52a8f6"


async def test_the_claude_cli_answers_through_the_proxy_without_ever_holding_the_key(tmp_path: Path) -> None:
    claude = npm_bin(*CLAUDE_CODE)
    with fake_provider(tmp_path / "pki", canary=CANARY) as provider:
        provider.release.set()
        proxy = EgressProxy(upstream=provider.url, credential=lambda: SecretStr(CANARY), ca_bundle=provider.ca_file)
        await proxy.start()
        # The job's own listener: a UNIX socket its relay reaches from the agent's network namespace.
        (tmp_path / "egress").mkdir()
        job = await proxy.open_job(socket_path=tmp_path / "egress" / "job.sock")
        plan = build_sandbox_plan(
            state_dir=tmp_path / "state",
            job_dir="team-a.claude.0001",
            filesystem=FilesystemAccess.READ,
            network=NetworkAccess.DISABLED,
            tools=[ToolKind.READ],
            adapter_type=AdapterType.CLAUDE_CLI,
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
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            **build_proxy_env(
                provider="anthropic", credential_env_name="ANTHROPIC_API_KEY", endpoint=EgressEndpoint(job.port)
            ),
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                *build_wrapper(plan),
                str(claude),
                "-p",
                "Say hello.",
                "--max-turns",
                "1",
                env=env,
                cwd=plan.workdir,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 240)
        finally:
            await job.close()
            await proxy.close()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    assert out.decode().strip() == ANSWER
    assert provider.requests, "the CLI never reached the provider"
    assert {(r.method, r.path) for r in provider.requests} == {("POST", "/v1/messages")}
    assert all(r.auth == {"x-api-key": "canary"} for r in provider.requests), [r.auth for r in provider.requests]
    written = b"".join(p.read_bytes() for p in plan.root.rglob("*") if p.is_file())
    assert CANARY.encode() not in out + err + written

"""Real agents from npm, with no credentials: the runner reports them honestly and keeps running.

- The Claude CLI (``@anthropic-ai/claude-code``) through the Claude CLI adapter: its version, and
  ``Unauthenticated``/``NotLoggedIn``; a real ``claude --print`` turn ends ``AuthRequired``.
- ``@zed-industries/claude-agent-acp`` through the ACP adapter: its agentInfo version and model
  catalogue; it opens sessions without a login, so the runner (holding no credential) reports
  ``Unauthenticated``/``NoCredential`` rather than the agent's optimistic ``Authenticated``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from helmhive.runner.adapters import AuthReason, AuthState, TurnOutcome, TurnRequest
from helmhive.runner.adapters.claude_cli import ClaudeCliAdapter, ClaudeCliConfig

from .npm_agents import CLAUDE_AGENT_ACP, CLAUDE_CODE, npm_bin
from .program_harness import CANARY, RunnerRig


def _env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / "cfg")}


def _runner_json(adapter: dict[str, Any]) -> dict[str, Any]:
    return {
        "provider": "anthropic",
        "adapter": adapter,
        "capabilities": ["structured-output"],
        "heartbeat": {"leaseDurationSeconds": 5, "renewIntervalSeconds": 1, "reportRefreshSeconds": 30},
    }


async def test_claude_cli_adapter_reports_not_logged_in_and_a_turn_is_refused(tmp_path: Path) -> None:
    claude = npm_bin(*CLAUDE_CODE)
    adapter = ClaudeCliAdapter(
        ClaudeCliConfig(path=str(claude), env=_env(tmp_path / "home"), idle_timeout_s=60, request_timeout_s=60)
    )
    report = await adapter.probe()
    assert report.adapter == "claude-cli"
    assert report.agent_name == "claude-code"
    assert report.agent_version == CLAUDE_CODE[1]
    assert report.auth is AuthState.UNAUTHENTICATED
    assert report.auth_reason is AuthReason.NOT_LOGGED_IN
    assert "not logged in" in report.auth_message
    assert {"opus", "sonnet"} <= set(report.models)

    work = tmp_path / "work"
    work.mkdir()
    result = await adapter.run_turn(TurnRequest(prompt="Say hello.", cwd=str(work)))
    assert result.outcome is TurnOutcome.AUTH_REQUIRED
    assert "Not logged in" in result.message
    assert result.native_session_id is not None
    session = result.native_session_id.get_secret_value()
    assert session not in result.model_dump_json() and session not in result.message
    assert result.model  # the init event named the model it would have used

    again = await adapter.probe()
    assert again.auth is AuthState.UNAUTHENTICATED
    assert again.default_model == result.model


async def test_claude_cli_adapter_hands_the_api_key_over_but_never_shows_it(tmp_path: Path) -> None:
    claude = npm_bin(*CLAUDE_CODE)
    adapter = ClaudeCliAdapter(
        ClaudeCliConfig(
            path=str(claude),
            env=_env(tmp_path / "home"),
            secret_env={"ANTHROPIC_API_KEY": SecretStr(CANARY)},
            request_timeout_s=60,
        )
    )
    report = await adapter.probe()
    # The CLI sees a login (the key), which no offline call can verify: the message says so.
    assert report.auth is AuthState.AUTHENTICATED
    assert report.auth_reason is AuthReason.LOGGED_IN
    assert "api_key" in report.auth_message and "not verified" in report.auth_message
    assert CANARY not in report.model_dump_json()


def test_runner_program_with_the_claude_cli_and_no_login(rig: RunnerRig) -> None:
    claude = npm_bin(*CLAUDE_CODE)
    login = rig.root / "login"
    login.mkdir(parents=True)
    proc = rig.start(_runner_json({"type": "claude-cli", "claudeCli": {"path": str(claude)}}), credential_dir=login)
    report = rig.wait_registered(proc, timeout=90)
    assert report["adapter"] == {"type": "claude-cli", "name": "claude-code", "version": CLAUDE_CODE[1]}
    assert report["authentication"]["state"] == "Unauthenticated"
    assert report["authentication"]["reason"] == "NotLoggedIn"
    assert "not logged in" in report["authentication"]["message"]
    assert {"opus", "sonnet"} <= {m["id"] for m in report["catalogue"]["models"]}
    assert proc.popen.poll() is None, "the runner keeps running (NeedsAttention), it does not crash"
    assert rig.lease_exists()


def test_runner_program_with_claude_agent_acp_and_no_login(rig: RunnerRig) -> None:
    agent = npm_bin(*CLAUDE_AGENT_ACP)
    login = rig.root / "login"
    login.mkdir(parents=True)
    proc = rig.start(_runner_json({"type": "acp", "acp": {"command": str(agent)}}), credential_dir=login)
    report = rig.wait_registered(proc, timeout=90)
    assert report["adapter"] == {"type": "acp", "name": CLAUDE_AGENT_ACP[0], "version": CLAUDE_AGENT_ACP[1]}
    auth = report["authentication"]
    assert auth["state"] == "Unauthenticated"
    assert auth["reason"] == "NoCredential"
    assert "Authenticated/SessionCreated" in auth["message"], "the agent's own optimistic answer is kept for humans"
    catalogue = report["catalogue"]
    assert catalogue["default"] in {m["id"] for m in catalogue["models"]}
    assert len(catalogue["models"]) >= 2
    assert proc.popen.poll() is None

"""Real agents from npm, with no credentials: the runner reports them honestly and keeps running.

- The Claude CLI (``@anthropic-ai/claude-code``) through the Claude CLI adapter: its version,
  ``Unauthenticated``/``NotLoggedIn``, and a routable catalogue -- the aliases ``--help`` quotes
  and the full ids the CLI itself resolves them to, with a full-id default (from its settings
  file or ``ANTHROPIC_MODEL`` when set), or exactly the pool's pinned models; a real
  ``claude --print`` turn ends ``AuthRequired`` and ran the advertised default.
- ``@zed-industries/claude-agent-acp`` through the ACP adapter: its agentInfo version and model
  catalogue; it opens sessions without a login, so the runner (holding no credential) reports
  ``Unauthenticated``/``NoCredential`` rather than the agent's optimistic ``Authenticated``.
- Both runners, as the operator derives them from their Runner and Lease: NeedsAttention with
  the reason, never Schedulable; the Lease carries the report's digest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from harness import wait_for
from helmhive.api.reasons import Reason
from helmhive.api.runner import REPORT_DIGEST_ANNOTATION, ReportedStatus, RunnerReport, build_report_digest
from helmhive.runner.adapters import AuthReason, AuthState, TurnOutcome, TurnRequest
from helmhive.runner.adapters.claude_cli import ClaudeCliAdapter, ClaudeCliConfig

from .npm_agents import CLAUDE_AGENT_ACP, CLAUDE_CODE, npm_bin
from .program_harness import CANARY, RunnerRig


def _env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / "cfg")}


def _write_settings(config_dir: Path, settings: dict[str, Any]) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "settings.json").write_text(json.dumps(settings), encoding="utf-8")


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
    # Each alias comes with the full id the CLI resolved it to; the default is one of those ids.
    full = [m for m in report.models if m.startswith("claude-")]
    assert len(full) >= 2 and any("sonnet" in m for m in full) and any("opus" in m for m in full)
    assert report.default_model in full

    work = tmp_path / "work"
    work.mkdir()
    result = await adapter.run_turn(TurnRequest(prompt="Say hello.", cwd=str(work)))
    assert result.outcome is TurnOutcome.AUTH_REQUIRED
    assert "Not logged in" in result.message
    assert result.native_session_id is not None
    session = result.native_session_id.get_secret_value()
    assert session not in result.model_dump_json() and session not in result.message
    assert result.model  # the init event named the model it would have used

    assert result.model == report.default_model, "a turn without a model runs the advertised default"

    again = await adapter.probe()
    assert again.auth is AuthState.UNAUTHENTICATED
    assert again.default_model == result.model


async def test_claude_cli_default_follows_its_settings_and_environment_and_a_pin_is_exact(tmp_path: Path) -> None:
    claude = npm_bin(*CLAUDE_CODE)
    env = _env(tmp_path / "home")
    _write_settings(Path(env["CLAUDE_CONFIG_DIR"]), {"model": "sonnet"})
    plain = await ClaudeCliAdapter(ClaudeCliConfig(path=str(claude), env=_env(tmp_path / "other"))).probe()
    from_settings = await ClaudeCliAdapter(ClaudeCliConfig(path=str(claude), env=env)).probe()
    sonnet = from_settings.default_model
    assert sonnet is not None and sonnet.startswith("claude-") and "sonnet" in sonnet, from_settings.models
    assert sonnet in plain.models, "the same alias resolves to the same id whatever picks it"
    opus = next(m for m in plain.models if m.startswith("claude-") and "opus" in m)
    from_env = await ClaudeCliAdapter(ClaudeCliConfig(path=str(claude), env=env | {"ANTHROPIC_MODEL": "opus"})).probe()
    assert from_env.default_model == opus, "ANTHROPIC_MODEL wins over the settings file, as the CLI documents"

    pinned = await ClaudeCliAdapter(
        ClaudeCliConfig(path=str(claude), env=env, models=("sonnet", sonnet), default_model=sonnet)
    ).probe()
    assert pinned.models == ["sonnet", sonnet] and pinned.default_model == sonnet


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
    assert report["authentication"]["verifiedAt"]
    ids = {m["id"] for m in report["catalogue"]["models"]}
    assert {"opus", "sonnet"} <= ids
    default = report["catalogue"]["default"]
    assert default in ids and default.startswith("claude-"), report["catalogue"]
    assert proc.popen.poll() is None, "the runner keeps running (NeedsAttention), it does not crash"
    _assert_needs_attention(rig, report, Reason.UNAUTHENTICATED, "NotLoggedIn")


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
    _assert_needs_attention(rig, report, Reason.UNAUTHENTICATED, "NoCredential")


def _assert_needs_attention(rig: RunnerRig, report: dict[str, Any], reason: str, detail: str) -> None:
    """The operator's derivation from the stored Runner and Lease: NeedsAttention, not Schedulable."""
    digest = build_report_digest(RunnerReport.model_validate(report))

    def lease_carries_it() -> bool:
        # The runner renews its Lease with a new digest right after the report that carries it.
        return (rig.lease().metadata.annotations or {}).get(REPORT_DIGEST_ANNOTATION) == digest

    wait_for(lease_carries_it, timeout=30, describe="the Lease to carry the report's digest")
    derived = rig.derived()
    assert derived.reported_status is ReportedStatus.NEEDS_ATTENTION
    assert derived.schedulable.status is False
    assert derived.schedulable.reason == reason and detail in derived.schedulable.message


async def test_claude_cli_reports_what_its_help_lists_as_capabilities_and_efforts(tmp_path: Path) -> None:
    """The real CLI's ``--help``: session load, fork and MCP advertised; --effort's levels for every model."""
    claude = npm_bin(*CLAUDE_CODE)
    report = await ClaudeCliAdapter(ClaudeCliConfig(path=str(claude), env=_env(tmp_path / "home"))).probe()
    assert report.capabilities_known
    assert {"session-load", "session-fork", "mcp-http", "mcp-sse"} <= set(report.capabilities.names())
    assert {"low", "medium", "high"} <= set(report.effort_levels)
    assert report.models and set(report.model_efforts) == set(report.models)
    assert all(levels == report.effort_levels for levels in report.model_efforts.values())

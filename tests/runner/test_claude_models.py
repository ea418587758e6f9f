"""The Claude CLI's catalogue rules, pure: precedence of the default, the resolution run's environment,
what is read from the settings file, and what is advertised. (The real CLI: test_runner_npm_agents.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helmhive.runner.adapters.claude_models import (
    NO_NETWORK_BASE_URL,
    ClaudeSettings,
    ModelTable,
    build_resolution_env,
    decide_catalogue,
    decide_default_request,
    parse_help_features,
    parse_init_model,
    read_settings,
)

SETTINGS = ClaudeSettings(model="fable", env={"ANTHROPIC_MODEL": "sonnet"})


@pytest.mark.parametrize(
    ("pinned", "extra_args", "env", "settings", "wanted"),
    [
        ("claude-x-1", ["--model", "opus"], {"ANTHROPIC_MODEL": "haiku"}, SETTINGS, "claude-x-1"),
        (None, ["--model", "opus"], {"ANTHROPIC_MODEL": "haiku"}, SETTINGS, "opus"),
        (None, ["--model=opus"], {}, SETTINGS, "opus"),
        (None, [], {"ANTHROPIC_MODEL": "haiku"}, SETTINGS, "haiku"),
        (None, [], {}, SETTINGS, "sonnet"),
        (None, [], {}, ClaudeSettings(model="fable"), "fable"),
        (None, ["--verbose"], {}, ClaudeSettings(), None),
    ],
)
def test_the_default_follows_the_clis_documented_precedence(
    pinned: str | None, extra_args: list[str], env: dict[str, str], settings: ClaudeSettings, wanted: str | None
) -> None:
    assert decide_default_request(pinned_default=pinned, extra_args=extra_args, env=env, settings=settings) == wanted


def test_a_resolution_run_has_no_credential_no_network_and_only_the_model_variables(tmp_path: Path) -> None:
    env = {
        "PATH": "/bin",
        "HOME": "/home/runner",
        "CLAUDE_CONFIG_DIR": "/login",
        "ANTHROPIC_API_KEY": "sk-canary",
        "CLAUDE_CODE_OAUTH_TOKEN": "oauth-canary",
        "ANTHROPIC_BASE_URL": "https://proxy.example",
        "ANTHROPIC_DEFAULT_SONNET_MODEL": "claude-sonnet-4-6",
    }
    settings = ClaudeSettings(env={"ANTHROPIC_DEFAULT_OPUS_MODEL": "claude-opus-4-7"})
    resolved = build_resolution_env(env=env, settings=settings, scratch=tmp_path)
    assert resolved == {
        "PATH": "/bin",
        "LANG": "C.UTF-8",
        "HOME": str(tmp_path),
        "CLAUDE_CONFIG_DIR": str(tmp_path / "config"),
        "ANTHROPIC_BASE_URL": NO_NETWORK_BASE_URL,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": "claude-opus-4-7",
        "ANTHROPIC_DEFAULT_SONNET_MODEL": "claude-sonnet-4-6",
    }


def test_only_model_settings_are_read_from_the_settings_file(tmp_path: Path) -> None:
    (tmp_path / "settings.json").write_text(
        json.dumps(
            {
                "model": "sonnet",
                "apiKeyHelper": "/bin/print-key",
                "env": {"ANTHROPIC_DEFAULT_HAIKU_MODEL": "claude-haiku-5-5", "ANTHROPIC_AUTH_TOKEN": "canary"},
            }
        ),
        encoding="utf-8",
    )
    assert read_settings(tmp_path) == ClaudeSettings(
        model="sonnet", env={"ANTHROPIC_DEFAULT_HAIKU_MODEL": "claude-haiku-5-5"}
    )
    (tmp_path / "settings.json").write_text("{not json", encoding="utf-8")
    assert read_settings(tmp_path) == ClaudeSettings()
    assert read_settings(tmp_path / "missing") == ClaudeSettings()
    assert read_settings(None) == ClaudeSettings()


def test_the_init_event_names_the_model() -> None:
    out = "\n".join(
        [
            "not json",
            json.dumps({"type": "system", "subtype": "hook", "model": "x"}),
            json.dumps({"type": "system", "subtype": "init", "model": "claude-opus-5-5", "session_id": "s"}),
            json.dumps({"type": "assistant", "message": {"model": "<synthetic>"}}),
        ]
    )
    assert parse_init_model(out) == "claude-opus-5-5"
    assert parse_init_model(json.dumps({"type": "system", "subtype": "init", "model": "bad id!"})) is None
    assert parse_init_model("") is None


def test_the_catalogue_is_aliases_and_their_ids_or_exactly_the_pin() -> None:
    table = ModelTable(
        aliases={"fable": "claude-fable-5-2", "opus": "claude-opus-5-5", "sonnet": None},
        default="claude-opus-5-5",
    )
    models, default = decide_catalogue(pinned=(), pinned_default=None, table=table, seen=["claude-x-9"])
    assert models == ["fable", "opus", "sonnet", "claude-fable-5-2", "claude-opus-5-5", "claude-x-9"]
    assert default == "claude-opus-5-5"
    assert decide_catalogue(pinned=(), pinned_default=None, table=ModelTable()) == ([], None)
    pinned = decide_catalogue(pinned=("sonnet", "claude-sonnet-5-5"), pinned_default=None, table=table)
    assert pinned == (["sonnet", "claude-sonnet-5-5"], "sonnet")
    chosen = decide_catalogue(pinned=("sonnet", "opus"), pinned_default="opus", table=table)
    assert chosen == (["sonnet", "opus"], "opus")


HELP = """Usage: claude [options] [command] [prompt]

Options:
  --bg, --background                    Start the session in the background and
                                        print its id; later, claude
                                        --resume <session-id>, continues that
  --effort <level>                      Effort level for the current session
                                        (low, medium, high)
  --mcp-config <configs...>             Load MCP servers from JSON files or
  -r, --resume [value]                  Resume a conversation by session ID
"""


def test_help_features_read_the_option_column_only() -> None:
    """An option named only inside another option's description (``--resume`` under ``--bg``) is not an option."""
    features = parse_help_features(HELP)
    assert (features.resume, features.fork, features.mcp) == (True, False, True)
    assert features.efforts == ("low", "medium", "high")
    without = "\n".join(line for line in HELP.splitlines() if not line.startswith("  -r, --resume"))
    assert parse_help_features(without).resume is False  # the description's mention does not count
    assert parse_help_features("").efforts == ()

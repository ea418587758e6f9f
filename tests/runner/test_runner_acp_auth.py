"""ACP ``authenticate``: which method the runner picks (pure), and the adapter calling it on a real agent.

The success path with a real agent that requires ``authenticate`` (codex-acp) is in
``test_runner_egress_npm.py``; here the reference agent in mode ``unauthenticated`` refuses every
``authenticate``, which proves the adapter calls it once, with the chosen method, and fails closed.
"""

from __future__ import annotations

import json
import logging
import tomllib
from pathlib import Path

import pytest
from acp import schema

from helmhive.reference_agent.session import AUTH_METHOD_ID, ENV_TOKEN
from helmhive.runner.adapters import AcpAdapter, AuthReason, AuthState, TurnOutcome, TurnRequest
from helmhive.runner.adapters.acp_auth import decide_auth_method
from helmhive.runner.config import RunnerConfig, load_config
from helmhive.runner.credentials import CredentialHolder
from helmhive.runner.egress.codex_config import build_codex_config, ensure_codex_config
from helmhive.runner.egress.proxy import PLACEHOLDER
from helmhive.runner.jobs.agents import build_adapter

from .agent_harness import AdapterFactory, MethodLog

CANARY = "sk-canary-auth-5e0c2d8a71"


def _env_var(method_id: str, *names: str, optional: tuple[str, ...] = ()) -> schema.EnvVarAuthMethod:
    variables = [schema.AuthEnvVar(name=n) for n in names] + [
        schema.AuthEnvVar(name=n, optional=True) for n in optional
    ]
    return schema.EnvVarAuthMethod(type="env_var", id=method_id, name=method_id, vars=variables)


# codex-acp 0.16.0's initialize answer, as the real agent sends it.
CODEX_ACP_METHODS = [
    schema.AuthMethodAgent(id="chatgpt", name="Login with ChatGPT"),
    _env_var("codex-api-key", "CODEX_API_KEY"),
    _env_var("openai-api-key", "OPENAI_API_KEY"),
]


@pytest.mark.parametrize(
    ("credential_env", "expected"),
    [("CODEX_API_KEY", "codex-api-key"), ("OPENAI_API_KEY", "openai-api-key")],
)
def test_the_method_naming_the_credentials_variable_is_chosen(credential_env: str, expected: str) -> None:
    choice = decide_auth_method(CODEX_ACP_METHODS, credential_env=credential_env, env_names={credential_env, "HOME"})
    assert choice.method_id == expected


def test_an_interactive_login_is_never_chosen() -> None:
    # The runner's key is in a variable no env_var method names: chatgpt (a browser login) is not a fallback.
    choice = decide_auth_method(CODEX_ACP_METHODS, credential_env="PROVIDER_API_KEY", env_names={"PROVIDER_API_KEY"})
    assert choice.method_id is None
    assert "PROVIDER_API_KEY" in choice.message and "chatgpt (agent)" in choice.message
    terminal = schema.TerminalAuthMethod(type="terminal", id="login", name="login", env={"CODEX_API_KEY": "x"})
    assert decide_auth_method([terminal], credential_env="CODEX_API_KEY", env_names={"CODEX_API_KEY"}).method_id is None


def test_no_credential_no_methods_or_a_missing_required_variable_choose_nothing() -> None:
    assert decide_auth_method(CODEX_ACP_METHODS, credential_env=None, env_names=set()).method_id is None
    assert decide_auth_method([], credential_env="CODEX_API_KEY", env_names={"CODEX_API_KEY"}).method_id is None
    # The key's variable is unset in the agent's environment (a login-directory credential): no method.
    assert decide_auth_method(CODEX_ACP_METHODS, credential_env="CODEX_API_KEY", env_names={"HOME"}).method_id is None
    both = [_env_var("azure", "AZURE_KEY", "AZURE_ENDPOINT"), _env_var("plain", "AZURE_KEY", optional=("ORG",))]
    # A method that needs a second variable the agent lacks is skipped; an optional one is not needed.
    assert decide_auth_method(both, credential_env="AZURE_KEY", env_names={"AZURE_KEY"}).method_id == "plain"


def test_codex_config_sets_the_base_url_and_keeps_the_rest() -> None:
    existing = (
        'openai_base_url = "http://127.0.0.1:1111/v1"\nmodel = "gpt-5"\n\n'
        '[projects."/work"]\ntrust_level = "trusted"\nopenai_base_url = "kept: not top level"\n'
    )
    text = build_codex_config(existing, "http://127.0.0.1:2222/v1")
    parsed = tomllib.loads(text)
    assert parsed["openai_base_url"] == "http://127.0.0.1:2222/v1"
    assert parsed["model"] == "gpt-5"
    assert parsed["projects"]["/work"] == {"trust_level": "trusted", "openai_base_url": "kept: not top level"}
    assert tomllib.loads(build_codex_config("", 'http://h/"q"\\'))["openai_base_url"] == 'http://h/"q"\\'


def test_codex_config_is_written_private_and_rewritten_for_the_next_listener(tmp_path: Path) -> None:
    home = tmp_path / "home" / ".codex"
    path = ensure_codex_config(home, "http://127.0.0.1:1111/v1")
    assert (path.stat().st_mode & 0o777, home.stat().st_mode & 0o777) == (0o600, 0o700)
    path.write_text(path.read_text(encoding="utf-8") + '[tui]\ntheme = "dark"\n', encoding="utf-8")
    ensure_codex_config(home, "http://127.0.0.1:2222/v1")
    parsed = tomllib.loads(path.read_text(encoding="utf-8"))
    assert parsed == {"openai_base_url": "http://127.0.0.1:2222/v1", "tui": {"theme": "dark"}}
    assert [p.name for p in home.iterdir()] == ["config.toml"]


async def test_the_adapter_authenticates_with_the_method_naming_its_key_and_fails_closed_when_refused(
    make_adapter: AdapterFactory, method_log: MethodLog, workdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    adapter = make_adapter("unauthenticated", secret_env={ENV_TOKEN: CANARY}, credential_env=ENV_TOKEN)
    report = await adapter.probe()
    assert (report.auth, report.auth_reason) == (AuthState.UNAUTHENTICATED, AuthReason.AUTHENTICATE_FAILED)
    assert AUTH_METHOD_ID in report.auth_message and report.auth_method is None
    result = await adapter.run_turn(TurnRequest(prompt="hi", cwd=workdir))
    assert result.outcome is TurnOutcome.AUTH_REQUIRED
    # One authenticate per agent process, with the method naming the key's variable; no prompt ever.
    calls = [e for e in method_log.entries() if e["method"] == "authenticate"]
    assert [c["methodId"] for c in calls] == [AUTH_METHOD_ID]
    assert "session/prompt" not in method_log.methods()
    assert CANARY not in report.model_dump_json() + result.model_dump_json() + caplog.text


async def test_an_agent_requiring_auth_without_a_fitting_method_is_refused_by_name(
    make_adapter: AdapterFactory, method_log: MethodLog, workdir: str
) -> None:
    adapter = make_adapter(
        "unauthenticated", secret_env={"PROVIDER_API_KEY": CANARY}, credential_env="PROVIDER_API_KEY"
    )
    report = await adapter.probe()
    assert (report.auth, report.auth_reason) == (AuthState.UNAUTHENTICATED, AuthReason.NO_AUTH_METHOD)
    assert "PROVIDER_API_KEY" in report.auth_message
    result = await adapter.run_turn(TurnRequest(prompt="hi", cwd=workdir))
    assert result.outcome is TurnOutcome.AUTH_REQUIRED and "NoAuthMethod" in result.message
    assert "authenticate" not in method_log.methods()


def _runner(tmp_path: Path, provider: str, isolation: str) -> tuple[RunnerConfig, CredentialHolder]:
    runner_json = {
        "provider": provider,
        "adapter": {"type": "acp", "acp": {"command": "codex-acp", "env": [{"name": "CODEX_HOME", "value": "/x"}]}},
        "credentialEnvName": "CODEX_API_KEY",
        "credentialIsolation": isolation,
    }
    environ = {
        "HELMHIVE_RUNNER_NAME": "r-0",
        "HELMHIVE_NAMESPACE": "team-a",
        "HELMHIVE_POOL": "r",
        "HELMHIVE_RUNNER_CONFIG": str(tmp_path / "runner.json"),
        "HELMHIVE_CREDENTIAL_FILE": str(tmp_path / "credential"),
        "HELMHIVE_STATE_DIR": str(tmp_path / "state"),
    }
    config = load_config(environ=environ, read_text=lambda path: json.dumps(runner_json))
    credential = CredentialHolder(file=tmp_path / "credential", directory=None, state_dir=tmp_path / "state")
    credential.proxy_port = 4321
    return config, credential


@pytest.mark.parametrize(("provider", "isolation"), [("openai", "Proxy"), ("google", "Proxy"), ("openai", "InSandbox")])
async def test_only_an_openai_proxy_runner_writes_codex_config_into_the_agents_home(
    tmp_path: Path, provider: str, isolation: str
) -> None:
    (tmp_path / "credential").write_text(CANARY, encoding="utf-8")
    config, credential = _runner(tmp_path, provider, isolation)
    credential.prepare()
    adapter = build_adapter(config, credential)
    assert isinstance(adapter, AcpAdapter)
    settings = adapter._config  # what the agent will be spawned with
    assert settings.credential_env == "CODEX_API_KEY"
    codex_home = tmp_path / "state" / "home" / ".codex"
    if (provider, isolation) == ("openai", "Proxy"):
        # The runner's CODEX_HOME replaces the pool's: one per agent home, never shared between jobs.
        assert settings.env["CODEX_HOME"] == str(codex_home)
        parsed = tomllib.loads((codex_home / "config.toml").read_text(encoding="utf-8"))
        assert parsed == {"openai_base_url": "http://127.0.0.1:4321/v1"}
        assert settings.env["CODEX_API_KEY"] == PLACEHOLDER
    else:
        assert settings.env["CODEX_HOME"] == "/x" and not codex_home.exists()
    written = b"".join(p.read_bytes() for p in (tmp_path / "state" / "home").rglob("*") if p.is_file())
    assert CANARY.encode() not in written

"""Pure decisions and small mechanics of the runner program: no API server, no clock, no agent."""

from __future__ import annotations

import ast
import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from helmhive.api.common import ControlState
from helmhive.api.runner import AuthState
from helmhive.api.runnerpool import AdapterType
from helmhive.runner.adapters.base import AdapterReport, AuthReason
from helmhive.runner.adapters.base import AuthState as AdapterAuth
from helmhive.runner.adapters.claude_cli import decide_auth_status, parse_model_aliases, parse_version
from helmhive.runner.config import ConfigError, RunnerFileConfig, load_config
from helmhive.runner.credentials import CredentialHolder, read_revoked_generation, write_revoked_generation
from helmhive.runner.logs import JsonFormatter
from helmhive.runner.program.control import (
    ControlAction,
    ControlFields,
    accepts_jobs,
    decide_control_action,
    decide_control_state,
    decide_startup,
    read_control_fields,
)
from helmhive.runner.program.heartbeat import build_lease, micro_time
from helmhive.runner.program.report import (
    WriteReason,
    build_catalogue,
    build_fingerprint,
    build_report,
    decide_auth_report,
    decide_report_write,
)

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
REFRESH = dt.timedelta(seconds=300)
FILE = RunnerFileConfig.model_validate(
    {"provider": "reference", "adapter": {"type": "acp", "acp": {"command": "agent"}}, "concurrency": 2}
)
ADAPTER = AdapterReport(
    adapter="acp",
    adapter_version="0.1.0",
    agent_name="agent",
    agent_version="1.2.3",
    auth=AdapterAuth.AUTHENTICATED,
    auth_reason=AuthReason.SESSION_CREATED,
    models=["m-small", "m-large"],
    default_model="m-small",
    effort_levels=["low", "high"],
)


def _report(*, now: dt.datetime = T0, active_jobs: int = 0, adapter: AdapterReport = ADAPTER) -> Any:
    return build_report(
        file=FILE,
        runner_name="pool-a-0",
        adapter=adapter,
        authentication=decide_auth_report(adapter=adapter, credential_present=True),
        active_jobs=active_jobs,
        fingerprint="sha256:" + "0" * 64,
        credential_generation=1,
        registered_at=T0,
        now=now,
    )


# -- report --------------------------------------------------------------------------------
def test_the_first_report_is_a_registration() -> None:
    decision = decide_report_write(previous=None, current=_report(), last_written_at=None, now=T0, refresh=REFRESH)
    assert (decision.write, decision.reason) == (True, WriteReason.REGISTRATION)


@pytest.mark.parametrize("seconds", [1, 5, 60, 299], ids=lambda s: f"{s}s-later")
def test_an_unchanged_report_is_not_written_before_the_refresh(seconds: int) -> None:
    now = T0 + dt.timedelta(seconds=seconds)
    decision = decide_report_write(
        previous=_report(), current=_report(now=now), last_written_at=T0, now=now, refresh=REFRESH
    )
    assert decision.write is False
    assert decision.next_refresh_at == T0 + REFRESH


def test_an_unchanged_report_is_refreshed_once_the_interval_passed() -> None:
    now = T0 + REFRESH
    decision = decide_report_write(
        previous=_report(), current=_report(now=now), last_written_at=T0, now=now, refresh=REFRESH
    )
    assert (decision.write, decision.reason, decision.next_refresh_at) == (True, WriteReason.REFRESH, now + REFRESH)


@pytest.mark.parametrize(
    "change",
    [
        {"active_jobs": 1},
        {"adapter": ADAPTER.model_copy(update={"auth": AdapterAuth.UNAUTHENTICATED})},
        {"adapter": ADAPTER.model_copy(update={"models": ["m-small"]})},
        {"adapter": ADAPTER.model_copy(update={"default_model": "m-large"})},
        {"adapter": ADAPTER.model_copy(update={"agent_version": "1.2.4"})},
    ],
    ids=["active-jobs", "auth", "catalogue", "default-model", "agent-version"],
)
def test_a_content_change_is_written_at_once(change: dict[str, Any]) -> None:
    now = T0 + dt.timedelta(seconds=2)
    decision = decide_report_write(
        previous=_report(), current=_report(now=now, **change), last_written_at=T0, now=now, refresh=REFRESH
    )
    assert (decision.write, decision.reason) == (True, WriteReason.CHANGED)


def test_the_report_is_bounded_and_camel_cased() -> None:
    wire = _report(active_jobs=500).to_wire()
    assert wire["activeJobs"] == 64
    assert wire["adapter"] == {"type": "acp", "name": "agent", "version": "1.2.3"}
    assert wire["catalogue"]["default"] == "m-small"
    assert wire["registeredAt"] and wire["reportedAt"] and wire["podName"] == "pool-a-0"


def test_catalogue_drops_ids_the_api_would_refuse_and_an_unoffered_default() -> None:
    adapter = ADAPTER.model_copy(
        update={"models": ["ok-1", "bad id", "", "ok-1", "x" * 200, "sonnet[1m]"], "default_model": "bad id"}
    )
    catalogue = build_catalogue(adapter=adapter)
    assert [m.id for m in catalogue.models] == ["ok-1", "sonnet[1m]"]
    assert catalogue.default is None


@pytest.mark.parametrize(
    ("agent", "present", "state", "reason"),
    [
        (AdapterAuth.AUTHENTICATED, True, AuthState.AUTHENTICATED, "SessionCreated"),
        (AdapterAuth.AUTHENTICATED, False, AuthState.UNAUTHENTICATED, "NoCredential"),
        (AdapterAuth.UNKNOWN, False, AuthState.UNAUTHENTICATED, "NoCredential"),
        (AdapterAuth.UNAUTHENTICATED, False, AuthState.UNAUTHENTICATED, "SessionCreated"),
        (AdapterAuth.FAILING, False, AuthState.FAILING, "SessionCreated"),
        (AdapterAuth.UNAUTHENTICATED, True, AuthState.UNAUTHENTICATED, "SessionCreated"),
    ],
)
def test_authentication_never_claims_more_than_the_credential_allows(
    agent: AdapterAuth, present: bool, state: AuthState, reason: str
) -> None:
    auth = decide_auth_report(adapter=ADAPTER.model_copy(update={"auth": agent}), credential_present=present)
    assert (auth.state, auth.reason) == (state, reason)


def test_fingerprint_is_stable_and_moves_with_the_environment() -> None:
    base: dict[str, Any] = {
        "image": "img:1",
        "helmhive_version": "0.1.0",
        "adapter_type": AdapterType.ACP,
        "agent_name": "agent",
        "agent_version": "1.0",
        "provider": "reference",
        "command": "agent",
        "args": ["--x"],
        "env_names": ["B", "A"],
        "credential_kind": "file",
    }
    first = build_fingerprint(**base)
    assert first == build_fingerprint(**{**base, "env_names": ["A", "B", "A"]})
    assert len(first) <= 80 and first.startswith("sha256:")
    for key, value in {"image": "img:2", "agent_version": "1.1", "args": [], "credential_kind": "directory"}.items():
        assert build_fingerprint(**{**base, key: value}) != first, key


# -- control -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "effective", "expected"),
    [
        (None, None, ControlState.ACTIVE),
        ("Draining", None, ControlState.DRAINING),
        ("Active", "Disabled", ControlState.DISABLED),
        ("Revoked", "Draining", ControlState.REVOKED),
        (None, "Draining", ControlState.DRAINING),
        ("Paused", None, ControlState.DISABLED),
    ],
    ids=["nothing", "spec-fallback", "operator-stricter", "spec-stricter", "operator-only", "unknown-fails-closed"],
)
def test_control_state(spec: str | None, effective: str | None, expected: ControlState) -> None:
    assert decide_control_state(view=ControlFields(spec_state=spec, effective_state=effective)) is expected


def test_control_actions() -> None:
    actions = {state: decide_control_action(state=state) for state in ControlState}
    assert actions == {
        ControlState.ACTIVE: ControlAction.RUN,
        ControlState.DRAINING: ControlAction.DRAIN,
        ControlState.DISABLED: ControlAction.HOLD,
        ControlState.REVOKED: ControlAction.REVOKE,
    }
    assert [s for s in ControlState if accepts_jobs(state=s)] == [ControlState.ACTIVE]


@pytest.mark.parametrize(
    ("state", "reported", "marker", "start"),
    [
        (ControlState.ACTIVE, 3, 3, True),
        (ControlState.DISABLED, 3, None, True),
        (ControlState.REVOKED, 3, None, False),
        (ControlState.REVOKED, None, None, False),
        (ControlState.REVOKED, 2, 3, False),
        (ControlState.REVOKED, 2, None, True),
    ],
    ids=["active", "disabled", "revoked-same", "revoked-unreported", "revoked-marker", "revoked-new-generation"],
)
def test_startup_refuses_a_revoked_generation(
    state: ControlState, reported: int | None, marker: int | None, start: bool
) -> None:
    decision = decide_startup(state=state, reported_generation=reported, generation=3, revoked_generation=marker)
    assert decision.start is start
    assert (decision.reason == "RevokedCredentialGeneration") is (not start)


def test_runner_view_reads_spec_status_and_report() -> None:
    obj = {
        "spec": {"controlState": "Draining"},
        "status": {"effectiveControlState": "Disabled", "report": {"credentialGeneration": 4, "registeredAt": "t"}},
    }
    assert read_control_fields(obj) == ControlFields("Draining", "Disabled", 4, "t")
    assert read_control_fields(None) == ControlFields()


# -- config --------------------------------------------------------------------------------
ENV = {
    "HELMHIVE_RUNNER_NAME": "pool-a-0",
    "HELMHIVE_NAMESPACE": "team",
    "HELMHIVE_POOL": "pool-a",
    "HELMHIVE_RUNNER_CONFIG": "/etc/helmhive/runner.json",
    "HELMHIVE_CREDENTIAL_FILE": "/var/run/secret/key",
    "HELMHIVE_CREDENTIAL_GENERATION": "7",
}
RUNNER_JSON = json.dumps({"provider": "reference", "adapter": {"type": "acp", "acp": {"command": "agent"}}})


def test_config_from_env_and_runner_json() -> None:
    config = load_config(environ=ENV, read_text=lambda path: RUNNER_JSON)
    assert config.env.runner_name == "pool-a-0"
    assert config.env.credential_generation == 7
    assert config.file.heartbeat.renew_interval_seconds == 5
    assert config.file.heartbeat.report_refresh_seconds == 300


def test_config_reports_every_problem_with_its_name() -> None:
    environ = {**ENV, "HELMHIVE_CREDENTIAL_DIR": "/login", "HELMHIVE_CREDENTIAL_GENERATION": "x"}
    del environ["HELMHIVE_NAMESPACE"]
    bad = json.dumps({"provider": "Bad_Provider", "adapter": {"type": "acp"}, "concurrency": 0, "extra": 1})
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ, read_text=lambda path: bad)
    text = "\n".join(caught.value.problems)
    for expected in (
        "HELMHIVE_NAMESPACE",
        "HELMHIVE_CREDENTIAL_GENERATION",
        "runner.json.provider",
        "runner.json.concurrency",
        "runner.json.extra",
    ):
        assert expected in text, expected


def test_config_needs_exactly_one_credential_source_and_a_matching_adapter() -> None:
    environ = {k: v for k, v in ENV.items() if k != "HELMHIVE_CREDENTIAL_FILE"}
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ, read_text=lambda path: json.dumps({"provider": "p", "adapter": {"type": "acp"}}))
    assert any("set exactly one" in p for p in caught.value.problems)
    assert any("adapter.acp: required" in p for p in caught.value.problems)


def test_config_unreadable_file_is_named() -> None:
    def missing(path: Path) -> str:
        raise FileNotFoundError(2, "No such file or directory")

    with pytest.raises(ConfigError) as caught:
        load_config(environ=ENV, read_text=missing)
    assert caught.value.problems == [
        "HELMHIVE_RUNNER_CONFIG: cannot read /etc/helmhive/runner.json: No such file or directory"
    ]


# -- credentials ---------------------------------------------------------------------------
def test_file_credential_is_copied_private_and_wiped(tmp_path: Path) -> None:
    secret = tmp_path / "mount" / "key"
    secret.parent.mkdir()
    secret.write_text("s3cret-value\n")
    holder = CredentialHolder(file=secret, directory=None, state_dir=tmp_path / "state")
    holder.prepare()
    assert holder.present() and holder.value is not None
    assert holder.value.get_secret_value() == "s3cret-value"
    assert holder.copy_path is not None and holder.copy_path.stat().st_mode & 0o777 == 0o600
    assert holder.wipe().removed_entries == 1
    assert not holder.present() and holder.value is None and not holder.copy_path.exists()
    assert secret.read_text() == "s3cret-value\n"
    assert holder.wipe().removed_entries == 0


def test_empty_file_credential_is_not_present(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("  \n")
    holder = CredentialHolder(file=secret, directory=None, state_dir=tmp_path / "state")
    holder.prepare()
    assert not holder.present()
    assert holder.secret_values() == []


def test_directory_credential_contents_are_wiped_but_the_mount_stays(tmp_path: Path) -> None:
    login = tmp_path / "login"
    (login / "nested" / "deeper").mkdir(parents=True)
    (login / "nested" / "deeper" / "token").write_text("t")
    (login / ".credentials.json").write_text("{}")
    (login / "link").symlink_to(tmp_path)
    holder = CredentialHolder(file=None, directory=login, state_dir=tmp_path / "state")
    assert holder.present()
    assert holder.wipe().removed_entries == 3
    assert login.is_dir() and list(login.iterdir()) == []
    assert tmp_path.exists()
    assert not holder.present()


def test_revoked_generation_marker(tmp_path: Path) -> None:
    assert read_revoked_generation(tmp_path) is None
    write_revoked_generation(tmp_path / "s", 5)
    assert read_revoked_generation(tmp_path / "s") == 5


# -- lease and logs ------------------------------------------------------------------------
def test_lease_body() -> None:
    body = build_lease(name="pool-a-0", duration_s=20, acquired_at=T0, now=T0 + dt.timedelta(seconds=5), transitions=2)
    assert body["metadata"] == {"name": "pool-a-0", "labels": {"helmhive.dev/runner": "pool-a-0"}}
    assert body["spec"] == {
        "holderIdentity": "pool-a-0",
        "leaseDurationSeconds": 20,
        "acquireTime": "2026-01-01T12:00:00.000000Z",
        "renewTime": "2026-01-01T12:00:05.000000Z",
        "leaseTransitions": 2,
    }
    assert micro_time(T0.astimezone(dt.timezone(dt.timedelta(hours=2)))) == "2026-01-01T12:00:00.000000Z"


def test_json_logs_redact_secrets_even_when_escaped() -> None:
    formatter = JsonFormatter()
    formatter.add_secrets(['pa"ss\\word-123'])
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "got %s", ('pa"ss\\word-123',), None)
    record.fields = {"detail": 'pa"ss\\word-123'}
    line = formatter.format(record)
    doc = json.loads(line)
    assert doc["message"] == "got [REDACTED]" and doc["detail"] == "[REDACTED]"
    assert "word-123" not in line


# -- claude cli parsing ---------------------------------------------------------------------
def test_claude_cli_parsing() -> None:
    assert parse_version("2.1.332 (Claude Code)\n") == "2.1.332"
    assert parse_version("no version") is None
    help_text = """
  --mcp-config <configs...>             Load MCP servers
  --model <model>                       Model for the current session. Use an
                                        alias for the latest model (e.g.
                                        'fable', 'opus', or 'sonnet') or a
                                        model's full name.
  -n, --name <name>                     Set a display name ('ignored')
"""
    assert parse_model_aliases(help_text) == ["fable", "opus", "sonnet"]
    assert parse_model_aliases("nothing") == []
    assert decide_auth_status({"loggedIn": False, "authMethod": "none"}, last_turn_refused=None)[:2] == (
        AdapterAuth.UNAUTHENTICATED,
        AuthReason.NOT_LOGGED_IN,
    )
    assert decide_auth_status({"loggedIn": True, "authMethod": "api_key"}, last_turn_refused=None)[:2] == (
        AdapterAuth.AUTHENTICATED,
        AuthReason.LOGGED_IN,
    )
    assert decide_auth_status({"loggedIn": True}, last_turn_refused="Invalid API key")[:2] == (
        AdapterAuth.UNAUTHENTICATED,
        AuthReason.AUTH_REQUIRED,
    )
    assert decide_auth_status(None, last_turn_refused=None)[0] is AdapterAuth.UNKNOWN


# -- layering ------------------------------------------------------------------------------
RUNNER_SRC = Path(__file__).resolve().parents[2] / "runner" / "helmhive" / "runner"
PURE_MODULES = ("program/report.py", "program/control.py", "config.py")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_kube_py_imports_the_kubernetes_client() -> None:
    importers = sorted(
        str(path.relative_to(RUNNER_SRC))
        for path in RUNNER_SRC.rglob("*.py")
        if any(name.split(".")[0] == "kubernetes" for name in _imports(path))
    )
    assert importers == ["kube.py"]


def test_pure_runner_modules_import_no_io() -> None:
    for name in PURE_MODULES:
        imported = _imports(RUNNER_SRC / name)
        offenders = {
            n for n in imported if n.split(".")[0] in {"kubernetes", "httpx", "asyncio", "subprocess", "time"}
        } | {n for n in imported if n in {"helmhive.runner.kube", "helmhive.runner.program.main"}}
        assert offenders == set(), name


def test_the_program_exits_2_naming_every_missing_setting(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "helmhive", "runner", "run"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HELMHIVE_RUNNER_NAME": "pool-a-0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    lines = [json.loads(text) for text in done.stderr.strip().splitlines()]
    # The last line is the program's own exit record (docs/runner-program.md); the error precedes it.
    assert (lines[-1]["message"], lines[-1]["exitCode"], lines[-1]["threads"]) == ("runner exiting", 2, [])
    line = lines[-2]
    assert line["message"] == "invalid configuration" and line["severity"] == "ERROR"
    problems = "\n".join(line["problems"])
    for name in ("HELMHIVE_NAMESPACE", "HELMHIVE_POOL", "HELMHIVE_RUNNER_CONFIG"):
        assert name in problems

"""The ACP adapter driving the reference agent over real stdio: probe, turns, resume, config, tools."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr

from helmhive.reference_agent import rules
from helmhive.runner.adapters import (
    AcpAdapter,
    AgentAdapter,
    AuthReason,
    AuthState,
    ConfigChange,
    ToolPermissionRecord,
    TurnOutcome,
    TurnRequest,
)
from helmhive.version import helmhive_version

from .agent_harness import AdapterFactory, MethodLog


def test_acp_adapter_satisfies_the_adapter_protocol(make_adapter: AdapterFactory) -> None:
    adapter: AgentAdapter = make_adapter()
    assert isinstance(adapter, AgentAdapter)
    assert adapter.name == "acp"


async def test_probe_reports_agent_catalogue_and_auth(make_adapter: AdapterFactory) -> None:
    report = await make_adapter().probe()
    assert report.adapter == "acp"
    assert report.adapter_version == helmhive_version()
    assert (report.agent_name, report.agent_version) == ("helmhive-reference-agent", helmhive_version())
    assert "not a model" in (report.agent_title or "")
    assert report.protocol_version == 1
    assert (report.auth, report.auth_reason) == (AuthState.AUTHENTICATED, AuthReason.SESSION_CREATED)
    assert report.auth_methods == ["reference-token"]
    assert report.capabilities.load_session is True
    assert report.capabilities.resume_session is True
    assert report.capabilities.mcp_http is False
    assert report.models == ["reference-small", "reference-large"]
    assert report.default_model == "reference-small"
    assert report.effort_levels == ["low", "medium", "high"]
    assert report.default_effort == "medium"
    assert report.capabilities_known is True
    assert report.capabilities.names() == ["session-load", "session-resume", "session-fork"]
    assert report.model_efforts == {m: ["low", "medium", "high"] for m in report.models}


async def test_probe_learns_the_efforts_of_each_model_and_what_the_agent_cannot_do(
    make_adapter: AdapterFactory, method_log: MethodLog
) -> None:
    adapter = make_adapter(
        "no-load-session,no-fork",
        extra_env={"HELMHIVE_REFERENCE_AGENT_EFFORTS": "reference-small=low,medium;reference-large="},
    )
    report = await adapter.probe()
    assert report.model_efforts == {"reference-small": ["low", "medium"], "reference-large": []}
    assert report.capabilities.names() == ["session-resume"]
    assert method_log.config_calls() == [("model", "reference-large")]  # one request per other model
    await adapter.probe()
    assert len(method_log.config_calls()) == 1  # learnt once, then remembered


async def test_agent_gets_only_the_explicit_environment(
    make_adapter: AdapterFactory, method_log: MethodLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELMHIVE_TEST_PARENT_ONLY", "must-not-be-inherited")
    await make_adapter(extra_env={"EXTRA_SETTING": "1"}, secret_env={"PROVIDER_KEY": "k-123456"}).probe()
    keys = set(method_log.entries()[0]["envKeys"])
    assert {"HELMHIVE_REFERENCE_AGENT_STATE_DIR", "EXTRA_SETTING", "PROVIDER_KEY"} <= keys
    assert "HELMHIVE_TEST_PARENT_ONLY" not in keys
    assert "PATH" not in keys and "HOME" not in keys
    # The only addition is the interpreter's own locale coercion (PEP 538).
    assert keys - {"HELMHIVE_REFERENCE_AGENT_STATE_DIR", "EXTRA_SETTING", "PROVIDER_KEY"} <= {"LC_CTYPE"}


async def test_turn_completes_deterministically(make_adapter: AdapterFactory, workdir: str) -> None:
    adapter = make_adapter()
    prompt = "Summarise the repository layout\nin two lines"
    first = await adapter.run_turn(TurnRequest(prompt=prompt, cwd=workdir))
    second = await adapter.run_turn(TurnRequest(prompt=prompt, cwd=workdir))
    assert first.outcome is TurnOutcome.COMPLETED and first.ok
    assert first.stop_reason == "end_turn"
    expected = rules.render_reply(prompt, turn=1, model="reference-small", effort="medium", tool_results={})
    assert first.text == expected
    assert second.text == expected  # a fresh session each time: same prompt, same answer
    assert first.native_session_id is not None and second.native_session_id is not None
    assert first.native_session_id.get_secret_value() != second.native_session_id.get_secret_value()
    assert (first.model, first.effort, first.session_resumed) == ("reference-small", "medium", False)
    assert first.config_changes == []
    assert first.session_updates >= 1


async def test_json_output_contract(make_adapter: AdapterFactory, workdir: str) -> None:
    prompt = "OUTPUT-CONTRACT: json\nList the services"
    result = await make_adapter().run_turn(TurnRequest(prompt=prompt, cwd=workdir))
    data = json.loads(result.text)
    assert data["turn"] == 1
    assert data["promptSha256"] == rules.prompt_digest(prompt)
    assert data["firstLine"] == "List the services"


async def test_resume_remembers_prior_turns_across_processes(
    make_adapter: AdapterFactory, method_log: MethodLog, workdir: str
) -> None:
    first = make_adapter()
    opened = await first.run_turn(TurnRequest(prompt="remember me", cwd=workdir))
    session_id = opened.native_session_id
    assert session_id is not None
    await first.close()

    second = make_adapter()
    resumed = await second.run_turn(TurnRequest(prompt="how many turns?", cwd=workdir, session_id=session_id))
    assert resumed.outcome is TurnOutcome.COMPLETED
    assert resumed.session_resumed is True
    assert "turn=2 " in resumed.text
    assert resumed.native_session_id == session_id
    again = await second.run_turn(TurnRequest(prompt="and now?", cwd=workdir, session_id=session_id))
    assert "turn=3 " in again.text
    # Two processes; the session was loaded once, into the second, and reused there.
    assert len(set(method_log.pids())) == 2
    assert method_log.count("session/load") == 1


async def test_unknown_session_is_named(make_adapter: AdapterFactory, workdir: str) -> None:
    request = TurnRequest(prompt="hi", cwd=workdir, session_id=SecretStr("0" * 32))
    result = await make_adapter().run_turn(request)
    assert result.outcome is TurnOutcome.SESSION_NOT_FOUND
    assert "0" * 32 not in result.message


async def test_model_then_effort_are_set_only_when_needed(
    make_adapter: AdapterFactory, method_log: MethodLog, workdir: str
) -> None:
    adapter = make_adapter()
    defaults = await adapter.run_turn(
        TurnRequest(prompt="defaults", cwd=workdir, model="reference-small", effort="medium")
    )
    assert defaults.ok and defaults.config_changes == []
    assert method_log.config_calls() == []

    wanted = TurnRequest(prompt="big", cwd=workdir, model="reference-large", effort="high")
    changed = await adapter.run_turn(wanted)
    assert changed.ok
    assert method_log.config_calls() == [("model", "reference-large"), ("effort", "high")]
    assert changed.config_changes == [ConfigChange(config_id="model", value="reference-large"),
                                      ConfigChange(config_id="effort", value="high")]  # fmt: skip
    assert (changed.model, changed.effort) == ("reference-large", "high")
    assert "model=reference-large effort=high" in changed.text

    same = await adapter.run_turn(wanted.model_copy(update={"session_id": changed.native_session_id}))
    assert same.ok and same.config_changes == []
    assert len(method_log.config_calls()) == 2  # already held: nothing sent

    effort_only = wanted.model_copy(update={"session_id": changed.native_session_id, "effort": "low"})
    lowered = await adapter.run_turn(effort_only)
    assert method_log.config_calls()[2:] == [("effort", "low")]
    assert "model=reference-large effort=low" in lowered.text


@pytest.mark.parametrize(
    "case",
    [
        ("gpt-imaginary", None, TurnOutcome.MODEL_NOT_OFFERED),
        ("reference-large", "extreme", TurnOutcome.EFFORT_NOT_OFFERED),
    ],
)
async def test_unoffered_value_fails_closed(
    make_adapter: AdapterFactory,
    method_log: MethodLog,
    workdir: str,
    case: tuple[str, str | None, TurnOutcome],
) -> None:
    model, effort, outcome = case
    result = await make_adapter().run_turn(TurnRequest(prompt="hi", cwd=workdir, model=model, effort=effort))
    assert result.outcome is outcome
    assert (effort or model) in result.message
    assert "session/prompt" not in method_log.methods()
    if outcome is TurnOutcome.MODEL_NOT_OFFERED:
        assert method_log.config_calls() == []  # never swapped silently: nothing sent at all
    else:
        assert method_log.config_calls() == [("model", "reference-large")]  # model first, then refused


async def test_refused_config_option_is_named(
    make_adapter: AdapterFactory, method_log: MethodLog, workdir: str
) -> None:
    result = await make_adapter("refuse-config").run_turn(
        TurnRequest(prompt="hi", cwd=workdir, model="reference-large")
    )
    assert result.outcome is TurnOutcome.CONFIG_REFUSED
    assert "reference-large" in result.message
    assert method_log.config_calls() == [("model", "reference-large")]
    assert "session/prompt" not in method_log.methods()


async def test_tool_permissions_follow_the_allow_list(make_adapter: AdapterFactory, workdir: str) -> None:
    adapter: AcpAdapter = make_adapter()
    prompt = "look around\nUSE-TOOL: Bash\nUSE-TOOL: Read"
    result = await adapter.run_turn(TurnRequest(prompt=prompt, cwd=workdir, allowed_tools=frozenset({"Read"})))
    assert result.ok
    assert "tool Bash: denied" in result.text
    assert "tool Read: granted" in result.text
    assert result.tool_requests == [
        ToolPermissionRecord(tool="Bash", kind="other", allowed=False),
        ToolPermissionRecord(tool="Read", kind="other", allowed=True),
    ]
    nothing_allowed = await adapter.run_turn(TurnRequest(prompt=prompt, cwd=workdir))
    assert [record.allowed for record in nothing_allowed.tool_requests] == [False, False]
    by_kind = await adapter.run_turn(TurnRequest(prompt=prompt, cwd=workdir, allowed_tools=frozenset({"kind:other"})))
    assert [record.allowed for record in by_kind.tool_requests] == [True, True]

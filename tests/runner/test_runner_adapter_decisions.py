"""The adapter's pure decisions: config options, tool permissions, redaction."""

from __future__ import annotations

import pytest
from acp import schema

from helmhive.runner.adapters.acp_process import options_from_acp, tool_name
from helmhive.runner.adapters.base import TurnOutcome, TurnRequest
from helmhive.runner.adapters.decisions import (
    REDACTED,
    ConfigKind,
    ConfigOptionView,
    PermissionOptionView,
    decide_config_change,
    decide_permission,
    find_option,
    redact,
)

MODEL = ConfigOptionView("model", "model", "small", ("small", "large"))
EFFORT = ConfigOptionView("effort", "thought_level", "medium", ("low", "medium", "high"))
OPTIONS = (MODEL, EFFORT)


def test_nothing_wanted_sends_nothing() -> None:
    assert decide_config_change(OPTIONS, ConfigKind.MODEL, None).action == "keep"


def test_value_already_held_is_not_sent() -> None:
    decision = decide_config_change(OPTIONS, ConfigKind.MODEL, "small")
    assert (decision.action, decision.config_id) == ("keep", "model")


def test_offered_value_not_held_is_set() -> None:
    decision = decide_config_change(OPTIONS, ConfigKind.EFFORT, "high")
    assert (decision.action, decision.config_id, decision.value) == ("set", "effort", "high")


@pytest.mark.parametrize(
    ("kind", "wanted", "outcome"),
    [
        (ConfigKind.MODEL, "huge", TurnOutcome.MODEL_NOT_OFFERED),
        (ConfigKind.EFFORT, "max", TurnOutcome.EFFORT_NOT_OFFERED),
    ],
)
def test_unoffered_value_is_refused_with_a_named_outcome(kind: ConfigKind, wanted: str, outcome: TurnOutcome) -> None:
    decision = decide_config_change(OPTIONS, kind, wanted)
    assert decision.action == "refuse"
    assert decision.outcome is outcome
    assert wanted in decision.message


def test_missing_option_refuses_rather_than_guessing() -> None:
    decision = decide_config_change((EFFORT,), ConfigKind.MODEL, "small")
    assert (decision.action, decision.outcome) == ("refuse", TurnOutcome.MODEL_NOT_OFFERED)


def test_option_found_by_category_before_id() -> None:
    decoy = ConfigOptionView("model", None, "x", ("x",))
    real = ConfigOptionView("llm", "model", "y", ("y",))
    assert find_option((decoy, real), ConfigKind.MODEL) is real
    assert find_option((decoy,), ConfigKind.MODEL) is decoy
    assert find_option((ConfigOptionView("mode", "mode", "a", ("a",)),), ConfigKind.EFFORT) is None


def test_options_from_acp_flattens_groups_and_skips_booleans() -> None:
    grouped = schema.SessionConfigOptionSelect(
        id="model",
        name="Model",
        category="model",
        type="select",
        current_value="b",
        options=[
            schema.SessionConfigSelectGroup(
                group="g1", name="G1", options=[schema.SessionConfigSelectOption(value="a", name="A")]
            ),
            schema.SessionConfigSelectGroup(
                group="g2", name="G2", options=[schema.SessionConfigSelectOption(value="b", name="B")]
            ),
        ],
    )
    flag = schema.SessionConfigOptionBoolean(id="fast", name="Fast", type="boolean", current_value=True)
    assert options_from_acp([grouped, flag]) == (ConfigOptionView("model", "model", "b", ("a", "b")),)
    assert options_from_acp(None) == ()


ALLOW_REJECT = (
    PermissionOptionView("always", "allow_always"),
    PermissionOptionView("once", "allow_once"),
    PermissionOptionView("no-ever", "reject_always"),
    PermissionOptionView("no", "reject_once"),
)


def test_allowed_tool_gets_allow_once_never_allow_always() -> None:
    decision = decide_permission("Read", "read", ALLOW_REJECT, {"Read"})
    assert (decision.allowed, decision.option_id) == (True, "once")


def test_tool_allowed_by_kind() -> None:
    assert decide_permission("cat", "read", ALLOW_REJECT, {"kind:read"}).allowed is True
    assert decide_permission("rm", "delete", ALLOW_REJECT, {"kind:read"}).allowed is False


def test_unlisted_tool_is_rejected_once() -> None:
    decision = decide_permission("Bash", "execute", ALLOW_REJECT, {"Read"})
    assert (decision.allowed, decision.option_id) == (False, "no")


def test_allowed_tool_without_allow_once_is_denied() -> None:
    options = (PermissionOptionView("always", "allow_always"), PermissionOptionView("never", "reject_always"))
    decision = decide_permission("Read", None, options, {"Read"})
    assert (decision.allowed, decision.option_id) == (False, "never")


def test_no_reject_option_answers_cancelled() -> None:
    decision = decide_permission("Bash", None, (PermissionOptionView("once", "allow_once"),), set())
    assert (decision.allowed, decision.option_id) == (False, None)


def test_requests_during_cancellation_are_cancelled() -> None:
    decision = decide_permission("Read", None, ALLOW_REJECT, {"Read"}, cancelling=True)
    assert (decision.allowed, decision.option_id) == (False, None)


def test_empty_tool_name_is_never_allowed() -> None:
    assert decide_permission("", None, ALLOW_REJECT, {""}).allowed is False


def test_tool_name_prefers_meta_then_title() -> None:
    with_meta = schema.ToolCallUpdate(tool_call_id="1", title="Run a command", field_meta={"toolName": "Bash"})
    assert tool_name(with_meta) == "Bash"
    assert tool_name(schema.ToolCallUpdate(tool_call_id="2", title="Read")) == "Read"
    assert tool_name(schema.ToolCallUpdate(tool_call_id="3")) == ""


def test_redact_removes_every_secret_longest_first() -> None:
    text = "key=sk-abcdef and sk-abc and abc"
    assert redact(text, ["sk-abc", "sk-abcdef", "ab"]) == f"key={REDACTED} and {REDACTED} and abc"


def test_turn_request_needs_an_absolute_cwd() -> None:
    with pytest.raises(ValueError, match="absolute"):
        TurnRequest(prompt="hi", cwd="relative/dir")

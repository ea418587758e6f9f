"""decide_profile: every violation with its field path and reason, and the narrowed profile."""

from __future__ import annotations

from typing import Any

import pytest

from helmhive.api.common import FilesystemAccess, JobKind, NetworkAccess, SessionPolicy, ToolKind
from helmhive.api.envelope import OutputFormat
from helmhive.api.profile import ProfileSpec
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import ENVELOPES, get_envelope
from helmhive.policy.profiles.narrowing import (
    ProfileVerdict,
    as_profile_spec,
    compose_output_schema,
    decide_profile,
)
from helmhive.policy.violations import field_path, split_field_path


def profile(envelope: str = "review-probe", **spec: Any) -> ProfileSpec:
    wire: dict[str, Any] = {
        "envelope": envelope,
        "purpose": "test",
        "providerMappings": [{"provider": "anthropic", "model": "claude-sonnet-4-5"}],
    }
    wire.update(spec)
    return ProfileSpec.model_validate(wire)


def decide(p: ProfileSpec) -> ProfileVerdict:
    return decide_profile(profile=p, envelope=get_envelope(p.envelope))


def found(verdict: ProfileVerdict) -> list[tuple[str, Reason]]:
    return [(v.field_path, v.reason) for v in verdict.violations]


# --- one violation at a time --------------------------------------------------------------


@pytest.mark.parametrize(
    ("envelope", "spec", "expected"),
    [
        pytest.param(
            "review-probe",
            {"tools": ["read", "fetch"]},
            [("spec.tools[1]", Reason.TOOL_OUTSIDE_ENVELOPE)],
            id="tool-outside",
        ),
        pytest.param(
            "connection-test",
            {"filesystem": "read"},
            [("spec.filesystem", Reason.FILESYSTEM_WIDER_THAN_ENVELOPE)],
            id="filesystem-wider",
        ),
        pytest.param(
            "implementation-probe",
            {"network": "enabled"},
            [("spec.network", Reason.NETWORK_WIDER_THAN_ENVELOPE)],
            id="network-wider",
        ),
        pytest.param(
            "review-probe",
            {"outputContract": {"format": "text"}},
            [("spec.outputContract.format", Reason.OUTPUT_CONTRACT_MISMATCH)],
            id="output-format-differs",
        ),
        pytest.param(
            "connection-test",
            {"outputContract": {"format": "text", "schema": {"type": "object"}}},
            [("spec.outputContract.schema", Reason.OUTPUT_CONTRACT_MISMATCH)],
            id="schema-on-text",
        ),
        pytest.param(
            "review-probe",
            {"outputContract": {"format": "structured", "schema": {"type": "objekt"}}},
            [("spec.outputContract.schema.type", Reason.INVALID_OUTPUT_SCHEMA)],
            id="schema-invalid",
        ),
        pytest.param(
            "review-probe",
            {
                "outputContract": {
                    "format": "structured",
                    "schema": {"properties": {"x": {"$ref": "https://example.com/s.json"}}},
                }
            },
            [("spec.outputContract.schema.properties.x.$ref", Reason.INVALID_OUTPUT_SCHEMA)],
            id="schema-remote-ref",
        ),
        pytest.param(
            "review-probe",
            {"requiredCapabilities": ["workspace-write"]},
            [("spec.requiredCapabilities[0]", Reason.REVIEW_PROFILE_WRITES)],
            id="review-requires-write-capability",
        ),
        pytest.param(
            "change-planning",
            {"session": {"policy": "resume"}},
            [("spec.session.policy", Reason.SESSION_POLICY_FORBIDDEN)],
            id="governed-resume",
        ),
        pytest.param(
            "policy-suggestion",
            {"session": {"policy": "fork"}},
            [("spec.session.policy", Reason.SESSION_POLICY_FORBIDDEN)],
            id="suggestion-fork",
        ),
        pytest.param(
            "change-implementation",
            {"memory": {"enabled": True}},
            [("spec.memory.enabled", Reason.MEMORY_FORBIDDEN)],
            id="governed-memory",
        ),
        pytest.param(
            "connection-test",
            {"memory": {"enabled": True}},
            [("spec.memory.enabled", Reason.MEMORY_FORBIDDEN)],
            id="connection-test-memory",
        ),
        pytest.param(
            "review-probe",
            {"providerMappings": []},
            [("spec.providerMappings", Reason.NO_PROVIDER_MAPPINGS)],
            id="no-mappings",
        ),
        pytest.param(
            "review-probe",
            {
                "providerMappings": [
                    {"provider": "anthropic", "model": "m1"},
                    {"provider": "openai", "model": "m1"},
                    {"provider": "anthropic", "model": "m1", "reasoningEffort": "high"},
                ]
            },
            [("spec.providerMappings[2]", Reason.DUPLICATE_MAPPING)],
            id="duplicate-mapping",
        ),
        pytest.param(
            "review-probe",
            {"providerMappings": [{"provider": "anthropic"}, {"provider": "anthropic"}]},
            [("spec.providerMappings[1]", Reason.DUPLICATE_MAPPING)],
            id="duplicate-default-model-mapping",
        ),
        pytest.param(
            "review-probe",
            {
                "providerMappings": [
                    {"provider": "openai", "model": "a"},
                    {"provider": "anthropic", "model": "m1", "fallbackModels": ["m2", "m1"]},
                ]
            },
            [("spec.providerMappings[1].fallbackModels[1]", Reason.FALLBACK_EQUALS_PRIMARY)],
            id="fallback-equals-primary",
        ),
        pytest.param(
            "review-probe",
            {"providerMappings": [{"provider": "anthropic", "model": "m1", "fallbackModels": ["m2", "m2"]}]},
            [("spec.providerMappings[0].fallbackModels[1]", Reason.DUPLICATE_MAPPING)],
            id="fallback-twice",
        ),
        pytest.param(
            "change-review",
            {"requiredLabels": {"domain": "docs"}},
            [("spec.requiredLabels.domain", Reason.LABEL_CONFLICTS_WITH_ENVELOPE)],
            id="label-contradicts-envelope",
        ),
        pytest.param(
            "change-review",
            {"requiredLabels": {f"k{i}": "v" for i in range(32)}},
            [("spec.requiredLabels", Reason.OVER_LIMIT)],
            id="labels-over-limit-with-envelope",
        ),
    ],
)
def test_each_rule_reports_its_field_and_reason(
    envelope: str, spec: dict[str, Any], expected: list[tuple[str, Reason]]
) -> None:
    verdict = decide(profile(envelope, **spec))
    assert found(verdict) == expected
    assert verdict.effective is None
    assert not verdict.valid
    assert all(v.message for v in verdict.violations)


@pytest.mark.parametrize("envelope", ["review-probe", "change-review"])
def test_review_profile_that_writes_gets_both_the_envelope_and_the_review_reason(envelope: str) -> None:
    verdict = decide(profile(envelope, filesystem="write", tools=["read", "edit", "execute"]))
    assert set(found(verdict)) == {
        ("spec.tools[1]", Reason.TOOL_OUTSIDE_ENVELOPE),
        ("spec.tools[2]", Reason.TOOL_OUTSIDE_ENVELOPE),
        ("spec.filesystem", Reason.FILESYSTEM_WIDER_THAN_ENVELOPE),
        ("spec.filesystem", Reason.REVIEW_PROFILE_WRITES),
        ("spec.tools[1]", Reason.REVIEW_PROFILE_WRITES),
        ("spec.tools[2]", Reason.REVIEW_PROFILE_WRITES),
    }


def test_all_violations_are_reported_together() -> None:
    p = profile(
        "change-review",
        tools=["read", "edit"],
        filesystem="write",
        network="enabled",
        outputContract={"format": "text"},
        session={"policy": "fork"},
        memory={"enabled": True},
        providerMappings=[
            {"provider": "anthropic", "model": "a", "fallbackModels": ["a"]},
            {"provider": "anthropic", "model": "a"},
        ],
    )
    reasons = {v.reason for v in decide(p).violations}
    assert reasons == {
        Reason.TOOL_OUTSIDE_ENVELOPE,
        Reason.FILESYSTEM_WIDER_THAN_ENVELOPE,
        Reason.NETWORK_WIDER_THAN_ENVELOPE,
        Reason.OUTPUT_CONTRACT_MISMATCH,
        Reason.REVIEW_PROFILE_WRITES,
        Reason.SESSION_POLICY_FORBIDDEN,
        Reason.MEMORY_FORBIDDEN,
        Reason.FALLBACK_EQUALS_PRIMARY,
        Reason.DUPLICATE_MAPPING,
    }


def test_every_invalid_schema_error_is_reported() -> None:
    schema = {"type": "objekt", "properties": {"a": {"minLength": -1}}}
    verdict = decide(profile(outputContract={"format": "structured", "schema": schema}))
    assert {v.field_path for v in verdict.violations} == {
        "spec.outputContract.schema.type",
        "spec.outputContract.schema.properties.a.minLength",
    }


def test_missing_or_mismatched_envelope_is_unknown() -> None:
    p = profile("review-probe")
    assert found(decide_profile(profile=p, envelope=None)) == [("spec.envelope", Reason.UNKNOWN_ENVELOPE)]
    other = get_envelope(JobKind.CHANGE_REVIEW)
    assert found(decide_profile(profile=p, envelope=other)) == [("spec.envelope", Reason.UNKNOWN_ENVELOPE)]


# --- the effective profile ----------------------------------------------------------------


def test_defaults_take_the_envelope_and_union_requirements() -> None:
    envelope = ENVELOPES[JobKind.CHANGE_REVIEW]
    verdict = decide(
        profile(
            "change-review",
            requiredLabels={"team": "payments", "domain": "code"},
            requiredCapabilities=["diff-review", "gpu"],
        )
    )
    eff = verdict.effective
    assert eff is not None and verdict.valid
    assert eff.tools == envelope.max_tools
    assert eff.filesystem is FilesystemAccess.READ
    assert eff.network is NetworkAccess.DISABLED
    assert eff.output_contract == envelope.output_contract
    assert eff.session.policy is SessionPolicy.FRESH
    assert eff.required_labels == {"domain": "code", "team": "payments"}
    assert eff.required_capabilities == ["structured-output", "diff-review", "gpu"]


def test_tools_keep_the_envelope_order_and_narrower_access_is_kept() -> None:
    eff = decide(profile("implementation-probe", tools=["execute", "read", "edit"], filesystem="read")).effective
    assert eff is not None
    assert eff.tools == [ToolKind.READ, ToolKind.EDIT, ToolKind.EXECUTE]
    assert eff.filesystem is FilesystemAccess.READ


def test_profile_schema_is_added_to_the_envelope_schema_with_all_of() -> None:
    extra = {"properties": {"summary": {"maxLength": 200}}}
    eff = decide(profile(outputContract={"format": "structured", "schema": extra})).effective
    envelope = ENVELOPES[JobKind.REVIEW_PROBE]
    assert eff is not None
    assert eff.output_contract.format is OutputFormat.STRUCTURED
    assert eff.output_contract.json_schema == {"allOf": [envelope.output_contract.json_schema, extra]}


def test_profile_repeating_the_envelope_schema_changes_nothing() -> None:
    envelope = ENVELOPES[JobKind.REVIEW_PROBE]
    contract = envelope.output_contract.to_wire()
    eff = decide(profile(outputContract=contract)).effective
    assert eff is not None
    assert eff.output_contract == envelope.output_contract


def test_narrowing_an_effective_profile_again_is_a_fixed_point() -> None:
    extra = {"required": ["summary"]}
    first = decide(
        profile(
            outputContract={"format": "structured", "schema": extra},
            tools=["search", "read"],
            requiredLabels={"team": "a"},
        )
    ).effective
    assert first is not None
    again = decide(as_profile_spec(first)).effective
    assert again == first


def test_compose_output_schema_flattens_and_dedupes() -> None:
    a, b, c = {"type": "object"}, {"required": ["x"]}, {"required": ["y"]}
    assert compose_output_schema(None, None) is None
    assert compose_output_schema(a, None) == a
    assert compose_output_schema(a, {"allOf": [a, b]}) == {"allOf": [a, b]}
    assert compose_output_schema(a, {"allOf": [b, {"allOf": [c]}]}) == {"allOf": [a, b, c]}
    # allOf with siblings is a real schema, not a wrapper: it is kept whole
    wrapped = {"allOf": [b], "type": "object"}
    assert compose_output_schema(a, wrapped) == {"allOf": [a, wrapped]}


def test_field_paths_round_trip() -> None:
    path = field_path("spec", "providerMappings", 1, "fallbackModels", 0)
    assert path == "spec.providerMappings[1].fallbackModels[0]"
    assert split_field_path(path) == ["spec", "providerMappings", 1, "fallbackModels", 0]
    odd = field_path("spec", "requiredLabels", "app.kubernetes.io/name")
    assert odd == "spec.requiredLabels[app.kubernetes.io/name]"
    assert split_field_path(odd) == ["spec", "requiredLabels", "app.kubernetes.io/name"]

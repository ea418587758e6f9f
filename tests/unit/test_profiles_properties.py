"""Properties of decide_profile: never wider than the envelope, narrowing is idempotent, complete."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from helmhive.api.common import FilesystemAccess, JobKind, NetworkAccess, SessionPolicy, ToolKind
from helmhive.api.envelope import EnvelopeClass, EnvelopeSpec, MemoryAccess, OutputContract, OutputFormat
from helmhive.api.profile import ProfileSpec
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import ENVELOPES, is_review
from helmhive.policy.profiles.narrowing import WRITE_TOOLS, as_profile_spec, decide_profile

FS_RANK = {FilesystemAccess.NONE: 0, FilesystemAccess.READ: 1, FilesystemAccess.WRITE: 2}
NET_RANK = {NetworkAccess.DISABLED: 0, NetworkAccess.ENABLED: 1}

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object"},
    {"required": ["summary"]},
    {"properties": {"summary": {"type": "string", "maxLength": 100}}},
    {"allOf": [{"type": "object"}, {"required": ["x"]}]},
]
CAPABILITIES = ["structured-output", "diff-review", "workspace-write", "gpu", "big-context"]
LABELS = st.dictionaries(
    st.sampled_from(["domain", "team", "region", "tier"]), st.sampled_from(["code", "docs", "a", "b"]), max_size=4
)


@st.composite
def contracts(draw: st.DrawFn) -> OutputContract:
    fmt = draw(st.sampled_from(OutputFormat))
    schema = draw(st.none() | st.sampled_from(SCHEMAS)) if fmt is OutputFormat.STRUCTURED else None
    return OutputContract(format=fmt, json_schema=schema)


@st.composite
def arbitrary_envelopes(draw: st.DrawFn) -> EnvelopeSpec:
    return EnvelopeSpec(
        job_kind=draw(st.sampled_from(JobKind)),
        envelope_class=draw(st.sampled_from(EnvelopeClass)),
        description="generated",
        max_tools=draw(st.lists(st.sampled_from(ToolKind), unique=True)),
        filesystem=draw(st.sampled_from(FilesystemAccess)),
        network=draw(st.sampled_from(NetworkAccess)),
        output_contract=draw(contracts()),
        required_capabilities=draw(st.lists(st.sampled_from(CAPABILITIES), unique=True, max_size=3)),
        required_labels=draw(LABELS),
        session_policies=draw(st.lists(st.sampled_from(SessionPolicy), unique=True, min_size=1)),
        memory=draw(st.sampled_from(MemoryAccess)),
    )


envelopes = st.sampled_from(list(ENVELOPES.values())) | arbitrary_envelopes()

mappings = st.lists(
    st.fixed_dictionaries(
        {"provider": st.sampled_from(["anthropic", "openai"])},
        optional={
            "model": st.sampled_from(["m1", "m2"]),
            "fallbackModels": st.lists(st.sampled_from(["m1", "m2", "m3"]), max_size=3),
        },
    ),
    max_size=3,
)


@st.composite
def profiles_for(draw: st.DrawFn, envelope: EnvelopeSpec) -> ProfileSpec:
    """A profile naming ``envelope``: half drawn anywhere, half drawn inside the envelope."""
    if draw(st.booleans()):
        return _inside(draw, envelope)
    wire: dict[str, Any] = {
        "envelope": envelope.job_kind.value,
        "purpose": "generated",
        "providerMappings": draw(mappings),
        "session": {"policy": draw(st.sampled_from(SessionPolicy)).value},
        "memory": {"enabled": draw(st.booleans())},
        "requiredLabels": draw(LABELS),
        "requiredCapabilities": draw(st.lists(st.sampled_from(CAPABILITIES), unique=True, max_size=3)),
    }
    if draw(st.booleans()):
        wire["tools"] = [t.value for t in draw(st.lists(st.sampled_from(ToolKind), max_size=8))]
    if draw(st.booleans()):
        wire["filesystem"] = draw(st.sampled_from(FilesystemAccess)).value
    if draw(st.booleans()):
        wire["network"] = draw(st.sampled_from(NetworkAccess)).value
    if draw(st.booleans()):
        wire["outputContract"] = draw(contracts()).to_wire()
    return ProfileSpec.model_validate(wire)


def _inside(draw: st.DrawFn, envelope: EnvelopeSpec) -> ProfileSpec:
    review = is_review(envelope.job_kind)
    tools = [t for t in envelope.max_tools if not (review and t in WRITE_TOOLS)]
    top_fs = min(FS_RANK[envelope.filesystem], 1 if review else 2)
    # A review profile must list its tools when the envelope would hand it write tools.
    fmt = envelope.output_contract.format
    schema = draw(st.none() | st.sampled_from(SCHEMAS)) if fmt is OutputFormat.STRUCTURED else None
    labels = {k: v for k, v in draw(LABELS).items() if envelope.required_labels.get(k, v) == v}
    capabilities = [c for c in CAPABILITIES if not (review and c == "workspace-write")]
    provider = draw(st.sampled_from(["anthropic", "openai"]))
    wire: dict[str, Any] = {
        "envelope": envelope.job_kind.value,
        "purpose": "generated",
        "providerMappings": [{"provider": provider, "model": "m1", "fallbackModels": ["m2"]}],
        "session": {"policy": draw(st.sampled_from(envelope.session_policies)).value},
        "memory": {"enabled": envelope.memory is MemoryAccess.ALLOWED and draw(st.booleans())},
        "requiredLabels": labels,
        "requiredCapabilities": draw(st.lists(st.sampled_from(capabilities), unique=True, max_size=3)),
        "tools": [t.value for t in draw(st.lists(st.sampled_from(tools), max_size=8))] if tools else [],
        "filesystem": draw(st.sampled_from([f for f, r in FS_RANK.items() if r <= top_fs])).value,
        "network": draw(st.sampled_from([n for n, r in NET_RANK.items() if r <= NET_RANK[envelope.network]])).value,
        "outputContract": OutputContract(format=fmt, json_schema=schema).to_wire(),
    }
    return ProfileSpec.model_validate(wire)


@st.composite
def cases(draw: st.DrawFn) -> tuple[EnvelopeSpec, ProfileSpec]:
    envelope = draw(envelopes)
    return envelope, draw(profiles_for(envelope))


def conjuncts(schema: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The schemas a bare ``allOf`` wrapper holds, flattened; a schema is its own conjunct."""
    if schema is None:
        return []
    if set(schema) == {"allOf"}:
        return [part for item in schema["allOf"] for part in conjuncts(item)]
    return [schema]


SAMPLE_OUTPUTS: list[Any] = [
    {},
    {"summary": "ok"},
    {"summary": "x" * 150, "x": 1},
    {"x": 1, "summary": "ok"},
    [],
    "text",
]


@settings(max_examples=400, deadline=None)
@given(cases())
def test_effective_profile_is_never_wider_than_the_envelope(case: tuple[EnvelopeSpec, ProfileSpec]) -> None:
    envelope, profile = case
    verdict = decide_profile(profile=profile, envelope=envelope)
    assert (verdict.effective is None) == bool(verdict.violations)
    eff = verdict.effective
    if eff is None:
        return
    assert set(eff.tools) <= set(envelope.max_tools)
    assert eff.tools == [t for t in envelope.max_tools if t in eff.tools]
    assert FS_RANK[eff.filesystem] <= FS_RANK[envelope.filesystem]
    assert NET_RANK[eff.network] <= NET_RANK[envelope.network]
    assert eff.output_contract.format is envelope.output_contract.format
    effective_schema, envelope_schema = eff.output_contract.json_schema, envelope.output_contract.json_schema
    for part in conjuncts(envelope_schema):
        assert part in conjuncts(effective_schema)
    if envelope_schema is not None and effective_schema is not None:
        for sample in SAMPLE_OUTPUTS:
            if Draft202012Validator(effective_schema).is_valid(sample):
                assert Draft202012Validator(envelope_schema).is_valid(sample)
    assert eff.session.policy in envelope.session_policies
    assert not eff.memory.enabled or envelope.memory is MemoryAccess.ALLOWED
    assert envelope.required_labels.items() <= eff.required_labels.items()
    assert profile.required_labels.items() <= eff.required_labels.items()
    assert set(envelope.required_capabilities) | set(profile.required_capabilities) == set(eff.required_capabilities)
    assert eff.provider_mappings
    if is_review(envelope.job_kind):
        assert eff.filesystem is not FilesystemAccess.WRITE
        assert not (set(eff.tools) & WRITE_TOOLS)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_narrowing_twice_equals_narrowing_once(case: tuple[EnvelopeSpec, ProfileSpec]) -> None:
    envelope, profile = case
    once = decide_profile(profile=profile, envelope=envelope).effective
    if once is None:
        return
    twice = decide_profile(profile=as_profile_spec(once), envelope=envelope)
    assert twice.violations == ()
    assert twice.effective == once


@settings(max_examples=400, deadline=None)
@given(cases())
def test_every_wider_axis_is_a_violation_never_silently_narrowed(
    case: tuple[EnvelopeSpec, ProfileSpec],
) -> None:
    envelope, profile = case
    found = {(v.field_path, v.reason) for v in decide_profile(profile=profile, envelope=envelope).violations}
    for index, tool in enumerate(profile.tools or ()):
        if tool not in envelope.max_tools:
            assert (f"spec.tools[{index}]", Reason.TOOL_OUTSIDE_ENVELOPE) in found
    if profile.filesystem and FS_RANK[profile.filesystem] > FS_RANK[envelope.filesystem]:
        assert ("spec.filesystem", Reason.FILESYSTEM_WIDER_THAN_ENVELOPE) in found
    if profile.network and NET_RANK[profile.network] > NET_RANK[envelope.network]:
        assert ("spec.network", Reason.NETWORK_WIDER_THAN_ENVELOPE) in found
    if profile.output_contract and profile.output_contract.format is not envelope.output_contract.format:
        assert ("spec.outputContract.format", Reason.OUTPUT_CONTRACT_MISMATCH) in found
    if profile.session.policy not in envelope.session_policies:
        assert ("spec.session.policy", Reason.SESSION_POLICY_FORBIDDEN) in found
    if profile.memory.enabled and envelope.memory is MemoryAccess.FORBIDDEN:
        assert ("spec.memory.enabled", Reason.MEMORY_FORBIDDEN) in found
    if not profile.provider_mappings:
        assert ("spec.providerMappings", Reason.NO_PROVIDER_MAPPINGS) in found

"""The envelope catalogue follows the specification's rules exactly."""

from __future__ import annotations

from helmhive.api.common import FilesystemAccess, JobKind, NetworkAccess, SessionPolicy, ToolKind
from helmhive.api.envelope import EnvelopeClass, MemoryAccess, OutputFormat
from helmhive.policy.envelopes import (
    CAP_DIFF_REVIEW,
    CAP_STRUCTURED_OUTPUT,
    ENVELOPES,
    envelope_hash,
    get_envelope,
    is_governed,
    is_implementation,
    is_review,
)

WRITE_TOOLS = {ToolKind.EDIT, ToolKind.DELETE, ToolKind.MOVE, ToolKind.EXECUTE}


def test_one_envelope_per_job_kind() -> None:
    assert set(ENVELOPES) == set(JobKind)
    assert all(kind == env.job_kind for kind, env in ENVELOPES.items())


def test_governed_change_envelopes_are_structured_labelled_offline_fresh_and_memoryless() -> None:
    governed = [env for env in ENVELOPES.values() if env.envelope_class is EnvelopeClass.GOVERNED_CHANGE]
    assert {e.job_kind for e in governed} == {
        JobKind.CHANGE_PLANNING,
        JobKind.CHANGE_IMPLEMENTATION,
        JobKind.CHANGE_REVIEW,
    }
    for env in governed:
        assert env.output_contract.format is OutputFormat.STRUCTURED
        assert env.output_contract.json_schema
        assert CAP_STRUCTURED_OUTPUT in env.required_capabilities
        assert env.required_labels == {"domain": "code"}
        assert env.network is NetworkAccess.DISABLED
        assert env.session_policies == [SessionPolicy.FRESH]
        assert env.memory is MemoryAccess.FORBIDDEN


def test_only_implementation_envelopes_allow_writes() -> None:
    for kind, env in ENVELOPES.items():
        writes = env.filesystem is FilesystemAccess.WRITE or bool(WRITE_TOOLS & set(env.max_tools))
        assert writes == is_implementation(kind), kind


def test_review_envelopes_add_diff_review_and_forbid_writes() -> None:
    reviews = [k for k in ENVELOPES if is_review(k)]
    assert reviews == [JobKind.REVIEW_PROBE, JobKind.CHANGE_REVIEW]
    for kind in reviews:
        env = ENVELOPES[kind]
        assert CAP_DIFF_REVIEW in env.required_capabilities
        assert env.filesystem is FilesystemAccess.READ
        assert not WRITE_TOOLS & set(env.max_tools)


def test_no_envelope_offers_network_fetch_tools() -> None:
    assert all(ToolKind.FETCH not in env.max_tools for env in ENVELOPES.values())
    assert all(env.network is NetworkAccess.DISABLED for env in ENVELOPES.values())


def test_get_envelope_returns_a_copy_and_refuses_unknown_kinds() -> None:
    copy = get_envelope("change-review")
    assert copy is not None
    copy.max_tools.append(ToolKind.EDIT)
    assert ToolKind.EDIT not in ENVELOPES[JobKind.CHANGE_REVIEW].max_tools
    assert get_envelope("deploy-production") is None


def test_hash_changes_with_content() -> None:
    env = ENVELOPES[JobKind.CONNECTION_TEST]
    changed = env.model_copy(update={"filesystem": FilesystemAccess.READ})
    assert envelope_hash(env).startswith("sha256:")
    assert envelope_hash(env) != envelope_hash(changed)
    assert envelope_hash(env) == envelope_hash(env.model_copy(deep=True))


def test_governed_helper_matches_class() -> None:
    assert [k for k in ENVELOPES if is_governed(k)] == [
        JobKind.CHANGE_PLANNING,
        JobKind.CHANGE_IMPLEMENTATION,
        JobKind.CHANGE_REVIEW,
    ]

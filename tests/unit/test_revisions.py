"""Profile revisions: stable names and hashes, full snapshots, pruning that keeps what jobs use."""

from __future__ import annotations

from typing import Any

from helmhive.api.profile import ProfileSpec
from helmhive.policy.envelopes import get_envelope
from helmhive.policy.profiles.narrowing import decide_profile
from helmhive.policy.profiles.revisions import (
    build_profile_revision,
    decide_revision_pruning,
    profile_hash,
    revision_name,
)

SPEC = ProfileSpec.model_validate(
    {
        "envelope": "review-probe",
        "purpose": "Review.",
        "instructions": "Look for bugs.",
        "providerMappings": [{"provider": "anthropic"}],
    }
)
PROFILE = {"metadata": {"name": "quick-review", "namespace": "team-a", "uid": "uid-1"}}


def test_hash_is_stable_and_changes_with_content() -> None:
    same = ProfileSpec.model_validate(SPEC.to_wire())
    other = SPEC.model_copy(update={"instructions": "Be brief."})
    assert profile_hash(SPEC) == profile_hash(same)
    assert profile_hash(SPEC) != profile_hash(other)
    assert revision_name("quick-review", profile_hash(SPEC)) == "quick-review-" + profile_hash(SPEC)[7:17]
    assert len(revision_name("x" * 300, profile_hash(SPEC))) <= 253


def test_revision_holds_the_full_snapshot_and_is_owned_by_the_profile() -> None:
    effective = decide_profile(profile=SPEC, envelope=get_envelope(SPEC.envelope)).effective
    assert effective is not None
    rev = build_profile_revision(profile=PROFILE, spec=SPEC, effective=effective, number=3)
    assert rev["revision"] == 3
    assert rev["data"]["spec"]["instructions"] == "Look for bugs."
    assert rev["data"]["effective"]["filesystem"] == "read"
    assert rev["data"]["hash"] == profile_hash(SPEC)
    owner = rev["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Profile", "quick-review", "uid-1")
    assert rev["metadata"]["labels"]["helmhive.dev/profile"] == "quick-review"


def _revs(count: int) -> list[dict[str, Any]]:
    return [{"metadata": {"name": f"r{i}"}, "revision": i} for i in range(1, count + 1)]


def test_pruning_keeps_the_newest_the_current_and_the_referenced() -> None:
    assert decide_revision_pruning(revisions=_revs(5), keep=2, current="r5", referenced=set()) == ["r1", "r2", "r3"]
    assert decide_revision_pruning(revisions=_revs(5), keep=2, current="r5", referenced={"r1"}) == ["r2", "r3"]
    assert decide_revision_pruning(revisions=_revs(5), keep=2, current="r2", referenced=set()) == ["r1", "r3"]
    assert decide_revision_pruning(revisions=_revs(3), keep=10, current="r3", referenced=set()) == []
    assert decide_revision_pruning(revisions=_revs(3), keep=0, current="r3", referenced=set()) == ["r1", "r2"]

"""A workspace is Ready only when every active profile exists, is Valid and fits its job kind."""

from __future__ import annotations

from typing import Any

from helmhive.api.memory import WorkspaceSpec
from helmhive.policy.workspaces import decide_workspace

SPEC = WorkspaceSpec.model_validate(
    {
        "repository": {"url": "https://example.com/r.git"},
        "profiles": [
            {"jobKind": "connection-test", "profile": "check"},
            {"jobKind": "review-probe", "profile": "review"},
        ],
    }
)


def _profile(envelope: str, valid: str | None) -> dict[str, Any]:
    conditions = [{"type": "Valid", "status": valid}] if valid else []
    return {"spec": {"envelope": envelope}, "status": {"conditions": conditions}}


def test_ready_when_every_profile_resolves() -> None:
    verdict = decide_workspace(
        spec=SPEC, profiles={"check": _profile("connection-test", "True"), "review": _profile("review-probe", "True")}
    )
    assert verdict.ready and verdict.unresolved == []


def test_every_unresolved_profile_is_named_with_a_reason() -> None:
    verdict = decide_workspace(spec=SPEC, profiles={"check": _profile("review-probe", "True")})
    assert not verdict.ready
    assert verdict.reason == "ProfileKindMismatch"
    assert verdict.unresolved == ["check", "review"]
    assert "review-probe: profile review does not exist" in verdict.message
    # Each problem names its field path and its reason.
    assert "spec.profiles[1].profile: ProfileNotFound: review-probe: profile review does not exist" in verdict.message
    assert "spec.profiles[0].profile: ProfileKindMismatch: " in verdict.message
    invalid = decide_workspace(
        spec=SPEC, profiles={"check": _profile("connection-test", "False"), "review": _profile("review-probe", None)}
    )
    assert invalid.reason == "ProfileNotValid" and invalid.unresolved == ["check", "review"]

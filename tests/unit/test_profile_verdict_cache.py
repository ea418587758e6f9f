"""The queue step decides a profile once per resourceVersion, and never hands out the kept snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from helmhive.controller.jobs import binding
from helmhive.policy.profiles.revisions import profile_hash


def profile_object(version: str, **spec: Any) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "envelope": "review-probe",
        "purpose": "test",
        "providerMappings": [{"provider": "anthropic", "model": "claude-sonnet-4-5"}],
        **spec,
    }
    return {"metadata": {"namespace": "team", "name": "p", "resourceVersion": version}, "spec": wire}


def test_a_profile_is_parsed_once_per_resource_version(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    real = binding.decide_profile_body

    def counting(spec: Any) -> Any:
        calls.append(dict(spec))
        return real(spec)

    monkeypatch.setattr(binding, "decide_profile_body", counting)
    monkeypatch.setattr(binding, "_VERDICTS", type(binding._VERDICTS)())
    first = binding._profile_verdict(profile_object("7"))
    again = binding._profile_verdict(profile_object("7"))
    assert len(calls) == 1 and again == first
    assert first[0] is not None and first[3] == profile_hash(first[0])
    changed = binding._profile_verdict(profile_object("8", purpose="changed"))
    assert len(calls) == 2 and changed[3] != first[3]


def test_an_invalid_profile_is_remembered_as_invalid_with_its_violations() -> None:
    parsed, invalid, snapshot, digest = binding._profile_verdict(profile_object("9", envelope="no-such-envelope"))
    assert parsed is None and snapshot is None and digest == ""
    assert "spec.envelope" in invalid


def test_an_object_without_a_resource_version_is_never_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binding, "_VERDICTS", type(binding._VERDICTS)())
    binding._profile_verdict(profile_object(""))
    assert len(binding._VERDICTS) == 0

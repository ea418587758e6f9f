"""A job's ``status.profile`` parses to the same binding whether or not its snapshot was seen before.

The router parses the binding of every job it decides; a burst carries one revision's snapshot
thousands of times, so a snapshot equal to one already parsed for its (name, revision, hash) is
not validated again. These tests pin that the shortcut never changes what a job reads: an equal
snapshot gives an equal binding, and a different or invalid snapshot under the same key is
parsed (or refused) on its own.
"""

from __future__ import annotations

import copy
from typing import Any

from routing_builders import binding, mapping

from helmhive.api.job import ProfileBinding
from helmhive.policy.agentjob.life import parse_agent_job


def job_with(profile: dict[str, Any], name: str = "j") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team", "resourceVersion": "7"},
        "spec": {"jobKind": "implementation-probe", "workspace": "w", "request": {"title": "t", "prompt": "p"}},
        "status": {"profile": profile},
    }


def wire(**changes: Any) -> dict[str, Any]:
    bound = binding(mapping("anthropic", "sonnet", "haiku"), capabilities=["diff-review"], name="memo-test")
    return {**bound.to_wire(), **changes}


def test_an_equal_snapshot_gives_an_equal_binding_each_time() -> None:
    raw = wire()
    fresh = ProfileBinding.model_validate(raw)
    first = parse_agent_job(job_with(copy.deepcopy(raw), "a")).binding
    second = parse_agent_job(job_with(copy.deepcopy(raw), "b")).binding
    assert first == fresh and second == fresh
    # Another job of the same revision, bound at another time: its own boundAt.
    later = parse_agent_job(job_with(wire(boundAt="2031-01-01T00:00:00Z"), "c")).binding
    assert later is not None and later.bound_at.year == 2031 and later.snapshot == fresh.snapshot


def test_a_different_snapshot_under_the_same_revision_is_parsed_on_its_own() -> None:
    raw = wire()
    assert parse_agent_job(job_with(raw)).binding is not None  # now kept
    changed = copy.deepcopy(raw)
    changed["snapshot"]["requiredCapabilities"] = ["structured-output"]
    parsed = parse_agent_job(job_with(changed)).binding
    assert parsed is not None and parsed.snapshot.required_capabilities == ["structured-output"]
    broken = copy.deepcopy(raw)
    broken["snapshot"]["providerMappings"] = "not a list"
    assert parse_agent_job(job_with(broken)).binding is None
    # The kept snapshot was not touched by the others.
    again = parse_agent_job(job_with(copy.deepcopy(raw))).binding
    assert again is not None and again.snapshot.required_capabilities == ["diff-review"]

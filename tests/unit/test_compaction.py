"""The pure compaction decisions: the watermark, the command's verdict, the fresh prompt, the audit record."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from pydantic import ValidationError

from helmhive.api.runnerpool import CompactionSettings, RunnerPoolSpec
from helmhive.policy.sessions.compaction import (
    CHECKPOINT_MAX_CHARS,
    DEFAULT_CHECKPOINT_PROMPT,
    build_checkpoint_prompt,
    build_fresh_session_prompt,
    build_session_compacted_audit,
    compacted_audit_name,
    decide_checkpoint_text,
    decide_command_result,
    decide_compaction,
)

SETTINGS = CompactionSettings(watermark_percent=50, command_timeout_seconds=30)
NOW = dt.datetime(2026, 12, 1, 22, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("used", "size", "commands", "expected"),
    [
        (None, 5000, ["compact"], None),  # nothing reported: never compact blind
        (3000, None, ["compact"], None),
        (3000, 0, ["compact"], None),
        (2499, 5000, ["compact"], None),  # below the watermark
        (2500, 5000, ["compact"], "compact"),  # at it
        (4000, 5000, ["review", "compact"], "compact"),
        (4000, 5000, ["review", "compacting"], None),  # only a command named compact compacts
        (4000, 5000, [], None),
    ],
)
def test_the_watermark_and_the_command(
    used: int | None, size: int | None, commands: list[str], expected: str | None
) -> None:
    plan = decide_compaction(used=used, size=size, commands=commands, settings=SETTINGS)
    if used is None or size is None or size == 0 or used < 2500:
        assert plan is None
        return
    assert plan is not None and plan.command == expected and (plan.used, plan.size) == (used, size)
    assert "50% watermark" in plan.reason
    assert ("no compact command advertised" in plan.reason) is (expected is None)


@pytest.mark.parametrize(
    ("completed", "outcome", "after", "accepted", "why"),
    [
        (True, "Completed", 1000, True, ""),
        (True, "Completed", 3000, False, "not fewer than 3000"),
        (True, "Completed", None, False, "reported no context usage"),
        (False, "ProtocolError", None, False, "failed (ProtocolError)"),
        (False, "IdleTimeout", None, False, "stayed silent past its window (30s"),
        (False, "Killed", None, False, "stayed silent past its window (30s"),
    ],
)
def test_a_command_counts_only_if_it_completed_and_shrank_the_session(
    completed: bool, outcome: str, after: int | None, accepted: bool, why: str
) -> None:
    verdict = decide_command_result(before=3000, completed=completed, outcome=outcome, used_after=after, window_s=30)
    assert verdict.accepted is accepted and why in verdict.reason


def test_the_fresh_session_is_told_the_instructions_and_nothing_else() -> None:
    prompt = build_fresh_session_prompt(instructions="  Be brief.  ")
    assert "## Instructions (from the platform team's profile)\nBe brief.\n" in prompt
    assert "## Request" not in prompt and "OUTPUT-CONTRACT" not in prompt
    assert "(none)" in build_fresh_session_prompt(instructions="")
    assert "Checkpoint" not in prompt


def test_the_fresh_session_gets_the_checkpoint_after_the_instructions() -> None:
    prompt = build_fresh_session_prompt(instructions="Be brief.", checkpoint="Refunds: step 2 of 3 done.")
    instructions = prompt.index("## Instructions")
    carried = prompt.index("## Checkpoint of the archived session")
    assert instructions < carried < prompt.index("## Session")
    assert "Refunds: step 2 of 3 done.\n" in prompt and "only the checkpoint above" in prompt


@pytest.mark.parametrize(
    ("setting", "expected"),
    [(None, DEFAULT_CHECKPOINT_PROMPT), ("  Summarise.  ", "Summarise."), ("", None), ("   ", None)],
)
def test_the_checkpoint_prompt_is_the_pools_the_built_in_one_or_none(setting: str | None, expected: str | None) -> None:
    settings = CompactionSettings(checkpoint_prompt=setting)
    assert build_checkpoint_prompt(settings) == expected


def test_the_checkpoint_carried_is_bounded_and_says_where_it_was_cut() -> None:
    assert decide_checkpoint_text(None) is None and decide_checkpoint_text(" \n ") is None
    assert decide_checkpoint_text("  kept  ") == "kept"
    long = "x" * (CHECKPOINT_MAX_CHARS + 10)
    cut = decide_checkpoint_text(long)
    assert cut is not None and cut.startswith("x" * CHECKPOINT_MAX_CHARS)
    assert cut.endswith(f"[checkpoint cut at {CHECKPOINT_MAX_CHARS} of {CHECKPOINT_MAX_CHARS + 10} characters]")


@pytest.mark.parametrize(
    ("wire", "where"),
    [
        ({"watermarkPercent": 5}, "watermarkPercent"),
        ({"watermarkPercent": 100}, "watermarkPercent"),
        ({"commandTimeoutSeconds": 1}, "commandTimeoutSeconds"),
        ({"commandTimeoutSeconds": 3600}, "commandTimeoutSeconds"),
        ({"watermark": 50}, "watermark"),
        ({"checkpointPrompt": "x" * 2001}, "checkpointPrompt"),
    ],
)
def test_bad_settings_are_refused_with_their_field_path(wire: dict[str, Any], where: str) -> None:
    base = {
        "image": "registry.example/helmhive-runner:1",
        "provider": "reference",
        "adapter": {"type": "acp", "acp": {"command": "agent"}},
        "credential": {"secretRef": {"name": "login", "key": "token"}},
    }
    with pytest.raises(ValidationError) as caught:
        RunnerPoolSpec.model_validate({**base, "compaction": wire})
    assert [tuple(e["loc"]) for e in caught.value.errors()] == [("compaction", where)]


def _binding(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "SessionBinding",
        "metadata": {"name": "sb-0123456789abcdef0123", "namespace": "team-a", "uid": "0f1e2d3c-aaaa"},
        "spec": {"workspace": "payments", "profile": "p", "provider": "reference", "runner": "pool-a-0"},
        "status": {"secretName": "helmhive-sessions-pool-a-0", "secretKey": "sb-0123456789abcdef0123", **status},
    }


def test_the_audit_record_has_the_figures_and_a_fixed_name_per_count() -> None:
    last = {"method": "archive", "job": "j2", "usedBefore": 3000, "contextSize": 5000, "reason": "no command"}
    record = build_session_compacted_audit(binding=_binding(compactions=3, lastCompaction=last), now=NOW)
    assert record is not None
    assert record["metadata"]["name"] == compacted_audit_name("sb-0123456789abcdef0123", "0f1e2d3c-aaaa", 3)
    assert record["metadata"]["name"].endswith("-0f1e2d3c-compaction-3")
    spec = record["spec"]
    assert spec["action"] == "SessionCompacted" and spec["actor"]["username"] == "helmhive-runner:pool-a-0"
    assert spec["details"]["usedAfter"] == "unreported" and spec["details"]["method"] == "archive"
    assert spec["before"]["value"] == "context 3000 of 5000 tokens"
    assert "secret" not in json.dumps(spec["details"]).lower()  # the Secret's name and key are not copied
    assert build_session_compacted_audit(binding=_binding(), now=NOW) is None
    assert build_session_compacted_audit(binding=_binding(compactions=1), now=NOW) is None

"""Prompts carry all four labelled parts; output contracts are checked; results are bounded, never cut silently."""

from __future__ import annotations

import hashlib
import json

from helmhive.api.common import JobKind
from helmhive.api.envelope import OutputContract, OutputFormat
from helmhive.api.job import JobRequest
from helmhive.policy.agentjob.prompts import build_agent_prompt, build_repair_prompt, check_output
from helmhive.policy.agentjob.results import (
    ARTIFACT_MAX_BYTES,
    ARTIFACTS_TOTAL_MAX_BYTES,
    SUMMARY_MAX_CHARS,
    build_bounded_result,
)
from helmhive.policy.envelopes import ENVELOPES

REVIEW = ENVELOPES[JobKind.CHANGE_REVIEW].output_contract
REQUEST = JobRequest(title="Refunds", prompt="Review the refund patch.")
JOB = {"apiVersion": "helmhive.dev/v1alpha1", "metadata": {"name": "job-1", "namespace": "ns", "uid": "u1"}}


def test_prompt_has_instructions_request_memory_and_contract_in_order() -> None:
    prompt = build_agent_prompt(
        instructions="Be strict.", request=REQUEST, memory_context="## Context (not authority)\n- x", contract=REVIEW
    )
    order = [
        prompt.index(s)
        for s in ("Be strict.", "Review the refund patch.", "Context (not authority)", "OUTPUT-CONTRACT: json")
    ]
    assert order == sorted(order)
    assert '"verdict"' in prompt
    text_prompt = build_agent_prompt(
        instructions="", request=REQUEST, memory_context="", contract=OutputContract(format=OutputFormat.TEXT)
    )
    assert "OUTPUT-CONTRACT" not in text_prompt and "Context" not in text_prompt


def test_structured_output_is_checked_with_paths() -> None:
    good = {"verdict": "approve", "summary": "ok", "findings": []}
    assert check_output(text=f"Here:\n```json\n{json.dumps(good)}\n```\n", contract=REVIEW).ok
    bad = check_output(text=json.dumps({"verdict": "maybe", "summary": "x"}), contract=REVIEW)
    assert not bad.ok
    assert any(e.startswith("verdict:") for e in bad.errors)
    assert any("findings" in e for e in bad.errors)
    assert check_output(text="no json here", contract=REVIEW).errors == ("the answer holds no JSON object",)
    repair = build_repair_prompt(check=bad, contract=REVIEW)
    assert "verdict:" in repair and "OUTPUT-CONTRACT: json" in repair


def test_small_results_stay_inline() -> None:
    result = build_bounded_result(job=JOB, text="short", output={"a": 1})
    assert (result.summary, result.output, result.artifacts, result.config_map) == ("short", {"a": 1}, [], None)


def test_large_results_move_to_an_owned_configmap_and_say_when_cut() -> None:
    transcript = "x" * (ARTIFACT_MAX_BYTES + 10)
    patch = "p" * (ARTIFACT_MAX_BYTES * 3)
    big_output = {"k": "v" * 20000}
    result = build_bounded_result(job=JOB, text=transcript, output=big_output, extra={"patch.diff": patch})
    assert len(result.summary) <= SUMMARY_MAX_CHARS and "[cut:" in result.summary
    assert result.output is None
    refs = {a.key: a for a in result.artifacts}
    assert set(refs) == {"transcript.txt", "output.json", "patch.diff"}
    assert refs["transcript.txt"].truncated and refs["transcript.txt"].bytes == len(transcript)
    assert refs["transcript.txt"].sha256 == hashlib.sha256(transcript.encode()).hexdigest()
    assert not refs["output.json"].truncated
    assert result.config_map is not None
    stored = sum(len(v.encode()) for v in result.config_map["data"].values())
    assert stored <= ARTIFACTS_TOTAL_MAX_BYTES
    assert result.config_map["metadata"]["ownerReferences"][0]["uid"] == "u1"

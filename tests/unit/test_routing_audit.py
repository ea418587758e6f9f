"""The audit records of a routing decision: deterministic names, what they hold, and when there are none."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from helmhive.policy.routing_audit import audit_name, build_routing_audits

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def job(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "review-1", "namespace": "team", "uid": "0123456789abcdef"},
        "spec": {"workspace": "shop", "jobKind": "review-probe"},
        "status": {"profile": {"name": "quick", "revision": "quick-abc"}, **status},
    }


def routed(status: str, reason: str, message: str = "why") -> list[dict[str, Any]]:
    return [{"type": "Routed", "status": status, "reason": reason, "message": message}]


ASSIGNMENT = {
    "runner": "claude-0",
    "runnerNamespace": "runners",
    "pool": "claude",
    "provider": "anthropic",
    "model": "sonnet",
    "modelSource": "mapping",
    "reasoningEffort": "high",
    "mappingIndex": 0,
    "memoryIds": ["cents", "retries"],
    "credentialGeneration": 3,
}


def test_an_assignment_gives_a_routed_and_a_memory_record_with_fixed_names() -> None:
    records = build_routing_audits(
        job=job(
            {
                "assignment": ASSIGNMENT,
                "routing": {"avoidedProvider": "openai"},
                "conditions": routed("True", "Assigned", "runner claude-0 runs it"),
            }
        ),
        now=NOW,
    )
    assert [r["metadata"]["name"] for r in records] == [
        "agentjob-review-1-01234567-routed",
        "agentjob-review-1-01234567-memory",
    ]
    assert all("generateName" not in r["metadata"] for r in records)
    routed_record, memory = (r["spec"] for r in records)
    assert routed_record["action"] == "JobRouted"
    assert routed_record["message"] == "runner claude-0 runs it"
    assert routed_record["after"]["value"] == "anthropic/sonnet"
    assert routed_record["details"] == {
        "runner": "claude-0",
        "runnerNamespace": "runners",
        "pool": "claude",
        "provider": "anthropic",
        "model": "sonnet",
        "modelSource": "mapping",
        "mappingIndex": "0",
        "credentialGeneration": "3",
        "profileRevision": "quick-abc",
        "memoryCount": "2",
        "reasoningEffort": "high",
        "avoidedProvider": "openai",
    }
    assert memory["action"] == "MemoryInjected"
    assert memory["details"] == {"memoryIds": "cents,retries", "workspace": "shop"}


def test_a_run_after_a_lost_runner_gets_records_of_its_own() -> None:
    """A re-queued job (``status.attempts`` 1) routed again: new names, so the first run's stay."""
    first = build_routing_audits(job=job({"assignment": ASSIGNMENT, "conditions": routed("True", "Assigned")}), now=NOW)
    again = build_routing_audits(
        job=job(
            {
                "attempts": 1,
                "assignment": {**ASSIGNMENT, "runner": "claude-1"},
                "conditions": routed("True", "Assigned"),
            }
        ),
        now=NOW,
    )
    assert [r["metadata"]["name"] for r in again] == [
        "agentjob-review-1-01234567-routed-1",
        "agentjob-review-1-01234567-memory-1",
    ]
    assert {r["metadata"]["name"] for r in first}.isdisjoint(r["metadata"]["name"] for r in again)
    assert again[0]["spec"]["details"]["runner"] == "claude-1"
    assert "agentjob-review-1-01234567-memory-run-1" in again[1]["spec"]["message"]
    assert audit_name("review-1", "0123456789abcdef", "routed", 0) == "agentjob-review-1-01234567-routed"


def test_no_memory_record_without_injected_memory() -> None:
    records = build_routing_audits(
        job=job(
            {"assignment": {**ASSIGNMENT, "memoryIds": []}, "routing": {}, "conditions": routed("True", "Assigned")}
        ),
        now=NOW,
    )
    assert [r["spec"]["action"] for r in records] == ["JobRouted"]
    assert records[0]["spec"]["details"]["memoryCount"] == "0"


def test_a_failed_decision_is_audited_and_a_waiting_one_is_not() -> None:
    failed = build_routing_audits(
        job=job({"routing": {"consideredRunners": 4}, "conditions": routed("False", "ModelNotAdvertised")}), now=NOW
    )
    assert [r["metadata"]["name"] for r in failed] == [audit_name("review-1", "0123456789abcdef", "routing-failed")]
    assert failed[0]["spec"]["details"] == {"reason": "ModelNotAdvertised", "consideredRunners": "4"}
    waiting = job({"routing": {"consideredRunners": 4}, "conditions": routed("False", "WaitingForCapacity")})
    assert build_routing_audits(job=waiting, now=NOW) == []
    # A job that failed at queue time (no routing decision) is not a routing record.
    assert build_routing_audits(job=job({"conditions": routed("False", "ProfileNotFound")}), now=NOW) == []


def test_records_hold_no_instruction_or_memory_text() -> None:
    body = job({"assignment": ASSIGNMENT, "routing": {}, "conditions": routed("True", "Assigned")})
    body["status"]["profile"]["snapshot"] = {"instructions": "CANARY-INSTRUCTIONS"}
    body["spec"]["request"] = {"prompt": "CANARY-PROMPT"}
    text = json.dumps(build_routing_audits(job=body, now=NOW))
    assert "CANARY" not in text

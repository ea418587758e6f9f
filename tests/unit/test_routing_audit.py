"""The audit trail of routing decisions: what each entry holds, when there is none, and how entries are batched."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from helmhive.api.audit import AuditRecordSpec
from helmhive.policy.audit.routing import (
    MAX_DECISIONS,
    audit_name,
    build_routing_batch,
    build_routing_decisions,
    decide_batches,
    decide_missing_entries,
    decide_recovery_selector,
    decision_key,
    held_decision_keys,
    iter_routing_decisions,
    job_audit_label,
    routing_hour,
)

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def job(status: dict[str, Any], *, name: str = "review-1", uid: str = "0123456789abcdef") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team", "uid": uid},
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


def test_an_assignment_gives_a_routed_and_a_memory_entry_with_every_field() -> None:
    entries = build_routing_decisions(
        job=job(
            {
                "assignment": ASSIGNMENT,
                "routing": {"avoidedProvider": "openai", "decidedAt": "2026-06-01T11:59:58Z"},
                "conditions": routed("True", "Assigned", "runner claude-0 runs it"),
            }
        ),
        now=NOW,
    )
    routed_entry, memory = entries
    assert routed_entry["action"] == "JobRouted"
    assert routed_entry["object"] == {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "namespace": "team",
        "name": "review-1",
        "uid": "0123456789abcdef",
    }
    assert (routed_entry["attempt"], routed_entry["time"]) == (0, "2026-06-01T11:59:58Z")
    assert routed_entry["message"] == "runner claude-0 runs it"
    assert routed_entry["after"]["value"] == "anthropic/sonnet"
    assert routed_entry["details"] == {
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
    assert memory["after"] == {"value": "2 records selected at queue time"}
    assert memory["details"] == {"memoryIds": "cents,retries", "workspace": "shop"}
    assert "agentjob-review-1-01234567-memory-run" in memory["message"]


def test_a_run_after_a_lost_runner_is_an_entry_of_its_own() -> None:
    """A re-queued job (``status.attempts`` 1) routed again: another key, so the first run's entry stays."""
    first = build_routing_decisions(
        job=job({"assignment": ASSIGNMENT, "conditions": routed("True", "Assigned")}), now=NOW
    )
    again = build_routing_decisions(
        job=job(
            {
                "attempts": 1,
                "assignment": {**ASSIGNMENT, "runner": "claude-1"},
                "conditions": routed("True", "Assigned"),
            }
        ),
        now=NOW,
    )
    assert [decision_key(e) for e in again] == [
        ("0123456789abcdef", 1, "JobRouted"),
        ("0123456789abcdef", 1, "MemoryInjected"),
    ]
    assert {decision_key(e) for e in first}.isdisjoint(decision_key(e) for e in again)
    assert again[0]["details"]["runner"] == "claude-1"
    assert "agentjob-review-1-01234567-memory-run-1" in again[1]["message"]
    assert audit_name("review-1", "0123456789abcdef", "routed", 0) == "agentjob-review-1-01234567-routed"


def test_no_memory_entry_without_injected_memory() -> None:
    entries = build_routing_decisions(
        job=job(
            {"assignment": {**ASSIGNMENT, "memoryIds": []}, "routing": {}, "conditions": routed("True", "Assigned")}
        ),
        now=NOW,
    )
    assert [e["action"] for e in entries] == ["JobRouted"]
    assert entries[0]["details"]["memoryCount"] == "0"


def test_a_failed_decision_is_audited_and_a_waiting_one_is_not() -> None:
    failed = build_routing_decisions(
        job=job({"routing": {"consideredRunners": 4}, "conditions": routed("False", "ModelNotAdvertised")}), now=NOW
    )
    assert [decision_key(e) for e in failed] == [("0123456789abcdef", 0, "JobRoutingFailed")]
    assert failed[0]["details"] == {"reason": "ModelNotAdvertised", "consideredRunners": "4"}
    waiting = job({"routing": {"consideredRunners": 4}, "conditions": routed("False", "WaitingForCapacity")})
    assert build_routing_decisions(job=waiting, now=NOW) == []
    # A job that failed at queue time (no routing decision) is not a routing record.
    assert build_routing_decisions(job=job({"conditions": routed("False", "ProfileNotFound")}), now=NOW) == []


def test_entries_hold_no_instruction_or_memory_text() -> None:
    body = job({"assignment": ASSIGNMENT, "routing": {}, "conditions": routed("True", "Assigned")})
    body["status"]["profile"]["snapshot"] = {"instructions": "CANARY-INSTRUCTIONS"}
    body["spec"]["request"] = {"prompt": "CANARY-PROMPT"}
    entries = build_routing_decisions(job=body, now=NOW)
    text = json.dumps(build_routing_batch(namespace="team", entries=entries, now=NOW))
    assert "CANARY" not in text


def _assigned(i: int) -> list[dict[str, Any]]:
    body = job(
        {"assignment": ASSIGNMENT, "routing": {}, "conditions": routed("True", "Assigned")},
        name=f"job-{i:03d}",
        uid=f"{i:08d}-aaaa-bbbb-cccc-{i:012d}",
    )
    return build_routing_decisions(job=body, now=NOW)


def test_a_batch_labels_every_job_by_uid_and_is_a_valid_append_only_record() -> None:
    entries = [e for i in range(3) for e in _assigned(i)]
    record = build_routing_batch(namespace="team", entries=entries, now=NOW)
    spec = AuditRecordSpec.model_validate(record["spec"])  # the CRD's own model accepts it
    assert spec.action == "RoutingDecisions" and len(spec.decisions) == 6
    assert record["spec"]["object"] == {"apiVersion": "v1", "kind": "Namespace", "name": "team"}
    assert record["metadata"]["namespace"] == "team"
    labels = record["metadata"]["labels"]
    assert labels["helmhive.dev/audit-action"] == "RoutingDecisions"
    for i in range(3):
        key = job_audit_label(f"{i:08d}-aaaa-bbbb-cccc-{i:012d}")
        assert key.startswith("job.audit.helmhive.dev/") and len(key.split("/", 1)[1]) <= 63
        assert labels[key] == "JobRouted"
    # The name is a function of the entries' keys only: a retried create is a 409, not a second record.
    again = build_routing_batch(namespace="team", entries=list(reversed(entries)), now=NOW.replace(hour=13))
    assert again["metadata"]["name"] == record["metadata"]["name"]
    other = build_routing_batch(namespace="team", entries=entries[:4], now=NOW)
    assert other["metadata"]["name"] != record["metadata"]["name"]
    assert len(record["metadata"]["name"]) <= 63 and "generateName" not in record["metadata"]


def test_batches_are_bounded_by_count_and_by_bytes() -> None:
    entries = [e for i in range(130) for e in _assigned(i)]  # 260 entries
    by_count = decide_batches(entries)
    assert [len(b) for b in by_count] == [MAX_DECISIONS, MAX_DECISIONS, 60]
    assert [e for b in by_count for e in b] == entries  # in order, nothing lost or repeated
    size = len(json.dumps(entries[0]))
    by_bytes = decide_batches(entries, max_bytes=10 * (size + 64))
    assert all(len(b) <= 10 for b in by_bytes) and sum(len(b) for b in by_bytes) == 260
    assert decide_batches([]) == []


def test_iterating_decisions_flattens_batches_and_passes_other_records_through() -> None:
    entries = _assigned(1) + build_routing_decisions(
        job=job({"routing": {"consideredRunners": 2}, "conditions": routed("False", "NoEligibleMapping")}, uid="u-2"),
        now=NOW,
    )
    batch = build_routing_batch(namespace="team", entries=entries, now=NOW)
    other = {"metadata": {"name": "x"}, "spec": {"action": "RunnerRegistered", "object": {"name": "r"}}}
    flat = list(iter_routing_decisions([batch, other]))
    assert [d["spec"]["action"] for d in flat] == [
        "JobRouted",
        "MemoryInjected",
        "JobRoutingFailed",
        "RunnerRegistered",
    ]
    assert flat[0]["spec"]["object"]["name"] == "job-001"
    assert flat[0]["spec"]["actor"] == {"username": "helmhive-operator", "groups": []}
    assert flat[0]["metadata"]["name"] == batch["metadata"]["name"]
    assert flat[3] == other


def test_a_batch_carries_the_utc_hour_it_was_built_in() -> None:
    record = build_routing_batch(namespace="team", entries=_assigned(1), now=NOW.replace(minute=59))
    assert record["metadata"]["labels"]["helmhive.dev/audit-hour"] == "2026060112"
    east = dt.timezone(dt.timedelta(hours=2))
    assert routing_hour(dt.datetime(2026, 6, 1, 1, 30, tzinfo=east)) == "2026053123"  # UTC, whatever the zone


def test_recovery_selects_the_batches_of_the_hours_its_window_spans() -> None:
    selector = decide_recovery_selector(since=NOW - dt.timedelta(minutes=15), until=NOW + dt.timedelta(minutes=5))
    assert selector == "helmhive.dev/audit-action=RoutingDecisions,helmhive.dev/audit-hour in (2026060111,2026060112)"
    one = decide_recovery_selector(since=NOW.replace(minute=10), until=NOW.replace(minute=50))
    assert one.endswith("helmhive.dev/audit-hour in (2026060112)")
    # A window of days lists every batch of the namespace rather than a selector of hundreds of values.
    days = decide_recovery_selector(since=NOW - dt.timedelta(days=3), until=NOW)
    assert days == "helmhive.dev/audit-action=RoutingDecisions"


def test_the_recovery_diff_keeps_only_the_decisions_no_listed_batch_holds() -> None:
    recorded = _assigned(1) + _assigned(2)  # routed and memory entries for two jobs
    batch = build_routing_batch(namespace="team", entries=recorded, now=NOW)
    other = {"metadata": {"name": "x"}, "spec": {"action": "RunnerRegistered", "object": {"uid": "u"}}}
    held = held_decision_keys([batch, other])
    assert held == {decision_key(e) for e in recorded}  # other records hold no decision
    cut_off = _assigned(3)
    rerun = build_routing_decisions(
        job=job({"attempts": 1, "assignment": ASSIGNMENT, "routing": {}, "conditions": routed("True", "Assigned")},
                uid=recorded[0]["object"]["uid"]),
        now=NOW,
    )  # fmt: skip
    assert decide_missing_entries(_assigned(1) + cut_off, held) == cut_off
    assert decide_missing_entries(rerun, held) == rerun  # the same job's next run is its own decision
    assert decide_missing_entries(recorded, held) == []

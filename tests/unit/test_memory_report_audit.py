"""The run-time ``MemoryInjected`` record: what the runner reported it injected and dropped, per attempt."""

from __future__ import annotations

import datetime as dt
from typing import Any

import jsonschema

from helmhive.api.crdgen import build_offline_schema
from helmhive.api.job import AgentJobStatus
from helmhive.api.kinds import kind_by_name
from helmhive.policy.audit.routing import build_routing_decisions
from helmhive.policy.memory.injected import build_memory_report_audit, memory_report_audit_name

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
REPORT = {
    "injected": ["cents"],
    "dropped": [{"name": "retries", "reason": "NotFound"}, {"name": "old-rule", "reason": "Expired"}],
}


def job(result: dict[str, Any] | None, *, attempts: int = 0) -> dict[str, Any]:
    status: dict[str, Any] = {
        "assignment": {"runner": "claude-0", "memoryIds": ["cents", "retries", "old-rule"]},
        "attempts": attempts,
        "conditions": [{"type": "Routed", "status": "True", "reason": "Assigned", "message": "m"}],
    }
    if result is not None:
        status["result"] = result
    return {
        "metadata": {"name": "review-1", "namespace": "team", "uid": "0123456789abcdef"},
        "spec": {"workspace": "shop", "jobKind": "review-probe"},
        "status": status,
    }


def test_the_report_is_a_valid_status_field() -> None:
    status = AgentJobStatus.model_validate({"result": {"outcome": "Started", "memory": REPORT}})
    assert status.result is not None and status.result.memory is not None
    assert [d.reason for d in status.result.memory.dropped] == ["NotFound", "Expired"]


def test_the_run_time_record_says_what_was_injected_and_what_was_dropped_and_why() -> None:
    record = build_memory_report_audit(job=job({"outcome": "Started", "memory": REPORT}), now=NOW)
    assert record is not None
    jsonschema.validate(record, build_offline_schema(kind_by_name("AuditRecord")))
    assert record["metadata"]["name"] == "agentjob-review-1-01234567-memory-run"
    spec = record["spec"]
    assert spec["action"] == "MemoryInjected"
    assert spec["details"] == {
        "injected": "cents",
        "dropped": "retries:NotFound,old-rule:Expired",
        "selected": "cents,retries,old-rule",
        "runner": "claude-0",
        "attempt": "0",
        "workspace": "shop",
    }
    assert spec["after"] == {"value": "1 injected, 2 dropped at run time"}
    assert spec["message"] == (
        "runner claude-0 injected 1 memory record(s) at run time: cents; dropped retries (NotFound), old-rule (Expired)"
    )


def test_each_attempt_has_its_own_record_and_no_report_means_none() -> None:
    again = build_memory_report_audit(job=job({"outcome": "Started", "memory": REPORT}, attempts=1), now=NOW)
    assert again is not None and again["metadata"]["name"] == memory_report_audit_name(
        "review-1", "0123456789abcdef", 1
    )
    assert again["metadata"]["name"].endswith("-memory-run-1")
    assert build_memory_report_audit(job=job(None), now=NOW) is None
    assert build_memory_report_audit(job=job({"outcome": "Started"}), now=NOW) is None
    empty = {"outcome": "Started", "memory": {"injected": [], "dropped": []}}
    assert build_memory_report_audit(job=job(empty), now=NOW) is None


def test_the_queue_time_record_says_it_is_a_selection() -> None:
    routed = job(None)
    routed["status"]["assignment"] = {
        "runner": "claude-0",
        "pool": "claude",
        "provider": "anthropic",
        "model": "sonnet",
        "modelSource": "mapping",
        "mappingIndex": 0,
        "memoryIds": ["cents", "retries"],
    }
    memory = build_routing_decisions(job=routed, now=NOW)[1]
    assert memory["after"] == {"value": "2 records selected at queue time"}
    assert memory["message"].startswith("memory records selected at queue time: cents, retries")
    assert "agentjob-review-1-01234567-memory-run" in memory["message"]

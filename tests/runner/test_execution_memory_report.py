"""The runner reports the memory it actually injected, and what it dropped and why, in the job's status.

Records named at queue time but deleted, expired or switched off by the time the job runs are
dropped; ``status.result.memory`` says so, written by the runner's own pod identity under the
``helmhive-runner-execution`` admission policy (which lets it write only its jobs' status). The
operator turns that report into the run-time ``MemoryInjected`` record
(``tests/operator/test_memory_injected_audit.py``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from helmhive.api.common import JobKind
from helmhive.api.job import MemoryReport
from helmhive.runner.jobs.status import build_running_status

from .execution_harness import ExecutionRig, condition

MEMORY = {"memory": {"enabled": True, "maxSensitivity": "internal"}}
NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def _record(execution: ExecutionRig, name: str, text: str, **extra: Any) -> None:
    spec = {
        "workspace": "payments",
        "scope": {"type": "workspace"},
        "kind": "constraint",
        "text": text,
        "source": {"type": "adr", "url": f"https://git.example.com/adr/{name}"},
        "sensitivity": "internal",
        **extra,
    }
    execution.kube.custom.create_namespaced_custom_object(
        "helmhive.dev",
        "v1alpha1",
        execution.namespace,
        "memoryrecords",
        {"apiVersion": "helmhive.dev/v1alpha1", "kind": "MemoryRecord", "metadata": {"name": name}, "spec": spec},
    )


def test_the_running_status_carries_the_report_and_clears_an_earlier_one() -> None:
    job = {"metadata": {"generation": 1}, "status": {"conditions": []}}
    report = {"injected": ["money"], "dropped": [{"name": "gone", "reason": "NotFound"}]}
    running = build_running_status(job=job, runner="r-0", message="m", session=None, now=NOW, memory=report)
    assert running["result"]["memory"] == report
    MemoryReport.model_validate(running["result"]["memory"])  # the shape the CRD takes
    again = build_running_status(job=job, runner="r-0", message="m", session=None, now=NOW)
    assert again["result"]["memory"] is None  # a merge patch removes an earlier attempt's report


def test_records_dropped_between_routing_and_running_are_reported_as_dropped(execution: ExecutionRig) -> None:
    _record(execution, "money", "Money is integer cents.")
    _record(execution, "gone", "A record deleted after routing chose it.")
    execution.kube.custom.delete_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", execution.namespace, "memoryrecords", "gone"
    )
    _record(execution, "stale", "A record that expired after routing chose it.", expiresAt="2020-01-01T00:00:00Z")
    runner = execution.start_runner()
    execution.create_job(
        "remembering",
        runner=runner,
        kind=JobKind.REVIEW_PROBE,
        prompt="Review the ledger change.",
        profile_spec=MEMORY,
        memory_ids=["money", "gone", "stale"],
    )
    job = execution.wait_finished("remembering")
    assert condition(job, "Succeeded")["status"] == "True", job["status"]  # type: ignore[index]
    assert job["status"]["result"]["memory"] == {
        "injected": ["money"],
        "dropped": [{"name": "gone", "reason": "NotFound"}, {"name": "stale", "reason": "Expired"}],
    }
    prompt = runner.prompts()[-1]["prompt"]
    assert "Money is integer cents." in prompt
    assert "deleted after routing" not in prompt and "expired after routing" not in prompt

    # A job whose assignment names no memory has no report.
    execution.create_job("plain", runner=runner, kind=JobKind.REVIEW_PROBE, profile_spec=MEMORY)
    plain = execution.wait_finished("plain")
    assert "memory" not in plain["status"]["result"]

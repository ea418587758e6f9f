"""Routing decisions are audited in batches, found by job label, and never lost across an operator crash.

The operator starts with a linger of an hour (``HELMHIVE_ROUTING_AUDIT_LINGER_SECONDS``), so its
decisions are written to the jobs' status (the commit point) and then sit in its in-memory queue:
the window between the status write and the batch write, held open on purpose. It is killed
(SIGKILL) there, and restarted with the default linger; recovery must write every decision from
the jobs' status, once. Then jobs routed by the restarted operator show how a normal burst is
recorded: batched, one aggregated ``JobsRouted`` Event per Runner with the count, and no per-job
Normal Event. A second crash, with some decisions recorded and some cut off, shows recovery's
diff against the namespace's listed batches: only the cut-off ones are written, each once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from held_jobs import Fleet, create_profile, job_manifest, list_jobs, make_fleet
from simulated_runner import GROUP, VERSION

from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.policy.audit.routing import iter_routing_decisions, job_audit_label

OPERATOR_ENV = {"HELMHIVE_ROUTING_AUDIT_LINGER_SECONDS": "3600"}
RESTARTED_ENV = {"HELMHIVE_ROUTING_EVENT_INTERVAL_SECONDS": "2"}
FIRST = 8  # routed before the crash
SECOND = 6  # routed by the restarted operator
THIRD = 4  # routed before the second crash, while the first two groups are recorded


@pytest.fixture
def fleet(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> Iterator[Fleet]:
    fleet = make_fleet(kube, service_account_identity, namespace, name="batch", replicas=2, slots=10)
    try:
        create_profile(kube, namespace, "review", "review-probe")
        yield fleet
    finally:
        fleet.stop()


def _batches(kube: Kube, namespace: str, selector: str = "helmhive.dev/audit-action=RoutingDecisions") -> list[Any]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "auditrecords", label_selector=selector
    )["items"]
    return items


def _create(kube: Kube, namespace: str, names: list[str]) -> dict[str, dict[str, Any]]:
    for name in names:
        kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentjobs", job_manifest(name, profile="review", kind="review-probe")
        )

    def assigned() -> dict[str, dict[str, Any]]:
        jobs = {j["metadata"]["name"]: j for j in list_jobs(kube, namespace) if j["metadata"]["name"] in names}
        assert all((j.get("status") or {}).get("assignment") for j in jobs.values()) and len(jobs) == len(names)
        return jobs

    return wait_for(assigned, timeout=120, interval=1, describe=f"{len(names)} jobs assigned")


def _routed_by_label(kube: Kube, namespace: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's JobRouted decisions, found by its uid label alone."""
    records = _batches(kube, namespace, job_audit_label(job["metadata"]["uid"]))
    return [
        d["spec"]
        for d in iter_routing_decisions(records)
        if d["spec"]["action"] == "JobRouted" and d["spec"]["object"]["uid"] == job["metadata"]["uid"]
    ]


def _job_events(kube: Kube, namespace: str, reason: str) -> list[Any]:
    listed = kube.core.list_namespaced_event(namespace, field_selector=f"reason={reason}").items
    return [e for e in listed if e.involved_object.kind == "AgentJob"]


def test_decisions_cut_off_by_a_crash_are_recorded_after_the_restart_and_a_burst_is_batched(
    fleet: Fleet, kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    first = _create(kube, namespace, [f"before-{i}" for i in range(FIRST)])
    # The window is open: every decision is in status, none in a record yet.
    assert _batches(kube, namespace) == []
    operator.kill()
    operator.extra_env = dict(RESTARTED_ENV)
    operator.start()

    def recovered() -> dict[str, list[dict[str, Any]]]:
        found = {name: _routed_by_label(kube, namespace, job) for name, job in first.items()}
        assert all(found.values()), [n for n, d in found.items() if not d]
        return found

    by_job = wait_for(recovered, timeout=120, interval=1, describe="every decision made before the crash recorded")
    for name, decisions in by_job.items():
        assignment = first[name]["status"]["assignment"]
        assert len(decisions) == 1, (name, decisions)  # once, not twice
        (decision,) = decisions
        assert decision["attempt"] == 0 and decision["object"]["name"] == name
        assert decision["actor"]["username"] == "helmhive-operator"
        details = decision["details"]
        assert (details["runner"], details["provider"], details["model"]) == (
            assignment["runner"],
            assignment["provider"],
            assignment["model"],
        )
        assert details["profileRevision"] == first[name]["status"]["profile"]["revision"]

    # The restarted operator routes more: batched, one aggregated Event per Runner, no per-job Normal Event.
    second = _create(kube, namespace, [f"after-{i}" for i in range(SECOND)])
    wait_for(
        lambda: all(_routed_by_label(kube, namespace, job) for job in second.values()),
        timeout=60,
        describe="the restarted operator's decisions recorded",
    )
    records = _batches(kube, namespace)
    decisions = [d["spec"] for d in iter_routing_decisions(records) if d["spec"]["action"] == "JobRouted"]
    assert Counter(d["object"]["name"] for d in decisions) == dict.fromkeys([*first, *second], 1)
    assert len(records) < FIRST + SECOND, "one record per decision: not batched"
    assert all(len(json.dumps(r)) < 256 * 1024 + 16 * 1024 for r in records)

    per_runner = Counter(job["status"]["assignment"]["runner"] for job in second.values())

    def runner_events() -> dict[str, int]:
        listed = kube.core.list_namespaced_event(namespace, field_selector="reason=JobsRouted").items
        counts = {e.involved_object.name: e.count for e in listed if e.involved_object.kind == "Runner"}
        assert counts == dict(per_runner), counts
        assert all(e.involved_object.uid for e in listed), "kubectl describe runner matches Events by uid"
        return counts

    wait_for(runner_events, timeout=60, interval=1, describe=f"a JobsRouted Event per runner counting {per_runner}")
    assert _job_events(kube, namespace, "JobRouted") == [], "routing posts no Normal Event per job"

    # A second crash: FIRST and SECOND are recorded, THIRD only in status. The restarted operator
    # lists the namespace's batches once and writes THIRD's decisions alone, each once.
    operator.kill()
    operator.extra_env = dict(OPERATOR_ENV)
    operator.start()
    third = _create(kube, namespace, [f"third-{i}" for i in range(THIRD)])
    operator.kill()
    operator.extra_env = dict(RESTARTED_ENV)
    operator.start()
    wait_for(
        lambda: all(_routed_by_label(kube, namespace, job) for job in third.values()),
        timeout=120,
        interval=1,
        describe="the decisions cut off by the second crash recorded",
    )
    decisions = [
        d["spec"] for d in iter_routing_decisions(_batches(kube, namespace)) if d["spec"]["action"] == "JobRouted"
    ]
    assert Counter(d["object"]["name"] for d in decisions) == dict.fromkeys([*first, *second, *third], 1)
    # The log of all three runs: recovery wrote FIRST's and THIRD's decisions, never SECOND's (held).
    recovered = [line for line in operator.log_text().splitlines() if "recovered: JobRouted" in line]
    assert sum("/third-" in line for line in recovered) == THIRD, recovered
    assert not any("/after-" in line for line in recovered), recovered

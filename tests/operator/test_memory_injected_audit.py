"""``MemoryInjected`` records what the runner injected at run time, not only what routing chose.

The operator and a real runner pod (started locally as ``helmhive dev run-pod`` does, with the
reference agent). Routing chooses three MemoryRecords for a job while the runner is paused
(SIGSTOP: the job is assigned but not started; the pool's long Lease keeps the runner Online).
Then one record is deleted and one expires; the runner resumes, re-checks each record, injects
the one left and reports the two it dropped in ``status.result.memory``. The operator writes the
run-time ``MemoryInjected`` record from that report, beside the queue-time one.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException
from reference_pool import PodStarter, pool_docs, profile_doc, workspace_doc

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod
from helmhive.policy.audit.routing import iter_routing_decisions, job_audit_label
from helmhive.policy.memory.injected import memory_report_audit_name

GROUP, VERSION = "helmhive.dev", "v1alpha1"
API = f"{GROUP}/{VERSION}"
POD = "remember-0"
RECORDS = ("money", "gone", "stale")


def _docs() -> list[dict[str, Any]]:
    memory = [
        {
            "apiVersion": API,
            "kind": "MemoryRecord",
            "metadata": {"name": name},
            "spec": {
                "workspace": "payments",
                "scope": {"type": "workspace"},
                "kind": "constraint",
                "text": f"The {name} rule.",
                "source": {"type": "adr", "url": f"https://git.example.com/adr/{name}"},
                "sensitivity": "internal",
            },
        }
        for name in RECORDS
    ]
    return [
        # A long Lease: the runner stays Online while the test holds it paused.
        *pool_docs(token="x", name="remember", lease_seconds=300, renew_seconds=1),
        workspace_doc("payments", {"review-probe": "remembering"}),
        profile_doc(
            "remembering",
            "review-probe",
            purpose="Review with the workspace's memory.",
            instructions="Review briefly.",
            memory={"enabled": True, "maxSensitivity": "internal"},
        ),
        *memory,
    ]


def _get(kube: Kube, namespace: str, plural: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    return obj


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


@pytest.fixture
def runner_pod(start_reference_pod: PodStarter) -> Iterator[LocalPod]:
    with start_reference_pod(_docs(), POD) as pod:
        try:
            yield pod
        finally:
            os.kill(pod.record.pid, signal.SIGCONT)  # the test may have left it stopped


def test_a_record_dropped_between_routing_and_running_is_audited_as_dropped(
    runner_pod: LocalPod, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    for name in RECORDS:
        wait_for(
            lambda n=name: _condition(_get(kube, namespace, "memoryrecords", n), "Active").get("status") == "True",  # type: ignore[misc]
            timeout=60,
            describe=f"memory record {name} Active",
        )
    os.kill(runner_pod.record.pid, signal.SIGSTOP)  # assigned, not started, until SIGCONT
    try:
        job = {
            "apiVersion": API,
            "kind": "AgentJob",
            "metadata": {"name": "review"},
            "spec": {
                "workspace": "payments",
                "jobKind": "review-probe",
                "request": {"title": "review", "prompt": "Review the ledger change."},
                "timeoutSeconds": 300,
            },
        }
        kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))
        routed = wait_for(
            lambda: (
                (j := _get(kube, namespace, "agentjobs", "review"))
                and _condition(j, "Routed").get("status") == "True"
                and j
            ),
            timeout=90,
            describe="job review routed",
        )
        assert sorted(routed["status"]["assignment"]["memoryIds"]) == sorted(RECORDS)
        assert _condition(routed, "Running").get("status") != "True"

        # Between routing and running: one record is deleted, one expires.
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "memoryrecords", "gone")

        def deleted() -> bool:
            with pytest.raises(ApiException) as err:
                _get(kube, namespace, "memoryrecords", "gone")
            return err.value.status == 404

        wait_for(deleted, timeout=60, describe="memory record gone deleted (the operator audits it first)")
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "memoryrecords", "stale", {"spec": {"expiresAt": "2020-01-01T00:00:00Z"}}
        )
    finally:
        os.kill(runner_pod.record.pid, signal.SIGCONT)

    done = wait_for(
        lambda: (
            (j := _get(kube, namespace, "agentjobs", "review"))
            and _condition(j, "Succeeded").get("status") == "True"
            and j
        ),
        timeout=120,
        describe="job review to succeed",
    )
    assert done["status"]["result"]["memory"] == {
        "injected": ["money"],
        "dropped": [{"name": "gone", "reason": "NotFound"}, {"name": "stale", "reason": "Expired"}],
    }
    uid = done["metadata"]["uid"]

    def audit(name: str) -> dict[str, Any]:
        spec: dict[str, Any] = _get(kube, namespace, "auditrecords", name)["spec"]
        return spec

    run = wait_for(
        lambda: audit(memory_report_audit_name("review", uid, 0)),
        timeout=60,
        describe="the run-time MemoryInjected record",
    )
    assert run["action"] == "MemoryInjected" and run["actor"]["username"] == "helmhive-operator"
    assert run["details"]["injected"] == "money"
    assert run["details"]["dropped"] == "gone:NotFound,stale:Expired"
    assert run["details"]["runner"] == POD
    assert run["after"] == {"value": "1 injected, 2 dropped at run time"}

    def queued_decision() -> dict[str, Any]:
        items = kube.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "auditrecords", label_selector=job_audit_label(uid)
        )["items"]
        found = [d["spec"] for d in iter_routing_decisions(items) if d["spec"]["action"] == "MemoryInjected"]
        assert len(found) == 1, found
        return found[0]

    queued = wait_for(queued_decision, timeout=30, describe="the queue-time MemoryInjected decision")
    assert queued["attempt"] == 0 and queued["object"]["uid"] == uid
    assert queued["action"] == "MemoryInjected" and queued["after"] == {"value": "3 records selected at queue time"}

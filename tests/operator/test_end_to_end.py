"""End to end on a real API server: the operator, a runner pod run as a kubelet would, the reference agent.

A RunnerPool's pod (Pending: no kubelet) is started locally by ``helmhive dev run-pod``'s code with
the pod's own bound token, env and volumes. A connection test is routed to it and answered; then a
runner killed mid-job leaves its job ended with a named reason, and a job that may have written is
not re-run.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from reference_pool import PodStarter, pool_docs, profile_doc, workspace_doc

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod

API = "helmhive.dev/v1alpha1"


def _docs() -> list[dict[str, Any]]:
    return [
        *pool_docs(token="e2e-stand-in", lease_seconds=5, renew_seconds=1),
        workspace_doc("payments", {"connection-test": "ref-check", "implementation-probe": "ref-impl"}),
        profile_doc("ref-check", "connection-test", purpose="End-to-end test."),
        profile_doc("ref-impl", "implementation-probe", purpose="End-to-end test."),
    ]


def _job(name: str, kind: str, prompt: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {
            "workspace": "payments",
            "jobKind": kind,
            "request": {"title": name, "prompt": prompt},
            "timeoutSeconds": 300,
        },
    }


def _condition(kube: Kube, namespace: str, name: str, ctype: str) -> dict[str, Any] | None:
    job = kube.custom.get_namespaced_custom_object("helmhive.dev", "v1alpha1", namespace, "agentjobs", name)
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


@pytest.fixture
def runner_pod(start_reference_pod: PodStarter) -> Iterator[LocalPod]:
    with start_reference_pod(_docs(), "reference-0") as pod:
        yield pod


def test_a_connection_test_is_routed_run_and_answered(
    runner_pod: LocalPod, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_job("hello", "connection-test", "Say hello.")))
    done = wait_for(
        lambda: _condition(kube, namespace, "hello", "Succeeded"), timeout=90, describe="job hello to finish"
    )
    assert (done["status"], done["reason"]) == ("True", "Completed"), done
    job = kube.custom.get_namespaced_custom_object("helmhive.dev", "v1alpha1", namespace, "agentjobs", "hello")
    status = job["status"]
    assert status["assignment"]["runner"] == "reference-0"
    assert status["assignment"]["model"] == "reference-small"
    assert status["assignment"]["modelSource"] == "runner-default"
    assert status["profile"]["name"] == "ref-check" and status["profile"]["revision"].startswith("ref-check-")
    assert status["result"]["summary"].startswith(
        "helmhive-reference-agent: deterministic reference agent, not a model."
    )
    table = kubectl("get", "agentjobs", "-n", namespace).stdout
    assert "reference-0" in table and "reference-small" in table


def test_a_runner_killed_mid_job_leaves_a_named_reason_and_a_writing_job_is_not_rerun(
    runner_pod: LocalPod, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    job = _job("stuck", "implementation-probe", "Change nothing.\nREFERENCE-AGENT: hang")
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))
    running = wait_for(
        lambda: (c := _condition(kube, namespace, "stuck", "Running")) and c["status"] == "True" and c, timeout=90
    )
    assert running["reason"] == "Started"
    os.kill(runner_pod.record.pid, signal.SIGKILL)

    ended = wait_for(
        lambda: (c := _condition(kube, namespace, "stuck", "Succeeded")) and c["status"] == "False" and c,
        timeout=60,
        describe="the job to end once its runner's Lease expires",
    )
    assert ended["reason"] == "RunnerLost"
    assert "went Offline" in ended["message"]
    assert "not re-run" in ended["message"] and "side effects" in ended["message"]
    status = kube.custom.get_namespaced_custom_object("helmhive.dev", "v1alpha1", namespace, "agentjobs", "stuck")[
        "status"
    ]
    assert status["result"]["outcome"] == "RunnerLost"
    assert status["assignment"]["runner"] == "reference-0", "a job that may have written keeps its history"

    def lost_event() -> bool:  # the operator posts it after the job's status
        events = kube.core.list_namespaced_event(namespace, field_selector="involvedObject.name=stuck")
        return any(e.reason == "RunnerLost" for e in events.items)

    wait_for(lost_event, timeout=60, describe="a RunnerLost Event about job stuck")

"""A job its runner ends with an infrastructure failure is re-run once by the operator, on a real API server.

The operator, a runner pod started locally as ``helmhive dev run-pod`` does, and the reference
agent. A read-only review whose agent crashes on its first attempt (``REFERENCE-AGENT:
crash-once``: the mark lives in the session binding's HOME, which the re-run on the same runner
shares) ends ``AgentCrashed`` and is re-queued once by the operator, then succeeds; an
implementation job whose agent crashed after starting is not re-run (``MayHaveSideEffects``).
The pool's token is a canary the crashing agent writes to its stderr: it appears in no status or Event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from reference_pool import PodStarter, pool_docs, profile_doc, workspace_doc

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod
from helmhive.policy.audit.routing import iter_routing_decisions, job_audit_label

API = "helmhive.dev/v1alpha1"
GROUP, VERSION = "helmhive.dev", "v1alpha1"
CANARY = "canary-pool-token-4d81be"


def _docs() -> list[dict[str, Any]]:
    return [
        *pool_docs(
            token=CANARY,
            lease_seconds=10,
            renew_seconds=2,
            agent_env={"HELMHIVE_REFERENCE_AGENT_LEAK_ON_CRASH": "1"},
        ),
        workspace_doc("payments", {"review-probe": "ref-review", "implementation-probe": "ref-impl"}),
        # A session binding: its HOME is kept on the runner, so the re-run finds crash-once's mark.
        profile_doc("ref-review", "review-probe", purpose="Retry test.", session={"policy": "resume"}),
        profile_doc("ref-impl", "implementation-probe", purpose="Retry test."),
    ]


def _job(name: str, kind: str, prompt: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {"workspace": "payments", "jobKind": kind, "request": {"title": name, "prompt": prompt}},
    }


def _get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return dict(kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", name))


def _condition(job: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _events(kube: Kube, namespace: str, name: str) -> list[Any]:
    return list(kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items)


def _wait_event(kube: Kube, namespace: str, name: str, reason: str) -> str:
    def posted() -> str:
        found = [str(e.message) for e in _events(kube, namespace, name) if e.reason == reason and e.type == "Warning"]
        assert found, [(e.reason, e.message) for e in _events(kube, namespace, name)]
        return found[0]

    return wait_for(posted, timeout=60, describe=f"a Warning {reason} Event about job {name}")


@pytest.fixture
def runner_pod(start_reference_pod: PodStarter) -> Iterator[LocalPod]:
    with start_reference_pod(_docs(), "reference-0") as pod:
        yield pod


@pytest.mark.timeout(600)
def test_a_crashed_read_only_job_is_rerun_once_and_a_crashed_writing_job_is_not(
    runner_pod: LocalPod, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    prompt = "Review the change.\nREFERENCE-AGENT: crash-once"
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_job("flaky", "review-probe", prompt)))

    def succeeded() -> dict[str, Any]:
        job = _get(kube, namespace, "flaky")
        cond = _condition(job, "Succeeded")
        assert cond.get("status") == "True", json.dumps(job.get("status"))
        return cond

    done = wait_for(succeeded, timeout=180, describe="job flaky to succeed on its re-run")
    assert done["reason"] == "Completed", done
    flaky = _get(kube, namespace, "flaky")
    assert flaky["status"]["attempts"] == 1, flaky["status"]
    assert flaky["status"]["assignment"]["runner"] == "reference-0"
    message = _wait_event(kube, namespace, "flaky", "RetryAllowed")
    assert message.startswith("AgentCrashed: re-queued (re-run 1): ") and "it is read-only" in message
    # Each run has its JobRouted decision: the first run's was recorded before the re-queue cleared it.
    items = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "auditrecords", label_selector=job_audit_label(flaky["metadata"]["uid"])
    )["items"]
    routed = sorted(d["spec"]["attempt"] for d in iter_routing_decisions(items) if d["spec"]["action"] == "JobRouted")
    assert routed == [0, 1], routed

    impl = _job("writer", "implementation-probe", "Change it.\nREFERENCE-AGENT: crash")
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(impl))
    ended = wait_for(
        lambda: (c := _condition(_get(kube, namespace, "writer"), "Succeeded")) and "not re-run" in c["message"] and c,
        timeout=120,
        describe="job writer to end AgentCrashed with the operator's verdict",
    )
    assert (ended["status"], ended["reason"]) == ("False", "AgentCrashed"), ended
    assert "exit code 70" in ended["message"] and "side effects" in ended["message"]
    message = _wait_event(kube, namespace, "writer", "MayHaveSideEffects")
    assert message.startswith("AgentCrashed: not re-run: the job started with write filesystem access")
    writer = _get(kube, namespace, "writer")
    assert not writer["status"].get("attempts") and writer["status"]["result"]["outcome"] == "AgentCrashed"
    assert writer["status"]["assignment"]["runner"] == "reference-0", "a job that may have written keeps its history"

    # The crashing agent wrote the pool's token to its stderr: it reached no status and no Event.
    for name in ("flaky", "writer"):
        assert CANARY not in json.dumps(_get(kube, namespace, name))
        assert all(CANARY not in str(e.message) for e in _events(kube, namespace, name))
    # One verdict per ended job: the writer's later events wrote nothing more.
    assert [e.reason for e in _events(kube, namespace, "writer")].count("MayHaveSideEffects") == 1

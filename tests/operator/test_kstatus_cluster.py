"""What ``kubectl wait`` and Flux's kstatus see of real objects, written by a running operator and runner.

A reference runner answers a connection test (Ready, Succeeded: kstatus Current); a review job
whose Workspace names a profile for another envelope fails closed at queue time (Stalled:
Failed); a job whose Workspace does not exist waits for it (Reconciling: InProgress); a RunnerPool
with a name too long for its pods' names has an invalid spec (Stalled: Failed), while the
reference pool, its Runner and the Profiles are Current. ``kubectl wait --for=condition=...``
waits for each, and kstatus itself (``tests/harness/kstatus``) reads the objects as ``kubectl get``
returns them. docs/install.md, "Argo CD and Flux", is the table this checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from reference_pool import PodStarter, pool_docs, profile_doc, workspace_doc

from harness.kstatus_tool import Kstatus, kstatus_binary
from harness.kubectl import Kubectl
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod

API = "helmhive.dev/v1alpha1"
LONG_POOL = "a" * 53  # its pods' names would pass 63 characters: InvalidSpec


@pytest.fixture(scope="module")
def kstatus(tmp_path_factory: pytest.TempPathFactory) -> Kstatus:
    return kstatus_binary(tmp_path_factory)


@pytest.fixture
def runner_pod(start_reference_pod: PodStarter) -> Iterator[LocalPod]:
    docs = [
        *pool_docs(token="kstatus-stand-in", lease_seconds=5, renew_seconds=1),
        workspace_doc("payments", {"connection-test": "ref-check"}),
        workspace_doc("mismatched", {"review-probe": "ref-check"}),  # a connection-test profile for reviews
        profile_doc("ref-check", "connection-test", purpose="kstatus test."),
    ]
    with start_reference_pod(docs, "reference-0") as pod:
        yield pod


def _job(name: str, kind: str, workspace: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {"workspace": workspace, "jobKind": kind, "request": {"title": name, "prompt": "Say hello."}},
    }


def _conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in (obj.get("status") or {}).get("conditions") or []}


def test_kubectl_wait_and_kstatus_tell_progressing_ready_and_failed_apart(
    runner_pod: LocalPod, kubectl: Kubectl, kstatus: Kstatus, namespace: str
) -> None:
    invalid_pool = next(d for d in pool_docs(token="unused", name=LONG_POOL) if d["kind"] == "RunnerPool")
    docs = [
        _job("hello", "connection-test", "payments"),
        _job("refused", "review-probe", "mismatched"),
        _job("early", "connection-test", "not-yet"),  # its Workspace is never created: it waits
        invalid_pool,
    ]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))

    def wait(target: str, condition: str) -> None:
        kubectl("wait", "-n", namespace, f"--for=condition={condition}", target, "--timeout=120s", timeout=150)

    wait("agentjob/hello", "Succeeded")
    wait("agentjob/hello", "Ready")
    wait("agentjob/refused", "Stalled")
    wait("agentjob/early", "Reconciling")
    wait(f"runnerpool/{LONG_POOL}", "Stalled")
    wait("runner/reference-0", "Schedulable")

    def get(kind: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = kubectl.json("get", kind, name, "-n", namespace)
        return obj

    hello, refused, early = get("agentjob", "hello"), get("agentjob", "refused"), get("agentjob", "early")
    assert "Reconciling" not in _conditions(hello) and "Stalled" not in _conditions(hello)
    assert _conditions(refused)["Stalled"] == ("True", "ProfileNotValid")
    assert _conditions(early)["Reconciling"] == ("True", "WaitingForWorkspace")
    for job in (hello, refused, early):
        assert job["status"]["observedGeneration"] == job["metadata"]["generation"]
    pool = get("runnerpool", LONG_POOL)
    assert _conditions(pool)["Stalled"] == ("True", "InvalidSpec")
    assert pool["status"]["observedGeneration"] == pool["metadata"]["generation"]

    results = kstatus.compute([hello, refused, early, pool])
    assert [r.status for r in results] == ["Current", "Failed", "InProgress", "Failed"], results
    assert results[1].conditions[0]["reason"] == "ProfileNotValid"

    # The reference pool settles Current once its runner is Online; its Runner and Profile are Current.
    def settled() -> list[str]:
        objs = [get("runnerpool", "reference"), get("runner", "reference-0"), get("profile", "ref-check")]
        statuses = [r.status for r in kstatus.compute(objs)]
        assert statuses == ["Current", "Current", "Current"], statuses
        return statuses

    wait_for(settled, timeout=60, describe="the reference pool, its Runner and its Profile Current for kstatus")

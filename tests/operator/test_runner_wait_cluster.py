"""A job routed before any runner can take it waits for one, and runs once one can (GitOps order).

The bug this guards (found on a kind cluster): the demo's documents
(:func:`helmhive.devcluster.demo_manifests.build_demo_documents`: a Secret, a RunnerPool, a Profile
and an AgentJob) applied in one ``kubectl apply``. The job is bound and routed seconds before the
pool's pod has created and registered its Runner; routing found no runner and failed the job closed
(``NoEligibleRunner``, "no runner is registered", final), so it never ran although the runner was
Online a few seconds later. Now a job that no runner can serve *yet* waits, visibly
(``WaitingForCapacity``, the message says what it waits for), and is re-decided when a runner
becomes schedulable (an event, not a timer).

The pool's pod is run locally (:mod:`reference_pool`) only after the job's first decision is seen,
so the order is the one of the bug, deterministically: decided first, runner registered after.
The same holds for a runner that exists but may not take work (``Disabled``) when the job is
decided, and becomes ``Active`` later.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from reference_pool import GROUP, VERSION, PodStarter, pool_docs, profile_doc

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.devcluster.demo_manifests import DEMO_JOB, DEMO_POOL, build_demo_documents
from helmhive.policy.routing.status import build_candidate_rows

# Generous: the machine is shared; states are waited for, never timed.
DECIDED = 120
RUN = 180


def _job(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", name)
    return obj


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _routed_without_assignment(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The job once routing decided it and assigned nothing (it waits, or it failed closed)."""
    job = _job(kube, namespace, name)
    routed = _conditions(job).get("Routed")
    if routed is None or routed["status"] != "False" or not (job.get("status") or {}).get("profile"):
        return None
    return job


def _succeeded(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    return _conditions(_job(kube, namespace, name)).get("Succeeded")


def _runners(kube: Kube, namespace: str) -> list[str]:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "runners")["items"]
    return [r["metadata"]["name"] for r in items]


def _webhook_ready(kubectl: Kubectl) -> bool:
    proc = kubectl("get", "validatingwebhookconfiguration", "helmhive.dev", "-o", "json", check=False)
    return proc.returncode == 0 and bool(json.loads(proc.stdout).get("webhooks"))


def _apply(kubectl: Kubectl, namespace: str, docs: list[dict[str, Any]]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))


def _assert_waits_for_a_runner(job: dict[str, Any]) -> None:
    conditions = _conditions(job)
    routed, ready = conditions["Routed"], conditions["Ready"]
    assert (routed["status"], routed["reason"]) == ("False", "WaitingForCapacity"), routed
    assert (ready["status"], ready["reason"]) == ("Unknown", "WaitingForCapacity"), ready
    assert "no runner is eligible yet" in routed["message"] and "waiting" in routed["message"], routed
    assert job["status"].get("assignment") is None


def test_a_job_applied_with_its_pool_waits_for_the_runner_and_runs_once_it_registers(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str, start_reference_pod: PodStarter
) -> None:
    wait_for(lambda: _webhook_ready(kubectl), timeout=60, describe="the operator's validating webhook")
    docs = build_demo_documents()
    _apply(kubectl, namespace, docs)  # one apply, as the bug's GitOps sync did

    # Routing decides before the pool's pod runs (it is started below): no runner is registered.
    first = wait_for(
        lambda: _routed_without_assignment(kube, namespace, DEMO_JOB),
        timeout=DECIDED,
        describe=f"job {DEMO_JOB} decided while no runner is registered",
    )
    assert _runners(kube, namespace) == []
    # Other modules' runners (other namespaces, not serving this one) may be candidates; none of this one.
    message = _conditions(first)["Routed"]["message"]
    assert "no runner is registered" in message or "can take it (closest: " in message, message
    rows = build_candidate_rows((first["status"].get("routing") or {}).get("candidates") or [])
    assert all(row["namespace"] != namespace for row in rows), rows

    with start_reference_pod(docs, f"{DEMO_POOL}-0"):  # returns once the Runner is Schedulable
        done = wait_for(
            lambda: _succeeded(kube, namespace, DEMO_JOB),
            timeout=RUN,
            describe=f"job {DEMO_JOB} to run once runner {DEMO_POOL}-0 registered (first decision: "
            f"{_conditions(first)['Routed']})",
        )
        assert (done["status"], done["reason"]) == ("True", "Completed"), done
    _assert_waits_for_a_runner(first)
    job = _job(kube, namespace, DEMO_JOB)
    assert job["status"]["assignment"]["runner"] == f"{DEMO_POOL}-0"
    assert _conditions(job)["Routed"]["reason"] == "Assigned"


def test_a_job_decided_while_its_only_runner_may_not_take_work_runs_once_it_may(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str, start_reference_pod: PodStarter
) -> None:
    wait_for(lambda: _webhook_ready(kubectl), timeout=60, describe="the operator's validating webhook")
    docs = [*pool_docs(token="stand-in"), profile_doc("ref-check", "connection-test", purpose="Runner waits.")]
    with start_reference_pod(docs, "reference-0"):
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "runners", "reference-0", {"spec": {"controlState": "Disabled"}}
        )

        def not_schedulable() -> bool:
            runner = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "runners", "reference-0")
            return _conditions(runner).get("Schedulable", {}).get("status") == "False"

        wait_for(not_schedulable, timeout=DECIDED, describe="runner reference-0 not Schedulable once Disabled")
        job = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentJob",
            "metadata": {"name": "hello"},
            "spec": {
                "workspace": "payments",
                "jobKind": "connection-test",
                "profile": "ref-check",
                "request": {"title": "Hello", "prompt": "Say hello."},
                "timeoutSeconds": 120,
            },
        }
        _apply(kubectl, namespace, [job])
        first = wait_for(
            lambda: _routed_without_assignment(kube, namespace, "hello"),
            timeout=DECIDED,
            describe="job hello decided while its only runner is Disabled",
        )
        assert "NotSchedulable/Disabled" in _conditions(first)["Routed"]["message"]

        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "runners", "reference-0", {"spec": {"controlState": "Active"}}
        )
        done = wait_for(
            lambda: _succeeded(kube, namespace, "hello"),
            timeout=RUN,
            describe=f"job hello to run once reference-0 is Active (first decision: {_conditions(first)['Routed']})",
        )
        assert (done["status"], done["reason"]) == ("True", "Completed"), done
    _assert_waits_for_a_runner(first)

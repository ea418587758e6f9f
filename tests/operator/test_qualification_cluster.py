"""Qualification probes decide whether a runner takes work, on a real API server.

The operator, one runner pod started locally as ``helmhive dev run-pod`` does, and the reference
agent. The pool names three probes, ``connection-test``, ``implementation-probe`` and
``review-probe``:

1. The agent runs in mode ``invalid-output`` (every structured answer breaks its contract). The
   first two probes pass (the implementation probe has no source: it runs in the job's own empty
   scratch directory); the review probe fails ``OutputContractViolated``. The runner is
   ``Schedulable=False/QualificationFailed``, NeedsAttention, ``Qualified=False``; the round is
   audited ``RunnerQualificationFailed``; ``kubectl get agentjobs`` marks the probe jobs with the
   runner they qualify. A user's job waits, its candidate row saying
   ``NotSchedulable/QualificationFailed``.
2. Nobody but the operator may put the qualification label on a job: the API server refuses the
   test's own (admin) request.
3. The pool's agent is fixed and the pod restarted: the new registration is qualified again, the
   runner becomes schedulable (``RunnerQualified`` audited), and the waiting user job runs on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from reference_pool import pool_docs, profile_doc, workspace_doc

from harness.cluster import ClusterHandle
from harness.kube import Kube
from harness.kubectl import Kubectl, KubectlError
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod, run_pod, stop_pod
from helmhive.policy.routing.status import build_candidate_rows

API = "helmhive.dev/v1alpha1"
GROUP, VERSION = "helmhive.dev", "v1alpha1"
POOL, RUNNER = "reference", "reference-0"
CANARY = "canary-qualification-token-5d1f02"
PROBES = ["connection-test", "implementation-probe", "review-probe"]


def _docs() -> list[dict[str, Any]]:
    docs = pool_docs(token=CANARY, agent_env={"HELMHIVE_REFERENCE_AGENT_MODE": "invalid-output"})
    pool = next(d for d in docs if d["kind"] == "RunnerPool")
    pool["spec"]["qualification"] = {"probes": PROBES, "timeoutSeconds": 120}
    return [
        *docs,
        workspace_doc("payments", {"connection-test": "hello"}),
        profile_doc("hello", "connection-test", purpose="A user's connection test."),
    ]


def _get(kube: Kube, namespace: str, plural: str, name: str) -> dict[str, Any]:
    return dict(kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name))


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _audits(kube: Kube, namespace: str, action: str) -> list[dict[str, Any]]:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "auditrecords")["items"]
    return [a for a in items if a["spec"]["action"] == action and a["spec"]["object"]["name"] == RUNNER]


@contextmanager
def _local_pod(cluster: ClusterHandle, kube: Kube, namespace: str, state_dir: Path) -> Iterator[LocalPod]:
    """Run the pool's pod locally once it exists (unlike ``start_reference_pod``, not waiting for Schedulable)."""
    wait_for(lambda: kube.core.read_namespaced_pod(RUNNER, namespace), timeout=60, describe=f"pod {RUNNER}")
    local = run_pod(
        name=RUNNER, namespace=namespace, admin_kubeconfig=cluster.kubeconfig, state_dir=state_dir, tie_to_parent=True
    )
    try:
        yield local
    finally:
        stop_pod(name=RUNNER, namespace=namespace, state_dir=state_dir)


def _qualification(kube: Kube, namespace: str, state: str) -> dict[str, Any]:
    runner = _get(kube, namespace, "runners", RUNNER)
    record = (runner.get("status") or {}).get("qualification") or {}
    assert record.get("state") == state, (record, _condition(runner, "Schedulable"))
    return runner


def test_a_failed_probe_makes_the_runner_unschedulable_until_it_qualifies_again(
    operator: OperatorProcess, cluster: ClusterHandle, kube: Kube, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(_docs()))
    with _local_pod(cluster, kube, namespace, tmp_path / "first") as pod:
        runner = wait_for(
            lambda: _qualification(kube, namespace, "Failed"), timeout=240, describe="the first round failing"
        )
        status = runner["status"]
        record = status["qualification"]
        assert record["round"] == 1
        outcomes = {p["kind"]: (p["outcome"], p.get("reason")) for p in record["probes"]}
        assert outcomes["connection-test"] == ("Succeeded", "Completed")
        assert outcomes["implementation-probe"] == ("Succeeded", "Completed")
        assert outcomes["review-probe"] == ("Failed", "OutputContractViolated")
        schedulable = _condition(runner, "Schedulable")
        assert (schedulable["status"], schedulable["reason"]) == ("False", "QualificationFailed")
        assert "review-probe" in schedulable["message"]
        assert status["reportedStatus"] == "NeedsAttention"
        assert _condition(runner, "Qualified")["reason"] == "QualificationFailed"
        # Each probe ran as an AgentJob routed to this runner, marked in `kubectl get agentjobs`.
        jobs = {p["kind"]: p["job"] for p in record["probes"]}
        implementation = _get(kube, namespace, "agentjobs", jobs["implementation-probe"])
        assert implementation["status"]["assignment"]["runner"] == RUNNER
        assert "source" not in implementation["spec"]  # its own empty scratch directory on the runner
        assert implementation["metadata"]["labels"]["helmhive.dev/qualification"] == RUNNER
        listed = kubectl("get", "agentjobs", "-n", namespace, "-l", "helmhive.dev/qualification").stdout
        header, *rows = listed.strip().splitlines()
        assert "QUALIFIES" in header and len(rows) == 3
        assert all(row.split()[0] in jobs.values() and RUNNER in row.split() for row in rows)
        failed = wait_for(
            lambda: _audits(kube, namespace, "RunnerQualificationFailed") or None, timeout=30, describe="the audit"
        )[0]  # a retry round after the backoff fails again, and is audited again
        assert failed["spec"]["details"]["review-probe"].endswith("Failed (OutputContractViolated)")
        # The pod's log, the operator's log and the probes' statuses never hold the pool's token.
        dumped = json.dumps([runner, *(_get(kube, namespace, "agentjobs", j) for j in jobs.values())])
        assert CANARY not in dumped
        assert CANARY not in operator.log_path.read_text(encoding="utf-8", errors="replace")
        assert CANARY not in (pod.root / "container.log").read_text(encoding="utf-8", errors="replace")

        # A user's job waits for the runner, which routing shows as not schedulable for that reason.
        job = {
            "apiVersion": API,
            "kind": "AgentJob",
            "metadata": {"name": "user-job"},
            "spec": {"workspace": "payments", "jobKind": "connection-test", "request": {"title": "t", "prompt": "Hi."}},
        }
        kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))

        def waiting() -> dict[str, Any]:
            got = _get(kube, namespace, "agentjobs", "user-job")
            assert _condition(got, "Routed").get("reason") == "WaitingForCapacity", got.get("status")
            return got

        rows = build_candidate_rows(
            wait_for(waiting, timeout=60, describe="the user job waiting")["status"]["routing"]["candidates"]
        )
        assert {r["runner"]: r["reason"] for r in rows} == {RUNNER: "NotSchedulable/QualificationFailed"}

        # Only the operator may pin a job to a runner's qualification.
        forged = {**job, "metadata": {"name": "forged", "labels": {"helmhive.dev/qualification": RUNNER}}}
        with pytest.raises(KubectlError, match="set by the Helmhive operator only"):
            kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(forged))
        with pytest.raises(KubectlError, match="set by the Helmhive operator only"):
            kubectl("label", "agentjob", "user-job", "-n", namespace, f"helmhive.dev/qualification={RUNNER}")

    # Fix the agent; the restarted pod registers again, is qualified, and runs the waiting job.
    sts_before = kube.apps.read_namespaced_stateful_set(POOL, namespace)
    old_pod = kube.core.read_namespaced_pod(RUNNER, namespace)
    kubectl("patch", "runnerpool", POOL, "-n", namespace, "--type=json", "-p",
            json.dumps([{"op": "remove", "path": "/spec/adapter/acp/env"}]))  # fmt: skip

    def rolled() -> str:
        sts = kube.apps.read_namespaced_stateful_set(POOL, namespace)
        assert sts.spec.template.metadata.annotations != sts_before.spec.template.metadata.annotations
        assert sts.status.update_revision and sts.status.update_revision != sts_before.status.update_revision
        return str(sts.status.update_revision)

    revision = wait_for(rolled, timeout=60, describe="the StatefulSet's new template")
    kube.core.delete_namespaced_pod(RUNNER, namespace, grace_period_seconds=0)

    def recreated() -> bool:
        pod = kube.core.read_namespaced_pod(RUNNER, namespace)
        assert pod.metadata.uid != old_pod.metadata.uid
        assert pod.metadata.labels.get("controller-revision-hash") == revision
        return True

    wait_for(recreated, timeout=60, describe="the pod recreated from the new template")
    with _local_pod(cluster, kube, namespace, tmp_path / "second"):
        runner = wait_for(
            lambda: _qualification(kube, namespace, "Qualified"), timeout=240, describe="the second registration"
        )
        # A later round, for the new registration (a retry of the failed one may have run meanwhile).
        again = runner["status"]["qualification"]
        assert again["round"] >= 2 and again["registeredAt"] != record["registeredAt"]
        assert {p["kind"]: p["outcome"] for p in again["probes"]} == dict.fromkeys(PROBES, "Succeeded")
        assert _condition(runner, "Schedulable")["status"] == "True"
        assert _condition(runner, "Qualified")["reason"] == "Qualified"
        assert runner["status"]["reportedStatus"] == "Online"

        def user_job_ran() -> dict[str, Any]:
            got = _get(kube, namespace, "agentjobs", "user-job")
            assert _condition(got, "Succeeded").get("status") == "True", got.get("status")
            return got

        done = wait_for(user_job_ran, timeout=180, describe="the user job running on the qualified runner")
        assert done["status"]["assignment"]["runner"] == RUNNER
    assert wait_for(lambda: _audits(kube, namespace, "RunnerQualified") or None, timeout=30, describe="the audit")

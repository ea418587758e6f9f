"""The release's lifecycle on real pods: ``helm upgrade`` while a job runs, then ``helm uninstall``."""

from __future__ import annotations

import json
from typing import Any

from e2e_rig import CHART, RELEASE, RUNNERS_NS, SYSTEM_NS, Rig

from harness.wait import wait_for

INSTANCE = f"app.kubernetes.io/instance={RELEASE}"


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {
            "workspace": "payments",
            "jobKind": "connection-test",
            "profile": "reference-connection-check",
            "request": {"title": "Slow", "prompt": "Take your time.\nREFERENCE-AGENT: slow"},
            "timeoutSeconds": 600,
        },
    }


def _condition(rig: Rig, name: str, kind: str = "Ready") -> dict[str, Any]:
    job = rig.get("agentjob", "-n", RUNNERS_NS, name)
    return next((c for c in job.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def _now(rig: Rig) -> str:
    """The API server's clock, as an RFC 3339 timestamp comparable with condition times."""
    lease = rig.get("lease", "-n", "kube-node-lease")["items"][0]
    return str(lease["spec"]["renewTime"])[:19] + "Z"


def _operator_pods(rig: Rig) -> set[str]:
    pods = rig.get("pods", "-n", SYSTEM_NS, "-l", f"{INSTANCE},app.kubernetes.io/component=operator")["items"]
    return {p["metadata"]["name"] for p in pods}


def test_helm_upgrade_while_a_job_runs_does_not_lose_it(runners: Rig) -> None:
    rig = runners
    before = _operator_pods(rig)
    rig.apply([_job("slow-through-upgrade")], RUNNERS_NS)
    wait_for(
        lambda: _condition(rig, "slow-through-upgrade", "Running").get("status") == "True",
        timeout=300,
        describe="the slow job to start",
    )
    # A changed value rolls the operator's pods while the job runs on its runner pod.
    upgraded_at = _now(rig)
    rig.helm(
        "upgrade", RELEASE, CHART, "-n", SYSTEM_NS, "--reuse-values", "--set", "operator.logLevel=debug",
        "--wait", "--timeout", "5m",
    )  # fmt: skip
    after = wait_for(
        lambda: (now := _operator_pods(rig)) and not (now & before) and len(now) == 2 and now,
        timeout=300,
        describe="the upgrade to replace both operator pods",
    )
    assert after
    done = wait_for(
        lambda: (
            (c := _condition(rig, "slow-through-upgrade")).get("status") in {"True", "False"}
            and c.get("reason") not in {"Pending", "Assigned", "Running"}
            and c
        ),
        timeout=600,
        describe="the slow job to finish",
    )
    assert done["reason"] == "Completed", done
    job = rig.get("agentjob", "-n", RUNNERS_NS, "slow-through-upgrade")
    # It was still running when the new operator pods took over: it finished after the upgrade.
    assert _condition(rig, "slow-through-upgrade", "Succeeded")["lastTransitionTime"] >= upgraded_at, job["status"]
    # status.attempts counts automatic re-runs: an operator roll is not a lost runner, so none.
    assert int(job["status"].get("attempts") or 0) == 0, job["status"]


def test_helm_uninstall_leaves_only_what_the_docs_say_stays(runners: Rig) -> None:
    rig = runners
    rig.helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "5m")
    kinds = "deployments,services,serviceaccounts,configmaps,poddisruptionbudgets"
    wait_for(
        lambda: not rig.get(kinds, "-n", SYSTEM_NS, "-l", INSTANCE)["items"],
        timeout=180,
        describe="the release's namespaced objects to go",
    )
    cluster_scoped = "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings"
    assert not rig.get(cluster_scoped, "-l", INSTANCE)["items"]
    assert not _operator_pods(rig) or wait_for(
        lambda: not _operator_pods(rig), timeout=180, describe="no operator pods"
    )
    # The certificate Secret goes with the webhook Service that owns it (garbage collection).
    wait_for(
        lambda: (
            "helmhive-webhook-cert" not in {s["metadata"]["name"] for s in rig.get("secrets", "-n", SYSTEM_NS)["items"]}
        ),
        timeout=180,
        describe="the webhook certificate Secret to be collected",
    )
    # What stays (docs/install.md, Uninstall): the CRDs and every Helmhive object, the namespace,
    # and the webhook configurations the operator made, which the docs tell you to delete.
    crds = {c["metadata"]["name"] for c in rig.get("crds")["items"] if c["metadata"]["name"].endswith(".helmhive.dev")}
    assert {"agentjobs.helmhive.dev", "runnerpools.helmhive.dev", "profiles.helmhive.dev"} <= crds
    assert rig.get("runnerpools", "-n", RUNNERS_NS)["items"]
    assert rig.get("namespace", SYSTEM_NS)["metadata"]["name"] == SYSTEM_NS
    webhooks = rig.kubectl_proc("get", "validatingwebhookconfiguration", "helmhive.dev", "-o", "json")
    assert webhooks.returncode == 0 and json.loads(webhooks.stdout)["webhooks"]
    rig.kubectl(
        "delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", "helmhive.dev", "--ignore-not-found"
    )

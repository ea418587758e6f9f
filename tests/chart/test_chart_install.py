"""The chart's life on a real API server: install, upgrade, rollback and uninstall with a real helm.

A control plane of the module's own (``fresh_cluster``: etcd, kube-apiserver and
kube-controller-manager, no kubelet), so pods never start: the tests assert the objects and
what the API server and the controllers do with them, and run the real operator process
as the ServiceAccount the chart made. Both tests use the release name ``helmhive`` and
uninstall it at the end (the CRDs stay, and the next install adopts them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from chart_rig import CHART, EXAMPLES, helm_fails, run
from kubernetes import client, config

from harness.identity import mint_token, token_kubeconfig
from harness.operator import OperatorProcess, free_port
from harness.wait import wait_for
from helmhive.api.kinds import KINDS
from helmhive.devcluster import cluster as devcluster

NS = "helmhive-system"
RELEASE = "helmhive"


class Cluster:
    """helm and kubectl against the module's control plane."""

    def __init__(self, helm: Path, info: devcluster.ClusterInfo) -> None:
        self.info = info
        self._helm = [str(helm), "--kubeconfig", str(info.kubeconfig)]
        self._kubectl = [str(info.kubectl), f"--kubeconfig={info.kubeconfig}"]

    def helm(self, *args: str | Path) -> str:
        return run(*self._helm, *args)

    def helm_fails(self, *args: str | Path) -> str:
        return helm_fails(*self._helm, *args)

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self._kubectl, *args], input=stdin, capture_output=True, text=True, check=False)

    def get(self, *args: str) -> dict[str, Any]:
        proc = self.kubectl("get", *args, "-o", "json")
        assert proc.returncode == 0, proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    def names(self, *args: str) -> set[str]:
        return {item["metadata"]["name"] for item in self.get(*args)["items"]}

    def exists(self, *args: str) -> bool:
        return self.kubectl("get", *args).returncode == 0


def _operator_args(cluster: Cluster) -> list[str]:
    args: list[str] = cluster.get("deployment", "helmhive-operator", "-n", NS)["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    return args


def _workers(cluster: Cluster) -> str:
    container = cluster.get("deployment", "helmhive-operator", "-n", NS)["spec"]["template"]["spec"]["containers"][0]
    value: str = {e["name"]: e.get("value") for e in container["env"]}["HELMHIVE_ROUTING_WORKERS"]
    return value


def _revision(cluster: Cluster) -> str:
    """The Deployment's rollout revision, as kube-controller-manager's deployment controller sets it."""
    annotations = cluster.get("deployment", "helmhive-operator", "-n", NS)["metadata"].get("annotations", {})
    revision: str = annotations.get("deployment.kubernetes.io/revision", "")
    return revision


def _chart_with_a_changed_crd(tmp: Path) -> Path:
    """A copy of the chart, version 0.1.1, whose RunnerPool CRD carries a new description."""
    chart = tmp / "helmhive"
    shutil.copytree(CHART, chart)
    (chart / "Chart.yaml").write_text(
        (chart / "Chart.yaml").read_text(encoding="utf-8").replace("version: 0.1.0", "version: 0.1.1"),
        encoding="utf-8",
    )
    crd = chart / "templates" / "crds" / "runnerpools.helmhive.dev.yaml"
    text = crd.read_text(encoding="utf-8")
    marker = "      openAPIV3Schema:\n        type: object\n        description: "
    assert marker in text
    crd.write_text(text.replace(marker, marker + "UPGRADED ", 1), encoding="utf-8")
    return chart


def _runner_pool_description(cluster: Cluster) -> str:
    crd = cluster.get("crd", "runnerpools.helmhive.dev")
    description: str = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]
    return description


def test_install_upgrade_rollback_uninstall(helm: Path, fresh_cluster: devcluster.ClusterInfo, tmp_path: Path) -> None:
    cluster = Cluster(helm, fresh_cluster)

    # A wrong value: helm install refuses it before anything is created.
    err = cluster.helm_fails(
        "install", RELEASE, CHART, "-n", NS, "--create-namespace", "--set", "operator.logLevel=loud"
    )
    assert "at '/operator/logLevel': value must be one of 'info', 'debug'" in err
    assert not [c for c in cluster.get("crds")["items"] if c["spec"]["group"] == "helmhive.dev"]

    # Install: CRDs first, then RBAC, policies, the operator and its Services.
    out = cluster.helm("install", RELEASE, CHART, "-n", NS, "--create-namespace", "--wait=false")
    assert "STATUS: deployed" in out
    assert f"helm test {RELEASE} -n {NS}" in out  # NOTES.txt tells what to do next
    crds = [c for c in cluster.get("crds")["items"] if c["spec"]["group"] == "helmhive.dev"]
    assert len(crds) == len(KINDS)
    assert all(c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for c in crds)
    assert {
        "helmhive-envelopes-read-only",
        "helmhive-runner-identity",
        "helmhive-runner-execution",
        "helmhive-change-approval",
        "helmhive-audit-trail",
    } <= cluster.names("validatingadmissionpolicies")
    assert {"helmhive-operator", "helmhive-change-approver"} <= cluster.names("clusterroles")
    assert {"helmhive-webhook", "helmhive-metrics"} <= cluster.names("services", "-n", NS)
    assert _operator_args(cluster)[-1] == f"--webhook-service-namespace={NS}"
    assert wait_for(lambda: _revision(cluster) == "1", timeout=60, describe="the Deployment's first rollout")

    # The installed policy is live: even the cluster admin cannot create an envelope.
    envelope = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "Envelope",
        "metadata": {"name": "connection-test"},
        "spec": {
            "jobKind": "connection-test",
            "class": "probe",
            "description": "x",
            "maxTools": ["think"],
            "filesystem": "none",
            "network": "disabled",
            "outputContract": {"format": "text"},
            "sessionPolicies": ["fresh"],
            "memory": "forbidden",
        },
    }

    def denied() -> str:
        proc = cluster.kubectl("create", "-f", "-", stdin=json.dumps(envelope))
        assert proc.returncode != 0, "the envelope was created"
        assert "envelopes are read-only" in proc.stderr
        return proc.stderr

    assert "may not create envelope connection-test" in wait_for(denied, timeout=60, describe="the policy to deny")

    # Upgrade with a changed value: the Deployment's pod template changes and rolls out.
    cluster.helm(
        "upgrade", RELEASE, CHART, "-n", NS, "--reuse-values", "--set", "operator.logLevel=debug",
        "--set", "operator.routing.workers=4", "--wait=false",
    )  # fmt: skip
    assert "--verbose" in _operator_args(cluster)
    assert _workers(cluster) == "4"
    wait_for(lambda: _revision(cluster) == "2", timeout=60, describe="the Deployment to roll out revision 2")

    # Upgrade to a chart whose CRD changed (and declare a RunnerPool, now that its CRD exists):
    # the CRDs are templates, so helm upgrade applies the new CRD.
    original = _runner_pool_description(cluster)
    changed = _chart_with_a_changed_crd(tmp_path)
    cluster.helm(
        "upgrade", RELEASE, changed, "-n", NS, "--reuse-values", "-f", EXAMPLES / "runner-pools.yaml", "--wait=false"
    )  # fmt: skip
    assert _runner_pool_description(cluster) == "UPGRADED " + original
    pool = cluster.get("runnerpool", "reference", "-n", NS)
    assert pool["spec"]["image"] == "ghcr.io/helmhive/runner:0.1.0"

    # Rollback to the first revision: the values, the CRD and the pools are as they were.
    cluster.helm("rollback", RELEASE, "1", "-n", NS)
    assert "--verbose" not in _operator_args(cluster)
    assert _workers(cluster) == "8"
    assert _runner_pool_description(cluster) == original
    wait_for(lambda: not cluster.exists("runnerpool", "reference", "-n", NS), timeout=60, describe="the pool deleted")
    history = cluster.helm("history", RELEASE, "-n", NS, "-o", "json")
    assert [h["description"] for h in json.loads(history)][-1] == "Rollback to 1"

    # A team's object, to see what uninstall leaves.
    cluster.kubectl("create", "namespace", "team-a")
    workspace = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": "shop", "namespace": "team-a"},
        "spec": {"repository": {"url": "https://git.example.com/shop.git"}},
    }
    created = cluster.kubectl("create", "-f", "-", stdin=json.dumps(workspace))
    assert created.returncode == 0, created.stderr

    # Uninstall: the CRDs (so every Helmhive object) and the namespace stay; the rest goes.
    out = cluster.helm("uninstall", RELEASE, "-n", NS)
    assert "These resources were kept due to the resource policy" in out
    assert len([c for c in cluster.get("crds")["items"] if c["spec"]["group"] == "helmhive.dev"]) == len(KINDS)
    assert cluster.exists("workspace", "shop", "-n", "team-a")
    assert cluster.exists("namespace", NS)
    selector = f"app.kubernetes.io/instance={RELEASE}"
    assert cluster.get("clusterroles,clusterrolebindings", "-l", selector)["items"] == []
    assert cluster.get("validatingadmissionpolicies,validatingadmissionpolicybindings", "-l", selector)["items"] == []
    assert cluster.get("deployments,services,serviceaccounts", "-n", NS, "-l", selector)["items"] == []


def test_the_operator_runs_as_the_charts_identity_and_passes_the_helm_test_checks(
    helm: Path, fresh_cluster: devcluster.ClusterInfo, tmp_path: Path
) -> None:
    """The chart's RBAC and policies are enough for the real operator, and the helm test script passes.

    No kubelet runs here, so the operator runs as a local process with a token of the chart's
    ServiceAccount, and the script of the ``helm test`` pod runs against its local ports.
    """
    cluster = Cluster(helm, fresh_cluster)
    cluster.helm("install", RELEASE, CHART, "-n", NS, "--create-namespace", "--wait=false")
    api = config.new_client_from_config(str(fresh_cluster.kubeconfig))
    token = mint_token(client.CoreV1Api(api), NS, "helmhive-operator", expiration_seconds=3600)
    kubeconfig = token_kubeconfig(fresh_cluster.kubeconfig, token, tmp_path / "kubeconfig", user="helmhive-operator")
    operator = OperatorProcess(
        kubeconfig=kubeconfig,
        log_path=tmp_path / "operator.log",
        port=free_port(),
        webhook_port=free_port(),
        metrics_port=free_port(),
        extra_env={"HELMHIVE_NAMESPACE": NS, "HELMHIVE_SERVICE_ACCOUNT": "helmhive-operator"},
    )
    script = CHART / "files" / "helm-test.py"
    urls = f"{operator.metrics_url} https://127.0.0.1:{operator.webhook_port}/"
    try:
        operator.start()
        # The operator, as the chart's ServiceAccount, publishes the envelopes nobody else may write.
        wait_for(
            lambda: len(cluster.names("envelopes")) == 7, timeout=60, describe="the operator to publish seven envelopes"
        )
        env = {**os.environ, "HELMHIVE_TEST_URLS": urls, "HELMHIVE_TEST_TIMEOUT": "30"}
        proc = subprocess.run(
            [sys.executable, script], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{operator.metrics_url}: HTTP 200" in proc.stdout
        assert f"https://127.0.0.1:{operator.webhook_port}/: HTTP " in proc.stdout
    finally:
        operator.stop()
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            cluster.kubectl("delete", kind, "helmhive.dev", "--ignore-not-found")
        api.close()
    # With the operator gone, the same check fails.
    env = {**os.environ, "HELMHIVE_TEST_URLS": urls, "HELMHIVE_TEST_TIMEOUT": "2"}
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert "no answer" in proc.stdout
    cluster.helm("uninstall", RELEASE, "-n", NS)

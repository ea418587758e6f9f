"""The chart's life on a real API server: install, upgrade, rollback and uninstall with a real helm.

A control plane of the module's own (``fresh_cluster``: etcd, kube-apiserver and
kube-controller-manager, no kubelet), so pods never start: the tests assert the objects and
what the API server and the controllers do with them, and run the real operator process
as the ServiceAccount the chart made, behind the chart's webhook Service. Both tests use the
release name ``helmhive`` and uninstall it at the end (the CRDs stay, and the next install
adopts them; the webhook configurations the operator made are deleted by the test, as
docs/install.md tells users to).
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
from harness.operator import OperatorProcess, free_port, host_ip
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
        "helmhive-session-compactions",
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

    # A RunnerPool spec the CRD refuses: the API server names the field, nothing is created.
    err = cluster.helm_fails(
        "upgrade", RELEASE, CHART, "-n", NS, "--reuse-values", "-f", EXAMPLES / "runner-pools.yaml",
        "--set", "runnerPools[0].spec.concurrency=0", "--wait=false",
    )  # fmt: skip
    assert 'RunnerPool.helmhive.dev "reference" is invalid' in err
    assert "spec.concurrency: Invalid value: 0: spec.concurrency in body should be greater than or equal to 1" in err
    assert not cluster.exists("runnerpool", "reference", "-n", NS)

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

    # The same release name installs again over the kept CRDs (Helm takes them over).
    out = cluster.helm("install", RELEASE, CHART, "-n", NS, "--wait=false")
    assert "STATUS: deployed" in out
    assert cluster.exists("workspace", "shop", "-n", "team-a")
    cluster.helm("uninstall", RELEASE, "-n", NS)


def _helm_test_script(urls: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the ``helm test`` pod's script here, as the pod does (``python3 -c <script>``)."""
    script = (CHART / "files" / "helm-test.py").read_text(encoding="utf-8")
    env = {**os.environ, "HELMHIVE_TEST_URLS": urls, "HELMHIVE_TEST_TIMEOUT": str(timeout)}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _profile(name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "envelope": "review-probe",
        "purpose": "Review small diffs.",
        "instructions": "Look for bugs.",
        "providerMappings": [{"provider": "anthropic", "model": "claude-sonnet-4-5"}],
        **spec,
    }
    return {"apiVersion": "helmhive.dev/v1alpha1", "kind": "Profile", "metadata": {"name": name}, "spec": body}


def test_the_operator_runs_as_the_charts_identity_behind_the_charts_webhook_service(
    helm: Path, fresh_cluster: devcluster.ClusterInfo, tmp_path: Path
) -> None:
    """The chart's RBAC, policies, Service and operator flags work with the real operator.

    No kubelet runs here, so the operator runs as a local process with a token of the chart's
    ServiceAccount and the webhook flags of the chart's Deployment; an EndpointSlice (what the
    EndpointSlice controller writes for a ready pod) points the chart's webhook Service at it on
    this host's address, and kube-apiserver (--enable-aggregator-routing) dials it there. The
    script of the ``helm test`` pod then runs against the operator's ports.
    """
    cluster = Cluster(helm, fresh_cluster)
    cluster.helm("install", RELEASE, CHART, "-n", NS, "--create-namespace", "--wait=false")
    service_args = [a for a in _operator_args(cluster) if a.startswith("--webhook-service-")]
    assert service_args == ["--webhook-service-name=helmhive-webhook", f"--webhook-service-namespace={NS}"]
    api = config.new_client_from_config(str(fresh_cluster.kubeconfig))
    token = mint_token(client.CoreV1Api(api), NS, "helmhive-operator", expiration_seconds=3600)
    kubeconfig = token_kubeconfig(fresh_cluster.kubeconfig, token, tmp_path / "kubeconfig", user="helmhive-operator")
    address = host_ip()
    operator = OperatorProcess(
        kubeconfig=kubeconfig,
        log_path=tmp_path / "operator.log",
        port=free_port(),
        webhook_port=free_port(),
        metrics_port=free_port(),
        webhook_addr=address,
        extra_env={"HELMHIVE_NAMESPACE": NS, "HELMHIVE_SERVICE_ACCOUNT": "helmhive-operator"},
        extra_args=service_args,
    )
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "helmhive-webhook-local",
            "namespace": NS,
            "labels": {
                "kubernetes.io/service-name": "helmhive-webhook",
                "endpointslice.kubernetes.io/managed-by": "tests.helmhive.dev",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": operator.webhook_port, "protocol": "TCP"}],
    }
    urls = f"{operator.metrics_url} https://{address}:{operator.webhook_port}/"
    try:
        operator.start()
        created = cluster.kubectl("create", "-f", "-", stdin=json.dumps(slice_))
        assert created.returncode == 0, created.stderr
        # As the chart's ServiceAccount, it publishes the envelopes nobody else may write.
        wait_for(lambda: len(cluster.names("envelopes")) == 7, timeout=60, describe="seven envelopes")
        # Through the chart's Service: a widening Profile is refused, a narrow one admitted.
        wide = _profile("too-wide", envelope="change-review", filesystem="write", tools=["read", "edit"])

        def refused() -> str:
            proc = cluster.kubectl("create", "-n", NS, "-f", "-", stdin=json.dumps(wide))
            assert proc.returncode != 0, "the widening profile was admitted"
            assert "spec.filesystem: FilesystemWiderThanEnvelope" in proc.stderr, proc.stderr
            return proc.stderr

        wait_for(refused, timeout=60, describe="the webhook to refuse a widening profile through the Service")
        narrow = cluster.kubectl("create", "-n", NS, "-f", "-", stdin=json.dumps(_profile("narrow")))
        assert narrow.returncode == 0, narrow.stderr
        configs = cluster.get("validatingwebhookconfiguration", "helmhive.dev")
        assert {w["clientConfig"]["service"]["name"] for w in configs["webhooks"]} == {"helmhive-webhook"}
        # The helm test pod's script passes against the operator (the metrics answer 200).
        proc = _helm_test_script(urls, timeout=30)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{operator.metrics_url}: HTTP 200" in proc.stdout
        assert f"https://{address}:{operator.webhook_port}/: HTTP " in proc.stdout
    finally:
        operator.stop()
        api.close()
    # With the operator gone, the same check fails.
    proc = _helm_test_script(urls, timeout=2)
    assert proc.returncode == 1
    assert "no answer" in proc.stdout

    # Uninstall: the Service goes, and with it (garbage collection) the certificate Secret the
    # operator made; the webhook configurations the operator made stay and, failurePolicy Fail,
    # refuse Profile writes until they are deleted (docs/install.md, Uninstall).
    cluster.helm("uninstall", RELEASE, "-n", NS)
    wait_for(lambda: not cluster.exists("secret", "helmhive-webhook-cert", "-n", NS), timeout=60, describe="GC")
    blocked = cluster.kubectl("create", "-n", NS, "-f", "-", stdin=json.dumps(_profile("after-uninstall")))
    assert blocked.returncode != 0
    assert 'failed calling webhook "profile-narrowing.helmhive.dev"' in blocked.stderr
    deleted = cluster.kubectl(
        "delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", "helmhive.dev", "--ignore-not-found"
    )
    assert deleted.returncode == 0, deleted.stderr
    after = cluster.kubectl("create", "-n", NS, "-f", "-", stdin=json.dumps(_profile("after-cleanup")))
    assert after.returncode == 0, after.stderr

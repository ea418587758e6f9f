"""The Helm chart: lints, renders exactly the objects the tests install, and installs on a real API server.

The chart is generated from the same builders (``helmhive crds generate``), so a rendered
chart must equal :func:`build_install_manifests` for the release namespace. The install test
uses its own fresh local control plane, because Helm will not adopt objects that the
session's harness created.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.wait import wait_for
from helmhive.api.kinds import KINDS
from helmhive.deploy.chart import build_operator_deployment
from helmhive.deploy.manifests import OperatorIdentity, build_install_manifests
from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import BuildError, ensure_binaries
from helmhive.devcluster.helm import ensure_helm

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "helmhive"
KUBE_VERSION = "1.37.2"


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log_path = tmp_path_factory.mktemp("helm") / "build.log"
    with log_path.open("w", encoding="utf-8") as log:
        try:
            return ensure_helm(log=log)
        except BuildError as err:
            pytest.fail(f"{err}\n{log_path.read_text()[-4000:]}", pytrace=False)


def _run(*cmd: str | Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _strip(doc: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    out["metadata"].pop("labels", None)
    return out


def test_chart_lints(helm: Path) -> None:
    out = _run(helm, "lint", CHART, "--kube-version", KUBE_VERSION)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_chart_renders_exactly_the_installed_objects(helm: Path) -> None:
    rendered = [
        d
        for d in yaml.safe_load_all(
            _run(
                helm, "template", "hh", CHART, "-n", "platform", "--kube-version", KUBE_VERSION, "--set", "image.tag=t1"
            )
        )
        if d
    ]
    identity = OperatorIdentity(namespace="platform")
    expected = [d for d in build_install_manifests(identity) if d["kind"] != "Namespace"]
    expected.append(build_operator_deployment(identity, image="ghcr.io/helmhive/helmhive:t1"))
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, rendered)) == sorted(map(key, expected))
    by_key = {key(d): _strip(d) for d in rendered}
    for doc in expected:
        assert by_key[key(doc)] == _strip(doc), key(doc)
    deployment = by_key[("Deployment", "helmhive-operator")]["spec"]["template"]["spec"]
    container = deployment["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["securityContext"]["runAsNonRoot"] is True


def test_the_grafana_dashboard_configmap_is_off_by_default_and_holds_the_dashboard(helm: Path) -> None:
    args = [helm, "template", "hh", CHART, "-n", "platform", "--kube-version", KUBE_VERSION]
    name = "helmhive-grafana-dashboard"
    assert name not in {d["metadata"]["name"] for d in yaml.safe_load_all(_run(*args)) if d}
    on = [d for d in yaml.safe_load_all(_run(*args, "--set", "metrics.grafanaDashboard.enabled=true")) if d]
    (config_map,) = [d for d in on if d["metadata"]["name"] == name]
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["namespace"] == "platform"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["helmhive.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "helmhive.json").read_text(encoding="utf-8"))
    assert dashboard["uid"] == "helmhive"


@pytest.fixture(scope="module")
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devcluster.ClusterInfo]:
    workdir = tmp_path_factory.mktemp("chart-cluster")
    with (workdir / "build.log").open("w", encoding="utf-8") as log:
        binaries = ensure_binaries(log=log)
    try:
        info = devcluster.start(binaries, workdir / "state", tie_to_parent=True)
    except devcluster.ClusterError as err:
        pytest.fail(f"second control plane did not start: {err}", pytrace=False)
    try:
        yield info
    finally:
        devcluster.stop(workdir / "state")


def test_chart_installs_on_a_real_api_server(helm: Path, fresh_cluster: devcluster.ClusterInfo) -> None:
    kubeconfig = str(fresh_cluster.kubeconfig)
    kubectl = [str(fresh_cluster.kubectl), f"--kubeconfig={kubeconfig}"]
    out = _run(helm, "install", "helmhive", CHART, "--kubeconfig", kubeconfig, "-n", "platform", "--create-namespace")
    assert "STATUS: deployed" in out
    crds = json.loads(_run(*kubectl, "get", "crds", "-o", "json"))["items"]
    assert len([c for c in crds if c["spec"]["group"] == "helmhive.dev"]) == len(KINDS)
    policies = json.loads(_run(*kubectl, "get", "validatingadmissionpolicies", "-o", "json"))["items"]
    assert "helmhive-envelopes-read-only" in {p["metadata"]["name"] for p in policies}
    deployment = json.loads(_run(*kubectl, "get", "deployment", "helmhive-operator", "-n", "platform", "-o", "json"))
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "helmhive-operator"
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
        proc = subprocess.run(
            [*kubectl, "create", "-f", "-"], input=json.dumps(envelope), capture_output=True, text=True, check=False
        )
        return proc.stderr if proc.returncode != 0 and "envelopes are read-only" in proc.stderr else ""

    assert "may not create envelope connection-test" in wait_for(denied, timeout=60, describe="the policy to deny")
    _run(helm, "uninstall", "helmhive", "--kubeconfig", kubeconfig, "-n", "platform")
    remaining = json.loads(_run(*kubectl, "get", "clusterroles", "-l", "app.kubernetes.io/name=helmhive", "-o", "json"))
    assert remaining["items"] == []

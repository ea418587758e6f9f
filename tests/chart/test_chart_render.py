"""The chart renders exactly the objects the tests install, and every value does what it says.

``helm template`` (a real helm) renders the chart; the default render must equal
:func:`build_install_manifests` and the generated CRDs, object for object (labels may add to
the builders'), plus the operator's Deployment and its two Services, nothing else.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from chart_rig import (
    CHART,
    EXAMPLES,
    KUBE_VERSION,
    REPO,
    by_key,
    helm_fails,
    key,
    non_hooks,
    render,
    run,
    template_fails,
)
from typer.testing import CliRunner

from helmhive.api.crdgen import build_crds
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.cli.crds import app, decide_drift
from helmhive.cli.main import app as main_app
from helmhive.controller.router.handlers import RouterSettings
from helmhive.deploy.manifests import OperatorIdentity, build_install_manifests
from helmhive.policy.runners.pool import parse_cluster_cidrs

Doc = dict[str, Any]
RUNNER_POOL_API = "helmhive.dev/v1alpha1/RunnerPool"


def _without_metadata_extras(doc: Doc) -> Doc:
    out: Doc = json.loads(json.dumps(doc))
    out["metadata"].pop("labels", None)
    out["metadata"].pop("annotations", None)
    return out


def _assert_same_objects(rendered: list[Doc], expected: list[Doc]) -> None:
    index = by_key(rendered)
    for doc in expected:
        got = index[key(doc)]
        assert _without_metadata_extras(got) == _without_metadata_extras(doc), key(doc)
        assert doc["metadata"].get("labels", {}).items() <= got["metadata"]["labels"].items(), key(doc)
        assert (doc["metadata"].get("annotations") or {}).items() <= (got["metadata"].get("annotations") or {}).items()


def _install_objects(namespace: str, service_account: str) -> list[Doc]:
    identity = OperatorIdentity(namespace=namespace, service_account=service_account)
    return [d for d in build_install_manifests(identity) if d["kind"] != "Namespace"]


def _deployment(docs: list[Doc]) -> Doc:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return deployment


def _container(docs: list[Doc]) -> Doc:
    container: Doc = _deployment(docs)["spec"]["template"]["spec"]["containers"][0]
    return container


def _env(container: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_chart_lints(helm: Path) -> None:
    out = run(helm, "lint", CHART, "--strict", "--kube-version", KUBE_VERSION)
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    # runner-pools.yaml needs the RunnerPool API, which `helm lint` cannot be told about; it is
    # rendered in test_runner_pools_from_values and installed in test_chart_install.
    for values in ("production.yaml", "cert-manager.yaml"):
        out = run(helm, "lint", CHART, "--strict", "--kube-version", KUBE_VERSION, "-f", EXAMPLES / values)
        assert "0 chart(s) failed" in out, values


def test_the_default_render_is_exactly_the_installed_objects_plus_the_operator(helm: Path) -> None:
    docs = non_hooks(render(helm))
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    install = _install_objects("platform", "helmhive-operator")
    chart_only = {("Deployment", "helmhive-operator"), ("Service", "helmhive-webhook"), ("Service", "helmhive-metrics")}
    assert sorted(map(key, docs)) == sorted([*map(key, install), *map(key, build_crds().values()), *chart_only])
    _assert_same_objects(docs, install)
    _assert_same_objects(crds, list(build_crds().values()))
    for crd in crds:  # kept by `helm uninstall` by default (crds.keep)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == "helmhive"
        if doc["kind"] in {"Deployment", "Service", "ServiceAccount"}:
            assert doc["metadata"]["namespace"] == "platform", key(doc)


def test_the_policies_trust_the_service_account_the_release_creates(helm: Path) -> None:
    # Release "hh": the base name is hh-helmhive, and so is the operator's identity.
    docs = non_hooks(render(helm, release="hh", namespace="ops"))
    _assert_same_objects(docs, _install_objects("ops", "hh-helmhive-operator"))
    assert _env(_container(docs))["HELMHIVE_SERVICE_ACCOUNT"] == "hh-helmhive-operator"
    # An existing ServiceAccount: none is created, RBAC and the policies name it.
    docs = non_hooks(render(helm, "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops-bot"))
    expected = [d for d in _install_objects("platform", "ops-bot") if d["kind"] != "ServiceAccount"]
    _assert_same_objects(docs, expected)
    assert "ServiceAccount" not in {d["kind"] for d in docs}
    assert _deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"] == "ops-bot"
    # No RBAC: the ClusterRoles and the binding are the platform team's to make.
    kinds = {key(d) for d in render(helm, "--set", "rbac.create=false")}
    assert not {k for k in kinds if k[0] in {"ClusterRole", "ClusterRoleBinding"}}
    err = template_fails(helm, "--set", "serviceAccount.create=false")
    assert "serviceAccount.name: required when serviceAccount.create is false" in err


def test_the_default_operator_is_restricted_and_wired_to_its_services(helm: Path) -> None:
    docs = render(helm)
    deployment = _deployment(docs)
    pod = deployment["spec"]["template"]["spec"]
    container = _container(docs)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert container["image"] == "ghcr.io/helmhive/helmhive:0.1.0"  # appVersion
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["args"] == [
        "operator",
        "run",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--revision-history=10",
        "--reference-wait-seconds=600",
        "--retry-window-seconds=900",
        "--metrics-port=9090",
        "--webhook-port=9443",
        "--webhook-service-name=helmhive-webhook",
        "--webhook-service-namespace=platform",
    ]
    defaults = RouterSettings()
    env = _env(container)
    assert env["HELMHIVE_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert (env["HELMHIVE_ROUTING_WORKERS"], env["HELMHIVE_ROUTING_QPS"], env["HELMHIVE_ROUTING_BURST"]) == (
        str(defaults.workers),
        str(int(defaults.qps)),
        str(defaults.burst),
    )
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "health": 8080,
        "metrics": 9090,
        "webhook": 9443,
    }
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    index = by_key(docs)
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    webhook = index[("Service", "helmhive-webhook")]["spec"]
    assert webhook["selector"] == selector
    assert webhook["ports"] == [{"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert index[("Service", "helmhive-metrics")]["spec"]["ports"][0]["targetPort"] == "metrics"
    assert ("ServiceMonitor", "helmhive-metrics") not in index  # no Prometheus Operator API: auto renders none


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="defaults"),
        pytest.param(["-f", str(EXAMPLES / "production.yaml")], id="production"),
        pytest.param(["-f", str(EXAMPLES / "cert-manager.yaml")], id="cert-manager"),
        pytest.param(["--set", "operator.replicas=2"], id="two-replicas"),
        pytest.param(["--set", "webhook.enabled=false", "--set", "metrics.enabled=false"], id="all-off"),
    ],
)
def test_helmhive_operator_run_accepts_every_argument_the_chart_renders(helm: Path, values: list[str]) -> None:
    args = _container(render(helm, *values))["args"]
    assert args[:2] == ["operator", "run"]
    cli = typer.main.get_command(main_app)
    run_command = cli.commands["operator"].commands["run"]  # type: ignore[attr-defined]
    with run_command.make_context("run", list(args[2:])) as context:  # parses, runs nothing
        assert context.params["liveness"] == "http://0.0.0.0:8080/healthz"


def test_runner_cluster_cidrs_reach_the_operator_and_the_schema_checks_them(helm: Path) -> None:
    # Empty by default: no flag at all (the default operator's arguments are pinned above).
    cidrs = ["10.244.0.0/16", "fd00:10:244::/56"]
    args = _container(render(helm, "--set-json", f"runnerNetworkPolicy.clusterCIDRs={json.dumps(cidrs)}"))["args"]
    assert [a for a in args if a.startswith("--runner-")] == ["--runner-cluster-cidrs=10.244.0.0/16,fd00:10:244::/56"]
    # The operator parses what the chart renders into the networks every pool's policy excepts.
    run_command = typer.main.get_command(main_app).commands["operator"].commands["run"]  # type: ignore[attr-defined]
    with run_command.make_context("run", list(args[2:])) as context:
        assert parse_cluster_cidrs(context.params["runner_cluster_cidrs"]) == tuple(map(ipaddress.ip_network, cidrs))
    refused = {
        "10.244.0.0": "at '/runnerNetworkPolicy/clusterCIDRs/0': '10.244.0.0' does not match pattern",
        "10.244.0.0/33": "at '/runnerNetworkPolicy/clusterCIDRs/0': '10.244.0.0/33' does not match pattern",
        "0.0.0.0/0": "at '/runnerNetworkPolicy/clusterCIDRs/0': '0.0.0.0/0' does not match pattern",
        "pods": "at '/runnerNetworkPolicy/clusterCIDRs/0': 'pods' does not match pattern",
    }
    for value, message in refused.items():
        err = template_fails(helm, "--set-json", f"runnerNetworkPolicy.clusterCIDRs={json.dumps([value])}")
        assert "values don't meet the specifications of the schema" in err, value
        assert message in err, err
    err = template_fails(helm, "--set", "runnerNetworkPolicy.clusterCIDRs=10.244.0.0/16")
    assert "at '/runnerNetworkPolicy/clusterCIDRs': got string, want array" in err
    err = template_fails(helm, "--set-json", 'runnerNetworkPolicy.clusterCidrs=["10.244.0.0/16"]')
    assert "at '/runnerNetworkPolicy': additional properties 'clusterCidrs' not allowed" in err


def test_production_values_reach_every_object(helm: Path) -> None:
    docs = render(helm, "-f", EXAMPLES / "production.yaml")
    values = yaml.safe_load((EXAMPLES / "production.yaml").read_text(encoding="utf-8"))
    op = values["operator"]
    deployment = _deployment(docs)
    pod = deployment["spec"]["template"]["spec"]
    container = _container(docs)
    assert container["image"] == "registry.example.com/helmhive/helmhive:0.1.0"
    assert pod["imagePullSecrets"] == [{"name": "registry-example-com"}]
    assert pod["nodeSelector"] == op["nodeSelector"]
    assert pod["tolerations"] == op["tolerations"]
    assert pod["affinity"] == op["affinity"]
    assert pod["priorityClassName"] == "platform-critical"
    assert container["resources"] == op["resources"]
    assert "--verbose" in container["args"]
    assert "--revision-history=20" in container["args"]
    assert "--retry-window-seconds=1800" in container["args"]
    env = _env(container)
    assert (env["HELMHIVE_ROUTING_WORKERS"], env["HELMHIVE_ROUTING_QPS"], env["HELMHIVE_ROUTING_BURST"]) == (
        "16",
        "400",
        "800",
    )
    assert env["HTTPS_PROXY"] == "http://proxy.example.com:3128"
    template = deployment["spec"]["template"]["metadata"]
    assert template["labels"]["sidecar.istio.io/inject"] == "false"
    assert template["annotations"] == op["podAnnotations"]
    index = by_key(docs)
    assert index[("ServiceAccount", "helmhive-operator")]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    monitor = index[("ServiceMonitor", "helmhive-metrics")]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    metrics_service = index[("Service", "helmhive-metrics")]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service.items()
    assert ("ConfigMap", "helmhive-grafana-dashboard") in index
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "platform", key(doc)
        if "helm.sh/hook" not in (doc["metadata"].get("annotations") or {}):
            assert doc["metadata"]["annotations"]["owner"] == "platform@example.com", key(doc)


def test_cert_manager_issues_the_webhook_certificate(helm: Path) -> None:
    docs = render(helm, "-f", EXAMPLES / "cert-manager.yaml")
    index = by_key(docs)
    issuer = index[("Issuer", "helmhive-webhook-selfsigned")]
    assert issuer["spec"] == {"selfSigned": {}}
    certificate = index[("Certificate", "helmhive-webhook-tls")]["spec"]
    assert certificate["secretName"] == "helmhive-webhook-tls"
    assert "helmhive-webhook.platform.svc" in certificate["dnsNames"]
    assert certificate["issuerRef"] == {
        "name": "helmhive-webhook-selfsigned",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    container = _container(docs)
    assert "--webhook-cert-dir=/etc/helmhive/webhook-tls" in container["args"]
    assert {"name": "webhook-tls", "mountPath": "/etc/helmhive/webhook-tls", "readOnly": True} in container[
        "volumeMounts"
    ]
    volumes = _deployment(docs)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-tls", "secret": {"secretName": "helmhive-webhook-tls", "defaultMode": 0o440}} in volumes
    # Your own issuer: no Issuer is rendered, the Certificate names yours.
    docs = render(
        helm,
        "-f",
        EXAMPLES / "cert-manager.yaml",
        "--set",
        "webhook.certificate.certManager.issuerRef.name=internal-ca",
        "--set",
        "webhook.certificate.certManager.issuerRef.kind=ClusterIssuer",
    )
    assert "Issuer" not in {d["kind"] for d in docs}
    (certificate,) = [d for d in docs if d["kind"] == "Certificate"]
    assert certificate["spec"]["issuerRef"] == {"name": "internal-ca", "kind": "ClusterIssuer"}


def test_webhook_and_metrics_switch_off(helm: Path) -> None:
    docs = render(helm, "--set", "webhook.enabled=false", "--set", "metrics.enabled=false")
    container = _container(docs)
    assert "--no-webhooks" in container["args"]
    assert "--metrics-port=0" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--webhook-")]
    assert {p["name"] for p in container["ports"]} == {"health"}
    assert "Service" not in {d["kind"] for d in docs}
    assert "Pod" not in {d["kind"] for d in docs}  # `helm test` has nothing to check


def test_a_service_monitor_renders_when_the_prometheus_operator_is_there_or_asked_for(helm: Path) -> None:
    api = ["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"]
    assert "ServiceMonitor" in {d["kind"] for d in render(helm, *api)}
    assert "ServiceMonitor" not in {
        d["kind"] for d in render(helm, *api, "--set", "metrics.serviceMonitor.enabled=false")
    }
    assert "ServiceMonitor" in {d["kind"] for d in render(helm, "--set", "metrics.serviceMonitor.enabled=true")}
    assert "ServiceMonitor" not in {d["kind"] for d in render(helm, *api, "--set", "metrics.enabled=false")}


def test_the_crds_can_be_left_to_someone_else(helm: Path) -> None:
    docs = render(helm, "--set", "crds.enabled=false")
    assert "CustomResourceDefinition" not in {d["kind"] for d in docs}
    kept = [d for d in render(helm, "--set", "crds.keep=false") if d["kind"] == "CustomResourceDefinition"]
    assert kept
    assert all("helm.sh/resource-policy" not in d["metadata"]["annotations"] for d in kept)


def test_runner_pools_from_values(helm: Path) -> None:
    values = EXAMPLES / "runner-pools.yaml"
    docs = render(helm, "-f", values, "--api-versions", RUNNER_POOL_API)
    pool, job_pods = [d for d in docs if d["kind"] == "RunnerPool"]
    # The example shows both execution modes, each a valid pool.
    assert "execution" not in pool["spec"]
    assert job_pods["spec"]["execution"] == {"mode": "JobPod", "warmPods": 1}
    for doc in (pool, job_pods):
        RunnerPoolSpec.model_validate(doc["spec"])
    assert pool["metadata"]["namespace"] == "helmhive-system"
    assert pool["spec"]["image"] == "ghcr.io/helmhive/runner:0.1.0"
    assert pool["spec"]["imagePullPolicy"] == "IfNotPresent"
    assert pool["spec"]["adapter"] == {"type": "acp", "acp": {"command": "helmhive-reference-agent"}}
    own = render(helm, "-f", values, "--api-versions", RUNNER_POOL_API, "--set-json", _pool_with_image())
    assert [d["spec"]["image"] for d in own if d["kind"] == "RunnerPool"] == ["registry.example.com/runner:1"]
    # runner.imagePullSecrets is every declared pool's default; a pool's own list wins.
    assert "imagePullSecrets" not in pool["spec"]
    pulled = render(
        helm, "-f", values, "--api-versions", RUNNER_POOL_API, "--set-json", 'runner.imagePullSecrets=[{"name":"reg"}]'
    )
    assert [d["spec"]["imagePullSecrets"] for d in pulled if d["kind"] == "RunnerPool"] == [[{"name": "reg"}]] * 2
    # Helm cannot create a RunnerPool in the same install as the CRD: refused with the way out.
    err = template_fails(helm, "-f", values)
    assert "runnerPools: the RunnerPool CRD (helmhive.dev/v1alpha1) is not installed yet" in err
    assert "then add them with `helm upgrade`" in err


def _pool_with_image() -> str:
    spec = yaml.safe_load((EXAMPLES / "runner-pools.yaml").read_text(encoding="utf-8"))["runnerPools"][0]["spec"]
    pool = {"name": "own", "spec": {**spec, "image": "registry.example.com/runner:1"}}
    return "runnerPools=" + json.dumps([pool])


def test_two_replicas_elect_a_leader_and_roll_without_an_outage(helm: Path) -> None:
    docs = render(helm, "--set", "operator.replicas=2")
    deployment = _deployment(docs)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert _container(docs)["args"][-3:] == [
        "--leader-election",
        "--leader-election-namespace=platform",
        "--leader-election-lease-name=helmhive-operator",
    ]
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"] == {"minAvailable": 1, "selector": deployment["spec"]["selector"]}
    single = render(helm)
    assert "PodDisruptionBudget" not in {d["kind"] for d in single}
    assert not [a for a in _container(single)["args"] if a.startswith("--leader-election")]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        pytest.param("operator.replicas=two", "at '/operator/replicas': got string, want integer", id="wrong-type"),
        pytest.param(
            "operatr.replicas=1", "at '': additional properties 'operatr' not allowed", id="unknown-top-level-key"
        ),
        pytest.param(
            "webhook.certificate.source=vault",
            "at '/webhook/certificate/source': value must be one of 'self-managed', 'cert-manager'",
            id="bad-enum",
        ),
        pytest.param(
            "operator.logLevel=trace",
            "at '/operator/logLevel': value must be one of 'info', 'debug'",
            id="bad-log-level",
        ),
        pytest.param(
            "metrics.port=70000", "at '/metrics/port': maximum: got 70,000, want 65,535", id="port-out-of-range"
        ),
        pytest.param(
            "operator.image.digest=latest",
            "at '/operator/image/digest': 'latest' does not match pattern",
            id="bad-digest",
        ),
    ],
)
def test_the_schema_refuses_a_wrong_value(helm: Path, setting: str, message: str) -> None:
    err = template_fails(helm, "--set", setting)
    assert "values don't meet the specifications of the schema" in err
    assert message in err


def test_the_helm_test_pod_checks_both_services(helm: Path) -> None:
    docs = render(helm)
    release = non_hooks(docs)
    (pod,) = [d for d in docs if d not in release]
    assert pod["kind"] == "Pod"
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python3", "-c"]
    assert container["args"] == [(CHART / "files" / "helm-test.py").read_text(encoding="utf-8")]
    assert container["env"] == [
        {
            "name": "HELMHIVE_TEST_URLS",
            "value": "http://helmhive-metrics.platform.svc:9090/metrics https://helmhive-webhook.platform.svc:443/",
        }
    ]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_grafana_dashboard_configmap_is_off_by_default_and_holds_the_dashboard(helm: Path) -> None:
    name = "helmhive-grafana-dashboard"
    assert name not in {d["metadata"]["name"] for d in render(helm)}
    on = render(helm, "--set", "metrics.grafanaDashboard.enabled=true")
    (config_map,) = [d for d in on if d["metadata"]["name"] == name]
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["namespace"] == "platform"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["helmhive.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "helmhive.json").read_text(encoding="utf-8"))
    assert dashboard["uid"] == "helmhive"


def test_the_crd_templates_are_generated_and_helms_crds_dir_stays_empty(tmp_path: Path) -> None:
    assert [p for p in decide_drift(CHART.parents[1]) if "charts/" in p] == []
    result = CliRunner().invoke(app, ["generate", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert decide_drift(tmp_path) == []
    (tmp_path / "charts/helmhive/crds").mkdir()
    (tmp_path / "charts/helmhive/crds/profiles.helmhive.dev.yaml").write_text("{}\n")
    (tmp_path / "charts/helmhive/templates/crds/runners.helmhive.dev.yaml").write_text("# hand edited\n")
    problems = decide_drift(tmp_path)
    assert "stray: charts/helmhive/crds/profiles.helmhive.dev.yaml" in problems
    assert "differs: charts/helmhive/templates/crds/runners.helmhive.dev.yaml" in problems


def test_helm_template_needs_the_kube_version_as_docs_install_says(helm: Path) -> None:
    # helm template talks to no cluster and assumes an old Kubernetes: the chart's constraint refuses it.
    err = helm_fails(helm, "template", "hh", CHART)
    assert "chart requires kubeVersion: >=1.30.0-0 which is incompatible with Kubernetes v1.20.0" in err
    assert "--kube-version 1.33" in (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    assert run(helm, "template", "hh", CHART, "--kube-version", "1.30.0")

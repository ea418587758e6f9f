"""The real local control plane and the harness on top of it.

These run against whatever cluster the session has (see ``tests/harness``); the tests
of ``helmhive dev cluster`` itself need the local control plane.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from typer.testing import CliRunner

from harness import ClusterHandle, IdentityFactory, Kube, Kubectl, install_crds, wait_for
from harness.audit import ApiAuditLog
from helmhive.cli.main import app
from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import DEFAULT_KUBE_VERSION, cache_root

NEVER_PULLED = "registry.invalid/helmhive/never-runs:0"  # no kubelet here; the pod is only stored


def _status_of(err: ApiException) -> int:
    return int(err.status or 0)


def test_server_reports_the_built_version(cluster: ClusterHandle, api_client: client.ApiClient) -> None:
    version = client.VersionApi(api_client).get_code()
    if cluster.source == "local":
        assert version.git_version == DEFAULT_KUBE_VERSION == "v1.37.2"
        assert (version.major, version.minor) == ("1", "37")
    else:
        assert version.git_version.startswith("v1.")


def test_kubectl_from_the_cache_talks_to_the_server(cluster: ClusterHandle, kubectl: Kubectl) -> None:
    versions = kubectl.json("version")
    whoami = kubectl.json("auth", "whoami")
    if cluster.source == "local":
        assert kubectl.binary.is_relative_to(cache_root())
        assert versions["clientVersion"]["gitVersion"] == DEFAULT_KUBE_VERSION
        assert versions["serverVersion"]["gitVersion"] == DEFAULT_KUBE_VERSION
        assert whoami["status"]["userInfo"]["username"] == "helmhive-admin"
        assert "system:masters" in whoami["status"]["userInfo"]["groups"]
    names = kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert "namespace/kube-system" in names


def test_rbac_denies_an_unprivileged_service_account(
    namespace: str, kube: Kube, kubectl: Kubectl, service_account_identity: IdentityFactory
) -> None:
    who = service_account_identity(namespace, "nobody")
    as_nobody = client.CoreV1Api(who.api_client())

    with pytest.raises(ApiException) as denied:
        as_nobody.list_namespaced_secret(namespace)
    assert _status_of(denied.value) == 403  # authenticated (not 401), then refused by RBAC
    status = json.loads(denied.value.body)
    assert status["reason"] == "Forbidden"
    assert f'User "{who.username}" cannot list resource "secrets"' in status["message"]

    kube.rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="read-configmaps"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])],
        ),
    )
    kube.rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="nobody-reads-configmaps"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-configmaps"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="nobody", namespace=namespace)],
        ),
    )
    listed = wait_for(
        lambda: as_nobody.list_namespaced_config_map(namespace),
        timeout=30,
        describe="the RoleBinding to let the ServiceAccount list configmaps",
    )
    assert any(cm.metadata.name == "kube-root-ca.crt" for cm in listed.items)
    with pytest.raises(ApiException) as still_denied:
        as_nobody.list_namespaced_secret(namespace)
    assert _status_of(still_denied.value) == 403

    can_i = kubectl.as_user(who.kubeconfig)("auth", "can-i", "list", "secrets", "-n", namespace, check=False)
    assert (can_i.returncode, can_i.stdout.strip()) == (1, "no")


def test_pod_bound_token_carries_the_pod_in_its_user_info(
    namespace: str, core_v1: client.CoreV1Api, service_account_identity: IdentityFactory
) -> None:
    core_v1.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="runner"))
    )
    pod = core_v1.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="runner-0"),
            spec=client.V1PodSpec(
                service_account_name="runner",
                containers=[client.V1Container(name="runner", image=NEVER_PULLED)],
            ),
        ),
    )
    who = service_account_identity(namespace, "runner", bound_pod=pod, create=False)
    auth = client.AuthenticationV1Api(who.api_client())

    review = auth.create_self_subject_review(client.V1SelfSubjectReview())
    user = review.status.user_info
    assert user.username == f"system:serviceaccount:{namespace}:runner"
    assert user.extra["authentication.kubernetes.io/pod-name"] == ["runner-0"]
    assert user.extra["authentication.kubernetes.io/pod-uid"] == [pod.metadata.uid]

    core_v1.delete_namespaced_pod("runner-0", namespace, grace_period_seconds=0)

    def token_rejected() -> bool:
        with pytest.raises(ApiException) as err:
            auth.create_self_subject_review(client.V1SelfSubjectReview())
        assert _status_of(err.value) == 401
        return True

    wait_for(token_rejected, timeout=30, describe="the token to stop working once its pod is deleted")


def test_namespace_deletion_completes(core_v1: client.CoreV1Api) -> None:
    name = core_v1.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(generate_name="t-ns-deletion-"))
    ).metadata.name
    core_v1.create_namespaced_config_map(
        name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="content"), data={"k": "v"})
    )
    core_v1.delete_namespace(name)

    def gone() -> bool:
        with pytest.raises(ApiException) as err:
            core_v1.read_namespace(name)
        assert _status_of(err.value) == 404
        return True

    wait_for(gone, timeout=90, describe=f"namespace {name} to be finalized by the namespace controller")


def test_garbage_collector_deletes_dependents_of_a_deleted_owner(namespace: str, core_v1: client.CoreV1Api) -> None:
    owner = core_v1.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    reference = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core_v1.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="dependent", owner_references=[reference])),
    )
    core_v1.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="bystander")))
    core_v1.delete_namespaced_config_map("owner", namespace)

    def dependent_collected() -> bool:
        with pytest.raises(ApiException) as err:
            core_v1.read_namespaced_config_map("dependent", namespace)
        assert _status_of(err.value) == 404
        return True

    wait_for(dependent_collected, timeout=90, describe="the garbage collector to delete the dependent")
    assert core_v1.read_namespaced_config_map("bystander", namespace).metadata.name == "bystander"


def test_project_crds_are_established(crds: list[str], kube: Kube) -> None:
    for name in crds:
        crd = kube.apiextensions.read_custom_resource_definition(name)
        assert any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)


def test_install_crds_creates_serves_and_replaces(
    tmp_path: Path, api_client: client.ApiClient, custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.harness.helmhive.dev"},
        "spec": {
            "group": "harness.helmhive.dev",
            "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }
    (tmp_path / "widgets.yaml").write_text(yaml.safe_dump(crd), encoding="utf-8")
    apiext = client.ApiextensionsV1Api(api_client)
    try:
        assert install_crds(api_client, tmp_path) == ["widgets.harness.helmhive.dev"]
        assert install_crds(api_client, tmp_path) == ["widgets.harness.helmhive.dev"]  # replace path
        body = {
            "apiVersion": "harness.helmhive.dev/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {},
        }
        wait_for(
            lambda: custom_objects.create_namespaced_custom_object(
                "harness.helmhive.dev", "v1", namespace, "widgets", body
            ),
            timeout=30,
            describe="the Widget resource to be served",
        )
    finally:
        apiext.delete_custom_resource_definition("widgets.harness.helmhive.dev")


def test_dev_cluster_status_env_and_idempotent_start(cluster: ClusterHandle) -> None:
    if cluster.source != "local" or cluster.info is None:
        pytest.skip("exercises `helmhive dev cluster` on the local control plane; this session uses " + cluster.source)
    info = cluster.info
    report = devcluster.status(info.state_dir)
    assert [(c.name, c.running, c.healthy) for c in report.components] == [
        ("etcd", True, True),
        ("kube-apiserver", True, True),
        ("kube-controller-manager", True, True),
    ]
    assert info.start_seconds > 0

    runner = CliRunner()
    status = runner.invoke(app, ["dev", "cluster", "status", "--state-dir", str(info.state_dir)])
    assert status.exit_code == 0, status.output
    assert status.output.count("healthy") == 3
    env = runner.invoke(app, ["dev", "cluster", "env", "--state-dir", str(info.state_dir)])
    assert env.exit_code == 0, env.output
    assert f"export KUBECONFIG={info.kubeconfig}" in env.output
    assert f"export PATH={info.kubectl.parent}:" in env.output

    up = runner.invoke(app, ["dev", "cluster", "up", "--state-dir", str(info.state_dir)])
    assert up.exit_code == 0, up.output
    assert "already running" in up.output
    assert devcluster.load_info(info.state_dir) == info


def test_the_api_audit_log_names_who_read_helmhive_resources(
    cluster: ClusterHandle, kube: Kube, namespace: str, crds: list[str]
) -> None:
    audit = ApiAuditLog.of(cluster)
    kube.custom.list_namespaced_custom_object("helmhive.dev", "v1alpha1", namespace, "agentjobs")
    kube.core.list_namespaced_config_map(namespace)

    def mine() -> list[dict[str, Any]]:
        # A list of a just-installed CRD may be answered 429 and retried by the client.
        return [
            e
            for e in audit.events()
            if e.get("objectRef", {}).get("namespace") == namespace and e.get("responseStatus", {}).get("code") == 200
        ]

    events = wait_for(mine, timeout=30, describe="the list of AgentJobs in the audit log")
    # The policy keeps reads of helmhive.dev only: the ConfigMap list is not there.
    assert [(e["verb"], e["objectRef"]["resource"], e["stage"]) for e in events] == [
        ("list", "agentjobs", "ResponseComplete")
    ]
    assert events[0]["user"]["username"]

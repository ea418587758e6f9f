"""RunnerPools on a real API server with the real operator: owned objects, roll-outs, clean-up, columns."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pools import Pool, condition, make_pool

from harness.kube import IdentityFactory, Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.policy.runners.pool import PoolRef, build_role

OWNED = [
    ("ServiceAccount", "helmhive-runner-claude"),
    ("Role", "helmhive-runner-claude"),
    ("RoleBinding", "helmhive-runner-claude"),
    ("ConfigMap", "helmhive-runner-claude"),
    ("NetworkPolicy", "helmhive-runner-claude"),
    ("StatefulSet", "claude"),
]


def read(kube: Kube, kind: str, name: str, namespace: str) -> dict[str, Any]:
    """Read an owned object as a plain dict (camelCase), whatever its API group."""
    api: Any
    match kind:
        case "ServiceAccount":
            api, fn = kube.core, "read_namespaced_service_account"
        case "ConfigMap":
            api, fn = kube.core, "read_namespaced_config_map"
        case "Secret":
            api, fn = kube.core, "read_namespaced_secret"
        case "Role":
            api, fn = kube.rbac, "read_namespaced_role"
        case "RoleBinding":
            api, fn = kube.rbac, "read_namespaced_role_binding"
        case "StatefulSet":
            api, fn = kube.apps, "read_namespaced_stateful_set"
        case "NetworkPolicy":
            api, fn = client.NetworkingV1Api(kube.api_client), "read_namespaced_network_policy"
        case "PodDisruptionBudget":
            api, fn = client.PolicyV1Api(kube.api_client), "read_namespaced_pod_disruption_budget"
        case _:
            raise AssertionError(kind)
    obj: dict[str, Any] = kube.api_client.sanitize_for_serialization(getattr(api, fn)(name, namespace))
    return obj


def gone(kube: Kube, kind: str, name: str, namespace: str) -> bool:
    with pytest.raises(ApiException) as err:
        read(kube, kind, name, namespace)
    assert err.value.status == 404
    return True


def test_a_pool_creates_its_objects_owned_by_it(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=2)
    uid = pool.get()["metadata"]["uid"]
    objects = {kind: wait_for(lambda k=kind, n=name: read(kube, k, n, namespace), timeout=30) for kind, name in OWNED}
    objects["PodDisruptionBudget"] = wait_for(lambda: read(kube, "PodDisruptionBudget", "claude", namespace))
    for kind, obj in objects.items():
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in refs] == [
            ("RunnerPool", "claude", uid, True)
        ], kind
        assert obj["metadata"]["labels"]["helmhive.dev/pool"] == "claude"

    expected_role = build_role(PoolRef(name="claude", namespace=namespace, uid=uid), replicas=2)
    assert objects["Role"]["rules"] == [{k: v for k, v in rule.items() if v} for rule in expected_role["rules"]], (
        "the runner Role is exactly the contract plus execution"
    )
    for index in (0, 1):
        secret = wait_for(lambda i=index: read(kube, "Secret", f"helmhive-sessions-claude-{i}", namespace), timeout=30)
        assert secret["metadata"]["ownerReferences"][0]["uid"] == uid
        assert not secret.get("data")
    policy = objects["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert not policy.get("ingress"), "default-deny ingress"
    assert objects["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1

    config = json.loads(objects["ConfigMap"]["data"]["runner.json"])
    assert (config["provider"], config["credentialEnvName"], config["heartbeat"]["leaseDurationSeconds"]) == (
        "anthropic",
        "ANTHROPIC_API_KEY",
        5,
    )
    # The namespace enforces Pod Security "restricted": the pods exist only because the template meets it.
    assert pool.wait_pods(2) == ["claude-0", "claude-1"]
    pod = kube.core.read_namespaced_pod("claude-0", namespace)
    assert pod.spec.service_account_name == "helmhive-runner-claude"
    assert pod.metadata.annotations["helmhive.dev/credential-generation"] == "1"
    assert pod.spec.containers[0].security_context.read_only_root_filesystem is True


def test_pool_status_and_printer_columns(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=3)

    def reconciled() -> dict[str, Any]:
        obj = pool.get()
        assert condition(obj, "Ready").get("reason") == "Reconciled", obj.get("status")
        assert condition(obj, "CredentialAvailable").get("reason") == "CredentialFound"
        assert obj["status"]["desiredReplicas"] == 3
        return obj

    status = wait_for(reconciled, timeout=30, describe="pool Ready")["status"]
    assert (status["readyReplicas"], status["schedulableRunners"], status["credentialGeneration"]) == (0, 0, 1)
    assert status["credentialHash"].startswith("sha256:")
    table = kubectl("get", "runnerpools", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PROVIDER", "ADAPTER", "CONTROL", "DESIRED", "READY", "SCHEDULABLE", "AGE"]
    assert table[1].split()[:7] == ["claude", "anthropic", "acp", "Active", "3", "0", "0"]


def test_replicas_decide_the_pod_disruption_budget(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=1)
    wait_for(lambda: read(kube, "StatefulSet", "claude", namespace), timeout=30)
    assert gone(kube, "PodDisruptionBudget", "claude", namespace)
    pool.patch_spec({"replicas": 3})
    wait_for(lambda: read(kube, "PodDisruptionBudget", "claude", namespace), timeout=30, describe="PDB at 3 replicas")
    assert pool.wait_pods(3) == ["claude-0", "claude-1", "claude-2"]
    pool.patch_spec({"replicas": 1})
    wait_for(lambda: gone(kube, "PodDisruptionBudget", "claude", namespace), timeout=30, describe="PDB removed at 1")
    assert read(kube, "StatefulSet", "claude", namespace)["spec"]["replicas"] == 1


def test_a_pool_change_rolls_out(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=1)
    pool.wait_pods(1)
    before = wait_for(
        lambda: read(kube, "StatefulSet", "claude", namespace)["status"].get("updateRevision"), timeout=30
    )
    pool.patch_spec({"image": "ghcr.io/helmhive/runner:test-2", "concurrency": 3})

    def rolled() -> dict[str, Any]:
        sts = read(kube, "StatefulSet", "claude", namespace)
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/helmhive/runner:test-2"
        assert sts["status"].get("updateRevision") not in (None, before)
        return sts

    sts = wait_for(rolled, timeout=30, describe="the StatefulSet template to change")
    config = json.loads(read(kube, "ConfigMap", "helmhive-runner-claude", namespace)["data"]["runner.json"])
    assert config["concurrency"] == 3

    # The StatefulSet controller replaces the pod with one of the new revision.
    def replaced() -> bool:
        pod = kube.core.read_namespaced_pod("claude-0", namespace)
        assert pod.metadata.labels["controller-revision-hash"] == sts["status"]["updateRevision"]
        assert pod.spec.containers[0].image == "ghcr.io/helmhive/runner:test-2"
        return True

    wait_for(replaced, timeout=60, describe="pod claude-0 at the new revision")


def test_deleting_the_pool_cleans_up(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=2)
    pool.wait_pods(2)
    runner = pool.acting_as("claude-0")
    runner.register()
    runner.renew()
    # The operator adopts the Runner, so it goes with the pool too.
    wait_for(
        lambda: [r["kind"] for r in pool.runner("claude-0")["metadata"].get("ownerReferences", [])] == ["RunnerPool"],
        timeout=30,
        describe="the Runner to be owned by its pool",
    )
    kube.custom.delete_namespaced_custom_object("helmhive.dev", "v1alpha1", namespace, "runnerpools", "claude")
    for kind, name in [*OWNED, ("PodDisruptionBudget", "claude")]:
        wait_for(lambda k=kind, n=name: gone(kube, k, n, namespace), timeout=60, describe=f"{kind} {name} deleted")

    def runner_gone() -> bool:
        with pytest.raises(ApiException) as err:
            pool.runner("claude-0")
        assert err.value.status == 404
        return True

    wait_for(runner_gone, timeout=60, describe="Runner claude-0 deleted with its pool")
    wait_for(lambda: pool.pod_names() == [], timeout=60, describe="the pods deleted")


def test_an_invalid_pool_name_is_reported(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    long_name = "a" * 53
    pool: Pool = make_pool(kube, service_account_identity, namespace, name=long_name, restricted=False)

    def refused() -> dict[str, Any]:
        ready = condition(pool.get(), "Ready")
        assert (ready.get("status"), ready.get("reason")) == ("False", "InvalidSpec"), ready
        return ready

    assert "at most 52 characters" in wait_for(refused, timeout=30)["message"]
    assert gone(kube, "StatefulSet", long_name, namespace)


def test_a_pool_sets_its_pods_resources_placement_and_metadata(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    resources = {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    toleration = {"key": "dedicated", "value": "agents", "effect": "NoSchedule"}
    make_pool(
        kube,
        service_account_identity,
        namespace,
        resources=resources,
        nodeSelector={"helmhive.dev/agents": "true"},
        tolerations=[toleration],
        priorityClassName="agents",
        podMetadata={"labels": {"team": "payments"}, "annotations": {"sidecar.istio.io/inject": "false"}},
    )
    template = wait_for(lambda: read(kube, "StatefulSet", "claude", namespace), timeout=30)["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "payments"
    assert template["metadata"]["labels"]["helmhive.dev/pool"] == "claude"
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert "helmhive.dev/config-hash" in template["metadata"]["annotations"]
    pod = template["spec"]
    assert pod["containers"][0]["resources"] == resources
    assert pod["nodeSelector"] == {"helmhive.dev/agents": "true"}
    assert pod["tolerations"] == [{**toleration, "operator": "Equal"}]
    assert pod["priorityClassName"] == "agents"


def test_a_pool_without_them_keeps_the_default_resources_and_no_placement(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    make_pool(kube, service_account_identity, namespace)
    pod = wait_for(lambda: read(kube, "StatefulSet", "claude", namespace), timeout=30)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "2Gi"},
    }
    assert not {"nodeSelector", "tolerations", "priorityClassName"} & set(pod)

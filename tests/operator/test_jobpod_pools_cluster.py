"""JobPod RunnerPools with the real operator on a real API server: link key, job-pod NetworkPolicy, warm pods.

There is no kubelet: the warm pods stay Pending, and are counted by their labels. A JobPod pool
gets its link-key Secret (random, never rotated, never logged), its job pods' NetworkPolicy and
``warmPods`` warm pods; a claimed pod leaves the warm set and is replaced, never deleted; lowering
``warmPods`` deletes the surplus. An InRunner pool gets none of it.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pools import condition, make_pool

from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.api.jobpod import LABEL_JOB, LABEL_RUNNER, LABEL_WARM, RUNNER_LINK_KEY_DIR, link_secret_name
from helmhive.policy.jobpods.link import LINK_KEY_BYTES
from helmhive.policy.runners.pool import JOB_POD_ROLE_RULES

MERGE_PATCH = "application/merge-patch+json"
JOB_PODS = "app.kubernetes.io/name=helmhive-job,helmhive.dev/pool={pool}"


def _plain(kube: Kube, obj: Any) -> dict[str, Any]:
    plain: dict[str, Any] = kube.api_client.sanitize_for_serialization(obj)
    return plain


def _job_pods(kube: Kube, namespace: str, pool: str) -> list[dict[str, Any]]:
    listed = kube.core.list_namespaced_pod(namespace, label_selector=JOB_PODS.format(pool=pool))
    return [_plain(kube, p) for p in listed.items]


def _warm(kube: Kube, namespace: str, pool: str) -> list[dict[str, Any]]:
    """The pool's live warm pods (labelled warm, not ended, not being deleted), by name."""
    live = [
        p
        for p in _job_pods(kube, namespace, pool)
        if p["metadata"]["labels"].get(LABEL_WARM) == "true"
        and not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in {"Failed", "Succeeded"}
    ]
    return sorted(live, key=lambda p: str(p["metadata"]["name"]))


def _wait_warm(kube: Kube, namespace: str, pool: str, count: int, describe: str) -> list[dict[str, Any]]:
    def exactly() -> list[dict[str, Any]]:
        warm = _warm(kube, namespace, pool)
        assert len(warm) == count, [p["metadata"]["name"] for p in warm]
        return warm or [{}]

    found = wait_for(exactly, timeout=60, describe=describe)
    return [p for p in found if p]


def _link_secret(kube: Kube, namespace: str, pool: str) -> dict[str, Any]:
    return _plain(kube, kube.core.read_namespaced_secret(link_secret_name(pool), namespace))


def _container_status(state: dict[str, Any], *, ready: bool) -> dict[str, Any]:
    """A pod status patch as a kubelet writes one: the agent container's state, and the pod's Ready."""
    container = {"name": "agent", "ready": ready, "restartCount": 0, "image": "x", "imageID": "", "state": state}
    ready_condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"status": {"phase": "Running" if ready else "Pending", "containerStatuses": [container],
                       "conditions": [ready_condition]}}  # fmt: skip


def test_a_job_pod_pool_gets_its_link_key_policy_and_warm_pods(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, execution={"mode": "JobPod", "warmPods": 2})
    uid = pool.get()["metadata"]["uid"]
    owner = [("RunnerPool", "claude", uid, True)]

    # The link key: fresh random bytes, owned by the pool.
    secret = wait_for(lambda: _link_secret(kube, namespace, "claude"), timeout=60, describe="the link key Secret")
    key = base64.b64decode(secret["data"]["key"])
    assert len(key) >= LINK_KEY_BYTES and len(set(key)) > 1
    assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in secret["metadata"]["ownerReferences"]] == owner

    # The job pods' NetworkPolicy: only the pool's runners, both ways.
    networking = client.NetworkingV1Api(kube.api_client)
    policy = wait_for(
        lambda: _plain(kube, networking.read_namespaced_network_policy("helmhive-job-claude", namespace)),
        timeout=60,
        describe="the job pods' NetworkPolicy",
    )
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "helmhive-job",
        "helmhive.dev/pool": "claude",
    }
    assert [(r["kind"], r["uid"]) for r in policy["metadata"]["ownerReferences"]] == [("RunnerPool", uid)]

    # Two warm pods, owned by the pool, admitted under Pod Security "restricted" (the namespace enforces it).
    warm = _wait_warm(kube, namespace, "claude", 2, "two warm pods")
    for pod in warm:
        refs = pod["metadata"]["ownerReferences"]
        assert [(r["kind"], r["uid"], r["controller"]) for r in refs] == [("RunnerPool", uid, True)]
        assert pod["metadata"]["name"].startswith("claude-job-")
        assert pod["spec"]["automountServiceAccountToken"] is False

    # The runner pods mount the key, and may drive pods; the pool is Ready.
    wait_for(lambda: condition(pool.get(), "Ready").get("reason") == "Reconciled", timeout=60, describe="pool Ready")
    whole = _plain(kube, kube.apps.read_namespaced_stateful_set("claude", namespace))["spec"]["template"]
    template, annotations = whole["spec"], whole["metadata"]["annotations"]
    assert "helmhive.dev/config-hash" in annotations
    (runner,) = template["containers"]
    assert {"name": "jobpod-link", "mountPath": RUNNER_LINK_KEY_DIR, "readOnly": True} in runner["volumeMounts"]
    assert {"name": "jobpod-egress", "containerPort": 7471, "protocol": "TCP"} in runner["ports"]
    role = _plain(kube, kube.rbac.read_namespaced_role("helmhive-runner-claude", namespace))
    assert all(dict(rule) in role["rules"] for rule in JOB_POD_ROLE_RULES)
    config = json.loads(kube.core.read_namespaced_config_map("helmhive-runner-claude", namespace).data["runner.json"])
    assert config["execution"] == {"mode": "JobPod", "warmPods": 0}  # the warm set is the operator's alone
    assert config["jobPodTemplate"]["metadata"]["labels"][LABEL_WARM] == "true"

    # The warm set's condition: none ready yet (no kubelet here), then a pod that cannot pull its
    # image, named with the kubelet's reason, then both ready (each as a kubelet reports it).
    def warm_reason() -> str:
        return str(condition(pool.get(), "WarmPodsReady").get("reason"))

    wait_for(lambda: warm_reason() == "WarmPodsStarting", timeout=60, describe="WarmPodsStarting")
    stuck, fine = sorted(p["metadata"]["name"] for p in warm)
    state = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    kube.core.patch_namespaced_pod_status(stuck, namespace, _container_status(state, ready=False))
    wait_for(lambda: warm_reason() == "WarmPodFailing", timeout=60, describe="WarmPodFailing")
    failing = condition(pool.get(), "WarmPodsReady")
    assert failing["status"] == "False" and stuck in failing["message"] and "ImagePullBackOff" in failing["message"]
    for name in (stuck, fine):
        kube.core.patch_namespaced_pod_status(name, namespace, _container_status({"running": {}}, ready=True))
    wait_for(lambda: warm_reason() == "WarmPodsReady", timeout=60, describe="WarmPodsReady")
    assert pool.get()["status"]["warmPodsReady"] == 2

    # A claim (as the runner makes it: a merge patch) takes a pod out of the warm set; another replaces it.
    claimed = warm[0]["metadata"]["name"]
    labels = {LABEL_WARM: None, LABEL_JOB: "review-1", LABEL_RUNNER: "claude-0"}
    kube.core.patch_namespaced_pod(claimed, namespace, {"metadata": {"labels": labels}}, _content_type=MERGE_PATCH)
    after = _wait_warm(kube, namespace, "claude", 2, "a warm pod in place of the claimed one")
    assert claimed not in {p["metadata"]["name"] for p in after}
    assert {p["metadata"]["name"] for p in after} & {p["metadata"]["name"] for p in warm}  # the other one stays

    # A warm pod that ended (as a kubelet would report it) can never be claimed: it is deleted and replaced.
    ended = after[0]["metadata"]["name"]
    kube.core.patch_namespaced_pod_status(ended, namespace, {"status": {"phase": "Failed", "reason": "Error"}})
    replaced = _wait_warm(kube, namespace, "claude", 2, "a warm pod in place of the one that ended")
    assert ended not in {p["metadata"]["name"] for p in replaced}
    wait_for(
        lambda: ended not in {p["metadata"]["name"] for p in _job_pods(kube, namespace, "claude")},
        timeout=60,
        describe=f"the ended warm pod {ended} deleted",
    )

    # A new operator process reconciles the pool again (it acts on a raised warmPods) and keeps the key.
    operator.restart()
    pool.patch_spec({"execution": {"mode": "JobPod", "warmPods": 3}})
    _wait_warm(kube, namespace, "claude", 3, "three warm pods after the restart")
    assert _link_secret(kube, namespace, "claude")["data"] == secret["data"]
    # The runner pods' template did not change with the count: no runner restarts for it.
    rolled = _plain(kube, kube.apps.read_namespaced_stateful_set("claude", namespace))["spec"]["template"]
    assert rolled["spec"] == template and rolled["metadata"]["annotations"] == annotations

    # Lowering warmPods to 0 deletes the warm ones, never the claimed one.
    pool.patch_spec({"execution": {"mode": "JobPod", "warmPods": 0}})
    _wait_warm(kube, namespace, "claude", 0, "no warm pod left")
    still = _plain(kube, kube.core.read_namespaced_pod(claimed, namespace))
    assert still["metadata"]["labels"][LABEL_JOB] == "review-1" and not still["metadata"].get("deletionTimestamp")

    # The key is nowhere but in its Secret: not in the pool's status, its Events or the operator's log.
    encoded, raw_hex = secret["data"]["key"], key.hex()
    events = kube.core.list_namespaced_event(namespace)
    for text in (json.dumps(pool.get()), json.dumps(_plain(kube, events)), operator.log_text()):
        assert encoded not in text and raw_hex not in text


def test_an_in_runner_pool_gets_no_job_pod_objects(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, name="plain")
    wait_for(lambda: condition(pool.get(), "Ready").get("reason") == "Reconciled", timeout=60, describe="pool Ready")
    wait_for(
        lambda: kube.rbac.read_namespaced_role("helmhive-runner-plain", namespace), timeout=30, describe="the Role"
    )
    with pytest.raises(ApiException) as secret:
        kube.core.read_namespaced_secret(link_secret_name("plain"), namespace)
    assert secret.value.status == 404
    with pytest.raises(ApiException) as policy:
        client.NetworkingV1Api(kube.api_client).read_namespaced_network_policy("helmhive-job-plain", namespace)
    assert policy.value.status == 404
    assert _job_pods(kube, namespace, "plain") == []
    role = _plain(kube, kube.rbac.read_namespaced_role("helmhive-runner-plain", namespace))
    assert not any("pods" in rule["resources"] for rule in role["rules"])
    template = _plain(kube, kube.apps.read_namespaced_stateful_set("plain", namespace))["spec"]["template"]["spec"]
    assert "jobpod-link" not in {v["name"] for v in template["volumes"]}
    config = json.loads(kube.core.read_namespaced_config_map("helmhive-runner-plain", namespace).data["runner.json"])
    assert config["execution"] == {"mode": "InRunner", "warmPods": 0} and "jobPodTemplate" not in config
    assert not condition(pool.get(), "WarmPodsReady") and "warmPodsReady" not in pool.get()["status"]

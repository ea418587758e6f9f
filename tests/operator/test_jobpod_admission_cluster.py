"""Job pods on a real API server (no kubelet, no operator): what the builders write is admitted as written.

A warm job pod passes Pod Security ``restricted`` where a namespace enforces it, its claim patch
applies (and a second claim of the same read is refused), the pool's job-pod NetworkPolicy and link
Secret are admitted, and the CRD's ``spec.execution`` with the EXECUTION_RULES in CEL agrees with the
model on every rule.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import uuid
from decimal import Decimal
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.utils.quantity import parse_quantity

from harness.kube import Kube
from harness.wait import wait_for
from helmhive.api.crdgen import build_crd
from helmhive.api.execution import EXECUTION_RULES
from helmhive.api.jobpod import LABEL_JOB, LABEL_RUNNER, LABEL_WARM
from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.policy.jobpods.link import build_link_secret
from helmhive.policy.jobpods.network import build_job_pod_network_policy
from helmhive.policy.jobpods.pod import DEADLINE_MARGIN_SECONDS, build_claim_patch, build_job_pod
from helmhive.policy.jobpods.view import PodView
from helmhive.policy.runners.pool import PoolRef

SPEC: dict[str, Any] = {
    "provider": "anthropic",
    "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
    "image": "ghcr.io/helmhive/runner:test",
    "credential": {"secretRef": {"name": "claude-credential", "key": "api-key"}, "envName": "ANTHROPIC_API_KEY"},
    "execution": {"mode": "JobPod", "warmPods": 1},
}
MERGE_PATCH = "application/merge-patch+json"
"""What :func:`build_claim_patch` is (a strategic merge would keep the pool's ownerReference)."""
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def _create(kube: Kube, namespace: str, plural: str, body: dict[str, Any], group: str = GROUP) -> dict[str, Any]:
    created: dict[str, Any] = kube.custom.create_namespaced_custom_object(group, VERSION, namespace, plural, body)
    return created


def _pool(kube: Kube, namespace: str) -> PoolRef:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RunnerPool", "metadata": {"name": "claude"}, "spec": SPEC}
    created = _create(kube, namespace, "runnerpools", body)
    assert created["spec"]["execution"] == {"mode": "JobPod", "warmPods": 1}  # the CRD has the fields
    return PoolRef(name="claude", namespace=namespace, uid=created["metadata"]["uid"])


def _job(kube: Kube, namespace: str) -> dict[str, Any]:
    spec = {"workspace": "shop", "jobKind": "review-probe", "request": {"title": "t", "prompt": "p"}}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "metadata": {"name": "review-42"}, "spec": spec}
    return _create(kube, namespace, "agentjobs", body)


def _amounts(resources: dict[str, dict[str, str]]) -> dict[str, dict[str, Decimal]]:
    return {kind: {name: parse_quantity(q) for name, q in values.items()} for kind, values in resources.items()}


def _as_dict(kube: Kube, obj: Any) -> dict[str, Any]:
    plain: dict[str, Any] = kube.api_client.sanitize_for_serialization(obj)
    return plain


def test_a_warm_job_pod_is_admitted_under_restricted_and_claimed_once(
    kube: Kube, namespace: str, crds: list[str]
) -> None:
    kube.core.patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})
    pool = _pool(kube, namespace)
    spec = RunnerPoolSpec.model_validate(SPEC)
    warm = build_job_pod(pool=pool, pool_spec=spec, namespace=namespace, job=None, runner=None, timeout_seconds=None)

    # The namespace enforces restricted: a pod that falls short of it is refused (so the check is real) ...
    weaker = copy.deepcopy(warm)
    del weaker["spec"]["containers"][1]["securityContext"]["capabilities"]
    with pytest.raises(ApiException) as refused:
        kube.core.create_namespaced_pod(namespace, weaker)
    assert refused.value.status == 403 and "restricted" in str(refused.value.body)

    # ... and the builder's pod is admitted as written.
    created = _as_dict(kube, kube.core.create_namespaced_pod(namespace, warm))
    assert created["metadata"]["name"].startswith("claude-job-")
    assert created["metadata"]["labels"] == warm["metadata"]["labels"]
    assert created["spec"]["automountServiceAccountToken"] is False
    assert not any("projected" in v for v in created["spec"]["volumes"])  # no token was injected
    assert [_amounts(c["resources"]) for c in created["spec"]["containers"]] == [
        _amounts(c["resources"]) for c in warm["spec"]["containers"]
    ]  # the API server writes quantities in its canonical form ("2000m" is "2")

    # The claim: a JSON merge patch on what was read; the same read cannot claim twice.
    read = PodView.parse(created)
    job = _job(kube, namespace)
    now = dt.datetime.now(dt.UTC)
    patch = functools.partial(
        build_claim_patch, pod=read, job_name="review-42", runner="claude-0", timeout_seconds=600, now=now
    )
    claim = functools.partial(kube.core.patch_namespaced_pod, read.name, namespace, _content_type=MERGE_PATCH)
    claimed = _as_dict(kube, claim(patch(job_uid=job["metadata"]["uid"])))
    labels = claimed["metadata"]["labels"]
    assert LABEL_WARM not in labels and (labels[LABEL_JOB], labels[LABEL_RUNNER]) == ("review-42", "claude-0")
    assert [(o["kind"], o["uid"]) for o in claimed["metadata"]["ownerReferences"]] == [
        ("AgentJob", job["metadata"]["uid"])
    ]
    assert claimed["spec"]["activeDeadlineSeconds"] == 600 + DEADLINE_MARGIN_SECONDS  # not started: from now
    with pytest.raises(ApiException) as again:
        claim(patch(job_uid=str(uuid.uuid4())))
    assert again.value.status == 409


def test_the_job_pod_network_policy_and_link_secret_are_admitted(kube: Kube, namespace: str, crds: list[str]) -> None:
    pool = _pool(kube, namespace)
    policy = build_job_pod_network_policy(pool=pool, namespace=namespace)
    created = _as_dict(
        kube, client.NetworkingV1Api(kube.api_client).create_namespaced_network_policy(namespace, policy)
    )
    assert created["spec"]["ingress"] == policy["spec"]["ingress"]
    assert created["spec"]["egress"] == policy["spec"]["egress"]
    secret = build_link_secret(pool=pool, namespace=namespace, key=bytes(range(32)))
    stored = kube.core.create_namespaced_secret(namespace, secret)
    assert stored.data == secret["data"]


# --- the CEL rules, on a probe kind with the RunnerPool's schema -------------------------------------

PROBE_GROUP = "jobpod-probe.helmhive.test"
PROBE_PLURAL = "poolprobes"


def _probe_crd() -> dict[str, Any]:
    """The RunnerPool CRD under another group and kind, with EXECUTION_RULES among its root rules."""
    crd = build_crd(kind_by_name("RunnerPool"))
    crd["metadata"] = {"name": f"{PROBE_PLURAL}.{PROBE_GROUP}"}
    crd["spec"]["group"] = PROBE_GROUP
    crd["spec"]["names"] = {
        "kind": "PoolProbe",
        "listKind": "PoolProbeList",
        "plural": PROBE_PLURAL,
        "singular": "poolprobe",
    }
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = root.setdefault("x-kubernetes-validations", [])
    rules += [dict(r) for r in EXECUTION_RULES if r["rule"] not in [x["rule"] for x in rules]]
    return crd


CASES: list[tuple[str, dict[str, Any]]] = [
    ("in-runner-default", {}),
    ("job-pod-by-default-proxy", {"execution": {"mode": "JobPod", "warmPods": 3, "runtimeClassName": "gvisor"}}),
    ("job-pod-in-sandbox", {"credentialIsolation": "InSandbox", "execution": {"mode": "JobPod"}}),
    ("job-pod-proxy", {"credentialIsolation": "Proxy", "execution": {"mode": "JobPod"}}),
    ("job-pod-acme", {"provider": "acme", "execution": {"mode": "JobPod"}}),
    (
        "job-pod-acme-upstream",
        {"provider": "acme", "egress": {"upstream": "https://llm.acme.example"}, "execution": {"mode": "JobPod"}},
    ),
    (
        "job-pod-login",
        {
            "credential": {"volume": {"claimName": "login", "mountPath": "/home/runner/.claude"}},
            "execution": {"mode": "JobPod"},
        },
    ),
    ("warm-in-runner", {"execution": {"warmPods": 1}}),
    ("runtime-in-runner", {"execution": {"mode": "InRunner", "runtimeClassName": "kata"}}),
    ("both-in-runner", {"execution": {"warmPods": 2, "runtimeClassName": "kata"}}),
    ("empty-execution", {"execution": {}}),
]


def _model_problems(spec: dict[str, Any]) -> set[str]:
    try:
        RunnerPoolSpec.model_validate(spec)
    except ValueError as err:
        return {r["fieldPath"].lstrip(".") for r in EXECUTION_RULES if r["message"] in str(err)}
    return set()


def test_the_cel_rules_agree_with_the_model(kube: Kube, namespace: str) -> None:
    crd = _probe_crd()
    name = crd["metadata"]["name"]
    kube.apiextensions.create_custom_resource_definition(crd)
    try:
        wait_for(
            lambda: any(
                c.type == "Established" and c.status == "True"
                for c in kube.apiextensions.read_custom_resource_definition(name).status.conditions or []
            ),
            timeout=60,
            describe=f"CRD {name} to be Established",
        )
        for case, changes in CASES:
            spec = {**SPEC, "execution": {}, **changes}
            body = {
                "apiVersion": f"{PROBE_GROUP}/{VERSION}",
                "kind": "PoolProbe",
                "metadata": {"name": case},
                "spec": spec,
            }

            def create(body: dict[str, Any] = body) -> set[str]:
                try:
                    _create(kube, namespace, PROBE_PLURAL, body, group=PROBE_GROUP)
                except ApiException as err:
                    if err.status == 404:  # the new kind is not served yet
                        raise
                    assert err.status == 422, err.body
                    return {r["fieldPath"].lstrip(".") for r in EXECUTION_RULES if r["message"] in str(err.body)}
                return set()

            refused = wait_for(lambda create=create: (create(),), timeout=30, describe=f"{case} to be answered")[0]
            assert refused == _model_problems(spec), case
    finally:
        kube.apiextensions.delete_custom_resource_definition(name)

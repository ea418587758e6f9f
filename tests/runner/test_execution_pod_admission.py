"""The ``helmhive-runner-execution`` policy narrows a JobPod runner's pod writes to its own job pods.

RBAC gives a JobPod pool's runners pods create/patch/delete in their namespace; on a real API
server, with a token bound to runner pod ``jp-0``, the policy lets it create and claim only job
pods of its pool that it drives, with no token, host namespaces or foreign volumes, and change or
delete only its own. Pods never run here (no kubelet): admission is all that is tested.
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.wait import wait_for
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.policy.jobpods.identity import JobRef
from helmhive.policy.jobpods.pod import build_claim_patch, build_cold_job_pod, build_job_pod
from helmhive.policy.jobpods.view import PodView
from helmhive.policy.runners.pool import JOB_POD_ROLE_RULES, PoolRef

from .execution_rbac import as_policy_rules, execution_admission_policy

POOL = "jp"
ACCOUNT = f"helmhive-runner-{POOL}"
SPEC = RunnerPoolSpec.model_validate(
    {
        "provider": "reference",
        "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
        "image": "helmhive.local/helmhive-runner:dev",
        "credential": {"secretRef": {"name": "token", "key": "token"}, "envName": "TOKEN"},
        "jobLimits": {"cpuMillicores": 250},
        "execution": {"mode": "JobPod"},
    }
)
NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def _unowned(pod: dict[str, Any]) -> dict[str, Any]:
    # No RunnerPool or AgentJob exists here: the garbage collector would remove a pod they own.
    pod = copy.deepcopy(pod)
    pod["metadata"].pop("ownerReferences", None)
    return pod


def _warm(namespace: str) -> dict[str, Any]:
    pool = PoolRef(name=POOL, namespace=namespace, uid="00000000-0000-4000-8000-00000000000a")
    return _unowned(
        build_job_pod(pool=pool, pool_spec=SPEC, namespace=namespace, job=None, runner=None, timeout_seconds=None)
    )


def _cold(namespace: str, runner: str) -> dict[str, Any]:
    job = JobRef(name="job-1", uid="00000000-0000-4000-8000-00000000000b")
    return _unowned(build_cold_job_pod(_warm(namespace), job=job, runner=runner, timeout_seconds=300))


def _refused(call: Any, *args: Any, why: str) -> None:
    with pytest.raises(ApiException) as err:
        call(*args)
    assert err.value.status == 403, err.value.body
    assert why in str(err.value.body), err.value.body


def test_a_runner_writes_only_the_job_pods_of_its_pool_that_it_drives(
    kube: Any, namespace: str, service_account_identity: Any
) -> None:
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name=ACCOUNT), rules=as_policy_rules([dict(r) for r in JOB_POD_ROLE_RULES])
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=ACCOUNT),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=ACCOUNT),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=ACCOUNT, namespace=namespace)],
        ),
    )
    admission = client.AdmissionregistrationV1Api(kube.api_client)
    name = f"helmhive-runner-execution-{namespace}"[:253]
    policy, binding = execution_admission_policy(name=name, namespace=namespace)
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    try:
        _check(kube, namespace, service_account_identity)
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


def _check(kube: Any, namespace: str, identities: Any) -> None:
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": ACCOUNT}})
    for runner in ("jp-0", "jp-1"):
        containers = [{"name": "runner", "image": "runner:dev"}]
        body = {"metadata": {"name": runner}, "spec": {"serviceAccountName": ACCOUNT, "containers": containers}}
        kube.core.create_namespaced_pod(namespace, body)
    me = client.CoreV1Api(identities(namespace, ACCOUNT, bound_pod="jp-0", create=False).api_client())
    # RBAC and the policy reach the API server's caches in their own time: wait until both act.
    wait_for(
        lambda: _policy_refuses(me, namespace, _cold(namespace, "jp-1")),
        timeout=60, describe="the policy to refuse a job pod of another runner (dry run)",
    )  # fmt: skip
    mine = me.create_namespaced_pod(namespace, _cold(namespace, "jp-0"))
    assert mine.metadata.labels["helmhive.dev/runner"] == "jp-0"
    _refused(me.create_namespaced_pod, namespace, _cold(namespace, "jp-1"), why="labelled as driven by it")
    other = _cold(namespace, "jp-0")
    other["metadata"]["labels"]["helmhive.dev/pool"] = "another"
    _refused(me.create_namespaced_pod, namespace, other, why="only job pods of its pool jp")
    plain = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    _refused(me.create_namespaced_pod, namespace, plain, why="only job pods of its pool")
    token = _cold(namespace, "jp-0")
    token["spec"]["automountServiceAccountToken"] = True
    _refused(me.create_namespaced_pod, namespace, token, why="without a ServiceAccount token")
    foreign = _cold(namespace, "jp-0")
    foreign["spec"]["volumes"].append({"name": "loot", "secret": {"secretName": "another-pools-credential"}})
    _refused(me.create_namespaced_pod, namespace, foreign, why="the link key of its pool")
    # A warm pod (the operator's) is claimed by a merge patch with its resourceVersion.
    warm = kube.core.create_namespaced_pod(namespace, _warm(namespace))
    view = PodView.parse(kube.api_client.sanitize_for_serialization(warm))
    patch = build_claim_patch(pod=view, job_name="job-2", job_uid="u-2", runner="jp-0", timeout_seconds=300, now=NOW)
    patch["metadata"].pop("ownerReferences")
    claimed = me.patch_namespaced_pod(warm.metadata.name, namespace, patch)
    assert claimed.metadata.labels.get("helmhive.dev/runner") == "jp-0"
    assert "helmhive.dev/warm" not in claimed.metadata.labels
    # Another runner of the pool may neither change nor delete it.
    you = client.CoreV1Api(identities(namespace, ACCOUNT, bound_pod="jp-1", create=False).api_client())
    _refused(you.delete_namespaced_pod, claimed.metadata.name, namespace, why="change or delete only its own")
    relabel = {"metadata": {"labels": {"helmhive.dev/runner": "jp-1"}}}
    _refused(you.patch_namespaced_pod, claimed.metadata.name, namespace, relabel, why="change or delete only its own")
    _refused(you.delete_namespaced_pod, "jp-0", namespace, why="change or delete only its own")
    me.delete_namespaced_pod(claimed.metadata.name, namespace)
    me.delete_namespaced_pod(mine.metadata.name, namespace)


def _policy_refuses(api: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> bool:
    try:
        api.create_namespaced_pod(namespace, body, dry_run="All")
    except ApiException as exc:
        return exc.status == 403 and "runner execution" in str(exc.body)
    return False

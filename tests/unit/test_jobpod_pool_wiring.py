"""A RunnerPool in mode JobPod, as built: runner.json, the runners' Role, pods and NetworkPolicy, the warm memo.

Everything a JobPod pool adds is checked against the InRunner pool it would otherwise be, so that
an InRunner pool's objects stay exactly as they were.
"""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest

from helmhive.api.common import FilesystemAccess, JobKind
from helmhive.api.crdgen import build_crd
from helmhive.api.execution import EXECUTION_RULES, ExecutionMode
from helmhive.api.jobpod import LINK_PORT, LINK_SECRET_KEY, RUNNER_LINK_KEY_DIR, RUNNER_PROXY_PORT
from helmhive.api.kinds import kind_by_name
from helmhive.api.reasons import Reason
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.controller.app import configure_settings
from helmhive.controller.runners.jobpods import EXPECT_SECONDS, WarmMemo
from helmhive.deploy.manifests import OperatorIdentity, build_operator_rbac
from helmhive.policy.agentjob.retry import decide_retry
from helmhive.policy.jobpods.network import build_job_pod_network_policy
from helmhive.policy.jobpods.pod import build_job_pod
from helmhive.policy.jobpods.view import PodView
from helmhive.policy.runners.pod import JOB_POD_EGRESS_PORT_NAME
from helmhive.policy.runners.pool import (
    EXECUTION_ROLE_RULES,
    JOB_POD_ROLE_RULES,
    RUNNER_ROLE_RULES,
    PoolRef,
    build_network_policy,
    build_pool_objects,
    build_role,
    build_runner_config,
    build_stateful_set,
    decide_pruned_objects,
)
from helmhive.policy.validation.rules import cel_rule_supported
from helmhive.runner.config import load_config

POOL = PoolRef(name="claude", namespace="team-a", uid="0b9e6a4e-0000-4000-8000-000000000003")
CREDENTIAL = "anthropic-key-canary"
BASE: dict[str, Any] = {
    "provider": "anthropic",
    "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
    "image": "ghcr.io/helmhive/runner:0.1.0",
    "credential": {"secretRef": {"name": CREDENTIAL, "key": "api-key"}, "envName": "ANTHROPIC_API_KEY"},
    "replicas": 2,
}
JOB_POD: dict[str, Any] = {"mode": "JobPod", "warmPods": 2, "runtimeClassName": "gvisor"}


def spec(execution: dict[str, Any] | None = None, **changes: Any) -> RunnerPoolSpec:
    wire = {**BASE, **changes}
    if execution is not None:
        wire["execution"] = execution
    return RunnerPoolSpec.model_validate(wire)


def pod_spec(pool_spec: RunnerPoolSpec) -> dict[str, Any]:
    spec_: dict[str, Any] = build_stateful_set(POOL, pool_spec, credential_generation=1)["spec"]["template"]["spec"]
    return spec_


# --- runner.json -----------------------------------------------------------------------------------


def test_runner_json_says_where_jobs_run_for_every_pool() -> None:
    config = build_runner_config(POOL, spec())
    assert config["execution"] == {"mode": "InRunner", "warmPods": 0}
    assert "jobPodTemplate" not in config
    assert build_runner_config(POOL, spec({"mode": "InRunner"}))["execution"] == config["execution"]


def test_a_job_pod_pools_runner_json_carries_its_warm_pod_template() -> None:
    pool_spec = spec(JOB_POD)
    config = build_runner_config(POOL, pool_spec)
    assert config["execution"] == {**JOB_POD, "warmPods": 0}  # the warm set is the operator's alone
    warm = build_job_pod(
        pool=POOL, pool_spec=pool_spec, namespace=POOL.namespace, job=None, runner=None, timeout_seconds=None
    )
    assert config["jobPodTemplate"] == warm
    assert config["jobPodTemplate"]["spec"]["runtimeClassName"] == "gvisor"
    # The template is the job pod's: nothing of the provider credential is in it.
    assert CREDENTIAL not in repr(config["jobPodTemplate"])
    # Apart from the two keys, runner.json is the InRunner pool's.
    plain = build_runner_config(POOL, spec())
    assert {k: v for k, v in config.items() if k not in {"execution", "jobPodTemplate"}} == {
        k: v for k, v in plain.items() if k != "execution"
    }


def test_the_runner_program_accepts_a_job_pod_pools_runner_json_and_environment() -> None:
    pool_spec = spec(JOB_POD)
    (container,) = pod_spec(pool_spec)["containers"]
    downward = {
        "HELMHIVE_RUNNER_NAME": "claude-0",
        "HELMHIVE_NAMESPACE": "team-a",
        "HELMHIVE_CREDENTIAL_GENERATION": "1",
        "HELMHIVE_POD_IP": "10.244.0.7",
    }
    environ = {e["name"]: e.get("value") or downward[e["name"]] for e in container["env"]}
    (config_map,) = [
        o for o in build_pool_objects(POOL, pool_spec, credential_generation=1) if o["kind"] == "ConfigMap"
    ]
    text = config_map["data"]["runner.json"]
    config = load_config(environ=environ, read_text=lambda path: text)
    assert config.file.execution.mode is ExecutionMode.JOB_POD
    assert config.file.job_pod_template == build_runner_config(POOL, pool_spec)["jobPodTemplate"]


# --- the runner pods ----------------------------------------------------------------------------------


def test_a_job_pod_pools_runners_mount_the_link_key_and_serve_the_proxy_port() -> None:
    job_pod, plain = pod_spec(spec(JOB_POD)), pod_spec(spec())
    (runner,) = job_pod["containers"]
    volume = next(v for v in job_pod["volumes"] if v["name"] == "jobpod-link")
    assert volume["secret"] == {
        "secretName": "claude-jobpod-link",
        "defaultMode": 0o440,
        "items": [{"key": LINK_SECRET_KEY, "path": LINK_SECRET_KEY}],
    }
    mount = next(m for m in runner["volumeMounts"] if m["name"] == "jobpod-link")
    assert mount == {"name": "jobpod-link", "mountPath": RUNNER_LINK_KEY_DIR, "readOnly": True}
    assert {"name": JOB_POD_EGRESS_PORT_NAME, "containerPort": RUNNER_PROXY_PORT, "protocol": "TCP"} in runner["ports"]

    # Without the volume, its mount and the port, it is the InRunner pool's pod exactly.
    stripped = copy.deepcopy(job_pod)
    stripped["volumes"].remove(volume)
    stripped["containers"][0]["volumeMounts"].remove(mount)
    stripped["containers"][0]["ports"] = [p for p in runner["ports"] if p["name"] != JOB_POD_EGRESS_PORT_NAME]
    assert stripped == plain


def test_every_runner_knows_its_pod_ip_and_an_in_runner_pool_mounts_no_link_key() -> None:
    plain = pod_spec(spec())
    (runner,) = plain["containers"]
    env = {e["name"]: e.get("valueFrom") for e in runner["env"]}
    assert env["HELMHIVE_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert "jobpod-link" not in {v["name"] for v in plain["volumes"]}
    assert [p["name"] for p in runner["ports"]] == ["metrics"]
    assert RUNNER_LINK_KEY_DIR not in {m["mountPath"] for m in runner["volumeMounts"]}


# --- RBAC ----------------------------------------------------------------------------------------------


def test_only_a_job_pod_pools_runners_may_drive_pods() -> None:
    names = ["helmhive-sessions-claude-0", "helmhive-sessions-claude-1"]
    sessions = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": names, "verbs": ["get", "patch"]}
    base = [*RUNNER_ROLE_RULES, *EXECUTION_ROLE_RULES]
    assert build_role(POOL, replicas=2)["rules"] == [*base, sessions]
    assert build_role(POOL, replicas=2, mode=ExecutionMode.IN_RUNNER)["rules"] == [*base, sessions]
    assert build_role(POOL, replicas=2, mode=ExecutionMode.JOB_POD)["rules"] == [*base, *JOB_POD_ROLE_RULES, sessions]
    assert JOB_POD_ROLE_RULES == (
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": ["helmhive.dev"], "resources": ["agentjobs/finalizers"], "verbs": ["update"]},
    )
    roles = {
        mode: next(o for o in build_pool_objects(POOL, spec(execution), credential_generation=1) if o["kind"] == "Role")
        for mode, execution in (("in-runner", None), ("job-pod", JOB_POD))
    }
    assert roles["in-runner"]["rules"] == [*base, sessions]
    assert roles["job-pod"]["rules"] == [*base, *JOB_POD_ROLE_RULES, sessions]


def test_the_operator_holds_what_it_grants_job_pod_runners() -> None:
    # RBAC lets a subject grant only what it holds itself; the operator also makes the warm pods.
    rules = build_operator_rbac(OperatorIdentity())[1]["rules"]

    def held(group: str, resource: str, verb: str) -> bool:
        return any(
            group in r["apiGroups"] and (resource in r["resources"] or "*" in r["resources"]) and verb in r["verbs"]
            for r in rules
        )

    for rule in JOB_POD_ROLE_RULES:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert held(group, resource, verb), (group, resource, verb)
    assert held("", "secrets", "create") and held("networking.k8s.io", "networkpolicies", "patch")


# --- NetworkPolicies ------------------------------------------------------------------------------------


def test_a_job_pod_pools_runners_and_job_pods_reach_each_other_only() -> None:
    plain = build_network_policy(POOL)
    policy = build_network_policy(POOL, mode=ExecutionMode.JOB_POD)
    job_pods = [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "helmhive-job", "helmhive.dev/pool": "claude"}}}
    ]
    assert policy["spec"]["ingress"] == [{"from": job_pods, "ports": [{"protocol": "TCP", "port": RUNNER_PROXY_PORT}]}]
    assert policy["spec"]["egress"] == [
        *plain["spec"]["egress"],
        {"to": job_pods, "ports": [{"protocol": "TCP", "port": LINK_PORT}]},
    ]
    assert {**policy, "spec": {**policy["spec"], "ingress": [], "egress": plain["spec"]["egress"]}} == plain
    assert build_network_policy(POOL, mode=ExecutionMode.IN_RUNNER) == plain


def test_only_a_job_pod_pool_owns_the_job_pods_network_policy_and_it_is_never_pruned() -> None:
    objects = build_pool_objects(POOL, spec(JOB_POD), credential_generation=1)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    job_policy = ("NetworkPolicy", "helmhive-job-claude")
    assert kinds.index(job_policy) < kinds.index(("StatefulSet", "claude"))
    assert objects[kinds.index(job_policy)] == build_job_pod_network_policy(pool=POOL, namespace="team-a")
    runners = next(
        o for o in objects if o["metadata"]["name"] == "helmhive-runner-claude" and o["kind"] == "NetworkPolicy"
    )
    assert runners == build_network_policy(POOL, mode=ExecutionMode.JOB_POD)
    plain = build_pool_objects(POOL, spec(), credential_generation=1)
    assert job_policy not in [(o["kind"], o["metadata"]["name"]) for o in plain]
    assert not any(o["kind"] == "Secret" and "jobpod" in o["metadata"]["name"] for o in [*objects, *plain])
    for pool_spec in (spec(), spec(JOB_POD)):
        assert "NetworkPolicy" not in {kind for _, kind, _ in decide_pruned_objects(POOL, pool_spec)}


# --- the CRD and the retry rule ---------------------------------------------------------------------------


def test_the_runner_pool_crd_checks_the_execution_rules_and_offline_validation_knows_them() -> None:
    root = build_crd(kind_by_name("RunnerPool"))["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [r["rule"] for r in root["x-kubernetes-validations"]]
    assert all(r["rule"] in rules for r in EXECUTION_RULES)
    assert all(cel_rule_supported(r["rule"]) for r in EXECUTION_RULES)


@pytest.mark.parametrize("reason", ["JobPodLost", "JobPodLost:Evicted", "JobPodLost:DeletionByTaintManager"])
def test_a_lost_job_pod_is_retried_like_a_lost_runner(reason: str) -> None:
    read = decide_retry(
        job_kind=JobKind.REVIEW_PROBE, filesystem=FilesystemAccess.READ, failure_reason=reason, started=True, attempts=0
    )
    assert (read.retry, read.reason) == (True, Reason.RETRY_ALLOWED)
    wrote = decide_retry(
        job_kind=JobKind.IMPLEMENTATION_PROBE,
        filesystem=FilesystemAccess.WRITE,
        failure_reason=reason,
        started=True,
        attempts=0,
    )
    assert (wrote.retry, wrote.reason) == (False, Reason.MAY_HAVE_SIDE_EFFECTS)
    failed = decide_retry(
        job_kind=JobKind.REVIEW_PROBE,
        filesystem=FilesystemAccess.READ,
        failure_reason="JobPodFailed:ImagePullBackOff",
        started=False,
        attempts=0,
    )
    assert (failed.retry, failed.reason) == (False, Reason.NOT_RETRYABLE)


# --- the warm memo: writes the index has not shown yet ----------------------------------------------------


def _pod(name: str, *, deleting: bool = False) -> PodView:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return PodView.parse({"metadata": meta})


def test_the_warm_memo_forgets_what_the_index_shows_and_what_is_too_old() -> None:
    memo = WarmMemo(created={"a": 0.0, "b": 0.0, "c": 10.0}, deleted={"x": 0.0, "y": 0.0, "z": 0.0})
    assert memo.next_due() == EXPECT_SECONDS
    seen = {"a": _pod("a"), "y": _pod("y", deleting=True), "z": _pod("z")}
    memo.settle(seen, now=1.0)
    # a: the index has it; x: gone from the index; y: being deleted. b, c and z: not yet.
    assert (set(memo.created), set(memo.deleted)) == ({"b", "c"}, {"z"})
    memo.settle(seen, now=EXPECT_SECONDS + 1.0)
    assert (set(memo.created), set(memo.deleted)) == ({"c"}, set())
    assert memo.next_due() == 10.0 + EXPECT_SECONDS
    memo.settle({}, now=EXPECT_SECONDS + 11.0)
    assert memo.next_due() is None


def test_job_pod_events_cost_kopf_no_essence() -> None:
    # The operator has only an index and an event handler on pods: Kopf's per-event copy is skipped.
    settings = kopf.OperatorSettings()
    configure_settings(settings)
    pod = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "claude-job-x"}, "spec": {"a": 1}})
    assert dict(settings.persistence.diffbase_storage.build(body=pod)) == {}

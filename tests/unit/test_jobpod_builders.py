"""The job pod, its NetworkPolicy and the pool's link key, as built: restricted, bounded, credential-free."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest

from helmhive.api.jobpod import (
    AGENT_CONTAINER,
    COMPONENT,
    JOB_HOME,
    JOB_TMP,
    JOB_WORKSPACE,
    LABEL_JOB,
    LABEL_POOL,
    LABEL_RUNNER,
    LABEL_WARM,
    LINK_DIR,
    LINK_KEY_DIR,
    LINK_PORT,
    LINK_SECRET_KEY,
    RUNNER_PROXY_PORT,
    SHIM_CONTAINER,
    SHIM_DIR,
    link_secret_name,
)
from helmhive.api.kinds import API_VERSION
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.policy.jobpods.identity import (
    JobRef,
    build_job_pod_selector,
    build_pool_owner_reference,
    build_runner_selector,
    label_value,
)
from helmhive.policy.jobpods.link import build_link_secret
from helmhive.policy.jobpods.network import build_job_pod_network_policy, build_runner_job_pod_rules
from helmhive.policy.jobpods.pod import (
    DEADLINE_MARGIN_SECONDS,
    build_claim_patch,
    build_cold_job_pod,
    build_job_pod,
    job_pod_name_prefix,
)
from helmhive.policy.jobpods.view import PodView
from helmhive.policy.runners.pool import PoolRef, build_owner_reference, build_pool_labels, build_stateful_set

POOL = PoolRef(name="claude", namespace="team-a", uid="0b9e6a4e-0000-4000-8000-000000000002")
JOB = JobRef(name="review-42", uid="5d0c1f6e-0000-4000-8000-000000000042")
NOW_UNUSED = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
"""A claim of a pod not started yet: its deadline does not depend on the clock."""
CANARY = "canary-provider-key-3f9c1e"
"""The pool's credential Secret: its name must appear nowhere in a job pod."""
GIT_CANARY = "canary-git-credentials-8d2b"
BASE: dict[str, Any] = {
    "provider": "anthropic",
    "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
    "image": "ghcr.io/helmhive/runner:0.1.0",
    "credential": {"secretRef": {"name": CANARY, "key": "api-key"}, "envName": "ANTHROPIC_API_KEY"},
    "source": {"credentialsSecret": {"name": GIT_CANARY}},
    "execution": {"mode": "JobPod"},
}


def spec(**changes: Any) -> RunnerPoolSpec:
    return RunnerPoolSpec.model_validate({**BASE, **changes})


def warm(**changes: Any) -> dict[str, Any]:
    return build_job_pod(
        pool=POOL, pool_spec=spec(**changes), namespace=POOL.namespace, job=None, runner=None, timeout_seconds=None
    )


def cold(timeout: int = 1800, **changes: Any) -> dict[str, Any]:
    return build_job_pod(
        pool=POOL,
        pool_spec=spec(**changes),
        namespace=POOL.namespace,
        job=JOB,
        runner="claude-0",
        timeout_seconds=timeout,
    )


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"]["containers"]}


# --- Pod Security Standards "restricted", field by field --------------------------------------

RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


@pytest.mark.parametrize("build", [warm, cold], ids=["warm", "cold"])
def test_the_pod_meets_pod_security_restricted(build: Any) -> None:
    pod = build()["spec"]
    # baseline: no host namespaces, host paths, host ports, privilege, added capabilities, sysctls
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "hostUsers"))
    assert "sysctls" not in pod["securityContext"]
    for volume in pod["volumes"]:
        (kind,) = set(volume) - {"name"}
        assert kind in RESTRICTED_VOLUME_TYPES, volume
    # restricted, pod level
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "initContainers" not in pod and "ephemeralContainers" not in pod
    assert len(pod["containers"]) == 2
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}  # and nothing added
        assert context.get("privileged") is not True
        assert context["runAsNonRoot"] is True
        assert context.get("runAsUser", 1) != 0
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert context["readOnlyRootFilesystem"] is True
        assert "procMount" not in context and "windowsOptions" not in context and "appArmorProfile" not in context
        assert all("hostPort" not in port for port in container.get("ports", []))


@pytest.mark.parametrize("build", [warm, cold], ids=["warm", "cold"])
def test_no_service_account_token_and_no_service_links(build: Any) -> None:
    pod = build()["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert "serviceAccountName" not in pod and "serviceAccount" not in pod
    assert not any("projected" in v for v in pod["volumes"])
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] <= 30
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == 65532


@pytest.mark.parametrize("build", [warm, cold], ids=["warm", "cold"])
def test_nothing_of_the_provider_credential_enters_the_pod(build: Any) -> None:
    text = json.dumps(build())
    assert CANARY not in text
    assert GIT_CANARY not in text
    assert "api-key" not in text and "ANTHROPIC_API_KEY" not in text
    secrets = [v["secret"]["secretName"] for v in build()["spec"]["volumes"] if "secret" in v]
    assert secrets == [link_secret_name(POOL.name)]
    env = [e["name"] for c in build()["spec"]["containers"] for e in c.get("env", [])]
    assert env == ["HELMHIVE_POD_NAME"]
    assert all("secretKeyRef" not in json.dumps(c) and "envFrom" not in c for c in build()["spec"]["containers"])


# --- containers, resources and volumes ---------------------------------------------------------


def test_the_agent_gets_job_limits_as_requests_equal_to_limits() -> None:
    pod = cold(jobLimits={"memoryBytes": 3 * 1024**3, "cpuMillicores": 1500, "diskBytes": 8 * 1024**3})
    agent = containers(pod)[AGENT_CONTAINER]
    assert agent["resources"]["requests"] == agent["resources"]["limits"] == {"memory": "3221225472", "cpu": "1500m"}
    assert agent["command"] == ["helmhive-jobpod", "agent"]
    assert agent["image"] == BASE["image"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["job"] == {"name": "job", "emptyDir": {"sizeLimit": "8589934592"}}
    assert volumes["shim"] == {"name": "shim", "emptyDir": {"sizeLimit": "8589934592"}}
    assert volumes["link"] == {"name": "link", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    assert volumes["link-key"] == {
        "name": "link-key",
        "secret": {"secretName": "claude-jobpod-link", "defaultMode": 0o400},
    }


def test_default_job_limits_make_the_default_resources() -> None:
    agent = containers(warm())[AGENT_CONTAINER]
    assert agent["resources"]["limits"] == {"memory": str(1024**3), "cpu": "2000m"}
    assert {v["name"]: v for v in warm()["spec"]["volumes"]}["job"]["emptyDir"] == {"sizeLimit": str(4 * 1024**3)}


def test_the_shim_has_small_fixed_resources_the_link_and_the_key() -> None:
    shim = containers(warm(jobLimits={"memoryBytes": 8 * 1024**3}))[SHIM_CONTAINER]
    assert shim["command"] == ["helmhive-jobpod", "shim"]
    assert shim["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }
    assert shim["env"] == [{"name": "HELMHIVE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    assert shim["ports"] == [{"name": "link", "containerPort": LINK_PORT, "protocol": "TCP"}]
    assert shim["volumeMounts"] == [
        {"name": "job", "mountPath": JOB_WORKSPACE, "subPath": "workspace"},
        {"name": "job", "mountPath": JOB_HOME, "subPath": "home"},
        {"name": "link", "mountPath": LINK_DIR},
        {"name": "link-key", "mountPath": LINK_KEY_DIR, "readOnly": True},
        {"name": "shim", "mountPath": SHIM_DIR},
    ]


def test_the_agent_mounts_the_job_volume_and_the_link_but_not_the_key_or_the_shims_directory() -> None:
    agent = containers(warm())[AGENT_CONTAINER]
    assert agent["volumeMounts"] == [
        {"name": "job", "mountPath": JOB_WORKSPACE, "subPath": "workspace"},
        {"name": "job", "mountPath": JOB_HOME, "subPath": "home"},
        {"name": "job", "mountPath": JOB_TMP, "subPath": "tmp"},
        {"name": "link", "mountPath": LINK_DIR},
    ]
    assert "ports" not in agent and "env" not in agent


def test_runtime_class_is_set_only_when_the_pool_names_one() -> None:
    assert "runtimeClassName" not in warm()["spec"]
    assert "runtimeClassName" not in cold()["spec"]
    chosen = {"mode": "JobPod", "runtimeClassName": "gvisor"}
    assert warm(execution=chosen)["spec"]["runtimeClassName"] == "gvisor"
    assert cold(execution=chosen)["spec"]["runtimeClassName"] == "gvisor"


def test_the_pools_placement_and_pull_secrets_reach_the_pod() -> None:
    pod = warm(
        nodeSelector={"pool": "agents"},
        tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        priorityClassName="agents-high",
        imagePullSecrets=[{"name": "registry"}],
        imagePullPolicy="Always",
    )["spec"]
    assert pod["nodeSelector"] == {"pool": "agents"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists", "value": "", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "agents-high"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert {c["imagePullPolicy"] for c in pod["containers"]} == {"Always"}
    assert not {"nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"} & set(warm()["spec"])


# --- warm and cold: labels, owners, deadline, name ---------------------------------------------


def test_a_warm_pod_is_the_pools_labelled_warm_without_a_deadline() -> None:
    meta = warm()["metadata"]
    assert meta["labels"] == {
        "app.kubernetes.io/name": "helmhive-job",
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/managed-by": "helmhive-operator",
        LABEL_POOL: "claude",
        LABEL_WARM: "true",
    }
    assert meta["ownerReferences"] == [build_owner_reference(POOL)]
    assert meta["ownerReferences"][0]["controller"] is True
    assert meta["namespace"] == "team-a" and meta["generateName"] == "claude-job-"
    assert "activeDeadlineSeconds" not in warm()["spec"]


def test_a_cold_pod_is_created_claimed_by_its_job() -> None:
    pod = cold(timeout=600)
    meta = pod["metadata"]
    assert meta["labels"] == {
        "app.kubernetes.io/name": "helmhive-job",
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/managed-by": "helmhive-operator",
        LABEL_POOL: "claude",
        LABEL_JOB: "review-42",
        LABEL_RUNNER: "claude-0",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": API_VERSION,
            "kind": "AgentJob",
            "name": JOB.name,
            "uid": JOB.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert pod["spec"]["activeDeadlineSeconds"] == 600 + DEADLINE_MARGIN_SECONDS == 720


def test_the_warm_template_made_cold_is_the_pod_the_builder_makes_for_the_job() -> None:
    template = warm()
    before = json.dumps(template, sort_keys=True)
    made = build_cold_job_pod(template, job=JOB, runner="claude-0", timeout_seconds=1800)
    assert made == cold(timeout=1800)  # the runner's cold pod is the operator's, field for field
    assert json.dumps(template, sort_keys=True) == before  # the template is not changed


def test_the_cold_pod_is_the_warm_pod_with_the_claim_applied() -> None:
    template = warm()
    read = PodView.parse({"metadata": template["metadata"]})
    patch = build_claim_patch(
        pod=read, job_name=JOB.name, job_uid=JOB.uid, runner="claude-0", timeout_seconds=600, now=NOW_UNUSED
    )
    made = build_cold_job_pod(template, job=JOB, runner="claude-0", timeout_seconds=600)
    assert made["metadata"]["ownerReferences"] == patch["metadata"]["ownerReferences"]
    assert made["metadata"]["labels"] == {
        **{k: v for k, v in template["metadata"]["labels"].items() if k != LABEL_WARM},
        LABEL_JOB: JOB.name,
        LABEL_RUNNER: "claude-0",
    }
    assert made["spec"]["activeDeadlineSeconds"] == patch["spec"]["activeDeadlineSeconds"] == 600 + 120
    assert made["metadata"]["generateName"] == "claude-job-" and "name" not in made["metadata"]


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ({"kind": "Secret", "spec": {}}, "not a Pod"),
        ({"kind": "Pod"}, "not a Pod"),
        ({"kind": "Pod", "metadata": {"labels": {}}, "spec": {}}, "not a warm job pod"),
        (cold, "not a warm job pod"),
    ],
    ids=["not-a-pod", "no-spec", "not-warm", "claimed"],
)
def test_only_a_warm_pod_template_makes_a_cold_pod(template: Any, match: str) -> None:
    body = template() if callable(template) else template
    with pytest.raises(ValueError, match=match):
        build_cold_job_pod(body, job=JOB, runner="claude-0", timeout_seconds=60)
    with pytest.raises(ValueError):
        build_cold_job_pod(warm(), job=JOB, runner="", timeout_seconds=60)
    with pytest.raises(ValueError):
        build_cold_job_pod(warm(), job=JOB, runner="claude-0", timeout_seconds=0)


@pytest.mark.parametrize(
    ("job", "runner", "timeout"),
    [(None, "claude-0", None), (None, None, 60), (JOB, None, 60), (JOB, "claude-0", None), (JOB, "claude-0", 0)],
)
def test_arguments_that_do_not_make_a_warm_or_a_cold_pod_are_refused(
    job: JobRef | None, runner: str | None, timeout: int | None
) -> None:
    with pytest.raises(ValueError):
        build_job_pod(pool=POOL, pool_spec=spec(), namespace="team-a", job=job, runner=runner, timeout_seconds=timeout)


def test_a_pool_not_in_job_pod_mode_or_another_namespace_is_refused() -> None:
    with pytest.raises(ValueError, match="InRunner"):
        warm(execution={"mode": "InRunner"})
    with pytest.raises(ValueError, match="must be in team-a"):
        build_job_pod(pool=POOL, pool_spec=spec(), namespace="other", job=None, runner=None, timeout_seconds=None)


def test_long_names_fit_a_label_and_a_63_character_pod_name() -> None:
    long_job = "a" * 62 + "-b" + "c" * 100
    assert label_value(long_job) == "a" * 62  # cut at 63, then the trailing "-" dropped
    assert label_value("job.v1") == "job.v1"
    pool = "p" * 52
    assert len(job_pod_name_prefix(pool)) + 5 <= 63
    assert len(job_pod_name_prefix("x" * 253)) + 5 == 63
    pod = build_job_pod(
        pool=POOL,
        pool_spec=spec(),
        namespace="team-a",
        job=JobRef(name=long_job, uid="u"),
        runner="r-",
        timeout_seconds=60,
    )
    assert pod["metadata"]["labels"][LABEL_JOB] == "a" * 62
    assert pod["metadata"]["labels"][LABEL_RUNNER] == "r"
    assert pod["metadata"]["ownerReferences"][0]["name"] == long_job


# --- the NetworkPolicies -------------------------------------------------------------------------


def test_the_runner_side_identity_is_the_runner_builders_own() -> None:
    """jobpods imports nothing of runners (their pool builders import it): these pin the copies."""
    stateful_set = build_stateful_set(POOL, spec(), credential_generation=1)
    assert build_runner_selector(POOL.name) == stateful_set["spec"]["selector"]["matchLabels"]
    runner_labels = stateful_set["spec"]["template"]["metadata"]["labels"]
    assert set(build_runner_selector(POOL.name).items()) <= set(build_pool_labels(POOL.name).items())
    assert not set(build_job_pod_selector(POOL.name).items()) <= set(runner_labels.items())
    assert not set(build_runner_selector(POOL.name).items()) <= set(warm()["metadata"]["labels"].items())
    assert build_pool_owner_reference(POOL) == build_owner_reference(POOL)


def test_job_pods_talk_only_to_their_runners() -> None:
    policy = build_job_pod_network_policy(pool=POOL, namespace="team-a")
    runners = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "helmhive-runner", LABEL_POOL: "claude"}}}
    assert policy["metadata"]["name"] == "helmhive-job-claude"
    assert policy["metadata"]["namespace"] == "team-a"
    assert policy["metadata"]["ownerReferences"] == [build_owner_reference(POOL)]
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "helmhive-job", LABEL_POOL: "claude"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [runners], "ports": [{"protocol": "TCP", "port": LINK_PORT}]}],
        "egress": [{"to": [runners], "ports": [{"protocol": "TCP", "port": RUNNER_PROXY_PORT}]}],
    }
    # the policy's selector takes warm and claimed pods alike
    selector = policy["spec"]["podSelector"]["matchLabels"].items()
    assert set(selector) <= set(warm()["metadata"]["labels"].items())
    assert set(selector) <= set(cold()["metadata"]["labels"].items())


def test_runner_pods_get_the_mirror_image() -> None:
    rules = build_runner_job_pod_rules(pool="claude")
    job_pods = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "helmhive-job", LABEL_POOL: "claude"}}}
    assert rules.ingress == ({"from": [job_pods], "ports": [{"protocol": "TCP", "port": RUNNER_PROXY_PORT}]},)
    assert rules.egress == ({"to": [job_pods], "ports": [{"protocol": "TCP", "port": LINK_PORT}]},)


# --- the link key ---------------------------------------------------------------------------------


def test_the_link_secret_holds_the_callers_key() -> None:
    key = bytes(range(32))
    secret = build_link_secret(pool=POOL, namespace="team-a", key=key)
    assert secret["metadata"]["name"] == link_secret_name("claude") == "claude-jobpod-link"
    assert secret["metadata"]["ownerReferences"] == [build_owner_reference(POOL)]
    assert secret["type"] == "Opaque"
    assert base64.b64decode(secret["data"][LINK_SECRET_KEY]) == key
    with pytest.raises(ValueError, match="at least 32"):
        build_link_secret(pool=POOL, namespace="team-a", key=b"short")
    with pytest.raises(ValueError):
        build_link_secret(pool=POOL, namespace="elsewhere", key=key)


def test_the_public_names_are_pinned() -> None:
    from helmhive.api import execution
    from helmhive.policy.jobpods import identity, link, network, outcome, pod, view, warmset

    assert execution.__all__ == [
        "DEFAULT_START_TIMEOUT_SECONDS",
        "EXECUTION_RULES",
        "MAX_WARM_PODS",
        "ExecutionMode",
        "ExecutionSpec",
        "decide_execution_problems",
    ]
    assert identity.__all__ == [
        "JOB_POD_NAME",
        "JobRef",
        "PoolIdentity",
        "build_job_owner_reference",
        "build_job_pod_labels",
        "build_job_pod_selector",
        "build_pool_object_labels",
        "build_pool_owner_reference",
        "build_runner_selector",
        "label_value",
    ]
    assert pod.__all__ == [
        "DEADLINE_MARGIN_SECONDS",
        "JOB_POD_UID",
        "SHIM_RESOURCES",
        "TERMINATION_GRACE_SECONDS",
        "build_claim_patch",
        "build_cold_job_pod",
        "build_job_pod",
        "decide_claim_deadline",
        "job_pod_name_prefix",
    ]
    assert network.__all__ == [
        "RunnerJobPodRules",
        "build_job_pod_network_policy",
        "build_runner_job_pod_rules",
        "job_pod_policy_name",
    ]
    assert link.__all__ == ["LINK_KEY_BYTES", "build_link_secret"]
    assert warmset.__all__ == ["WarmPlan", "WarmVerdict", "decide_warm_condition", "decide_warm_pods"]
    assert outcome.__all__ == [
        "CANNOT_RUN_REASONS",
        "CANNOT_START_REASONS",
        "JobPodOutcome",
        "decide_job_pod_outcome",
        "decide_start_timeout",
    ]
    assert "PodView" in view.__all__
    for module in (execution, identity, link, network, outcome, pod, view, warmset):
        assert all(hasattr(module, name) for name in module.__all__), module.__name__

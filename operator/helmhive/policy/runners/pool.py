"""Builds the Kubernetes objects a RunnerPool becomes, and decides its credential generation. Pure.

A pool ``P`` in namespace ``N`` becomes (names and labels are the contract in ``docs/runners.md``):
ServiceAccount, Role, RoleBinding, ConfigMap (``runner.json``) and NetworkPolicy
``helmhive-runner-P``; StatefulSet ``P``; and PodDisruptionBudget ``P`` when replicas > 1.
In ``execution.mode: JobPod`` also the job pods' NetworkPolicy ``helmhive-job-P``
(:mod:`helmhive.policy.jobpods`), and its runners may drive pods. Every object carries an
ownerReference to the pool, so the garbage collector removes them.

The NetworkPolicy's HTTPS egress excepts the cluster's pod networks when the platform names them
(:func:`~helmhive.policy.runners.cidrs.parse_cluster_cidrs`, the operator's ``--runner-cluster-cidrs``,
re-exported here); the operator does not discover them.

Nothing here does I/O. The runner pod itself (container, environment, volumes, placement) is
:mod:`helmhive.policy.runners.pod`; the credential's hash and generation are
:mod:`helmhive.policy.runners.credentials`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from helmhive.api.egress import decide_isolation
from helmhive.api.execution import ExecutionMode
from helmhive.api.kinds import API_VERSION, GROUP
from helmhive.api.runnerpool import AdapterType, RunnerPoolSpec
from helmhive.policy.jobpods.network import build_job_pod_network_policy, build_runner_job_pod_rules
from helmhive.policy.jobpods.pod import build_job_pod
from helmhive.policy.runners.cidrs import MAX_CLUSTER_CIDRS, ClusterCidrError, ClusterNetwork, parse_cluster_cidrs
from helmhive.policy.runners.pod import GENERATION_ANNOTATION, build_pod_spec

__all__ = [
    "EXECUTION_ROLE_RULES",
    "JOB_POD_ROLE_RULES",
    "MAX_CLUSTER_CIDRS",
    "MAX_POOL_NAME",
    "RUNNER_NAME_PREFIX",
    "RUNNER_ROLE_RULES",
    "SESSIONS_SECRET_PREFIX",
    "ClusterCidrError",
    "ClusterNetwork",
    "PoolRef",
    "build_config_map",
    "build_network_policy",
    "build_owner_reference",
    "build_pod_disruption_budget",
    "build_pool_labels",
    "build_pool_objects",
    "build_role",
    "build_role_binding",
    "build_runner_config",
    "build_service_account",
    "build_sessions_secret",
    "build_stateful_set",
    "decide_pool_name_problem",
    "decide_pruned_objects",
    "parse_cluster_cidrs",
    "runner_resource_name",
    "sessions_secret_names",
]

CONFIG_HASH_ANNOTATION = "helmhive.dev/config-hash"
CLAUDE_CONFIG_DIR_ENV = "CLAUDE_CONFIG_DIR"
RUNNER_NAME_PREFIX = "helmhive-runner-"
# A StatefulSet's pods carry a controller-revision-hash label of ``<name>-<10 chars>`` (63 max).
MAX_POOL_NAME = 52

RUNNER_ROLE_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [GROUP], "resources": ["runners"], "verbs": ["get", "list", "watch", "create"]},
    {"apiGroups": [GROUP], "resources": ["runners/status"], "verbs": ["get", "patch", "update"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "update", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
"""What a runner needs to register, heartbeat and report, in its own namespace (no Secrets, no Pods)."""

EXECUTION_ROLE_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [GROUP], "resources": ["agentjobs"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [GROUP], "resources": ["agentjobs/status"], "verbs": ["get", "patch"]},
    {"apiGroups": [GROUP], "resources": ["memoryrecords"], "verbs": ["get"]},
    {"apiGroups": [GROUP], "resources": ["sessionbindings"], "verbs": ["get", "create"]},
    {"apiGroups": [GROUP], "resources": ["sessionbindings/status"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create"]},
)
"""What a runner needs to run its jobs. Each pod's writes are narrowed further by the
``helmhive-runner-execution`` admission policy (its own jobs, bindings, Secret, artifacts)."""

JOB_POD_ROLE_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    # A claimed or cold job pod's ownerReference to its AgentJob blocks the job's deletion: that needs this.
    {"apiGroups": [GROUP], "resources": ["agentjobs/finalizers"], "verbs": ["update"]},
)
"""What a runner of a pool in mode JobPod adds: it claims, creates, watches and deletes its jobs' pods."""

SESSIONS_SECRET_PREFIX = "helmhive-sessions-"


def sessions_secret_names(pool: str, replicas: int) -> list[str]:
    """The per-pod Secrets in which a pool's runners keep native session ids."""
    return [f"{SESSIONS_SECRET_PREFIX}{pool}-{i}" for i in range(replicas)]


@dataclass(frozen=True, kw_only=True)
class PoolRef:
    """The identity of a RunnerPool object."""

    name: str
    namespace: str
    uid: str


def runner_resource_name(pool: str) -> str:
    """The name of the pool's ServiceAccount, Role, RoleBinding, ConfigMap and NetworkPolicy."""
    return f"{RUNNER_NAME_PREFIX}{pool}"


def decide_pool_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a pool's StatefulSet, or None."""
    if len(name) > MAX_POOL_NAME:
        return f"a RunnerPool name may have at most {MAX_POOL_NAME} characters (its pods are {name}-<n>)"
    return None


def build_pool_labels(pool: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "helmhive-runner",
        "app.kubernetes.io/managed-by": "helmhive-operator",
        "helmhive.dev/pool": pool,
    }


def _selector(pool: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "helmhive-runner", "helmhive.dev/pool": pool}


def build_owner_reference(pool: PoolRef) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "RunnerPool",
        "name": pool.name,
        "uid": pool.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(pool: PoolRef, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": pool.namespace,
        "labels": build_pool_labels(pool.name),
        "ownerReferences": [build_owner_reference(pool)],
    }


def build_service_account(pool: PoolRef) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(pool, runner_resource_name(pool.name))}


def build_role(pool: PoolRef, *, replicas: int, mode: ExecutionMode = ExecutionMode.IN_RUNNER) -> dict[str, Any]:
    """The runner's Role: register, heartbeat, report, run jobs, and its pods' sessions Secrets by name.

    RBAC cannot limit ``create`` by name, so runners cannot create Secrets at all; the operator
    creates each empty ``helmhive-sessions-<pod>`` (:func:`build_sessions_secret`). In ``mode``
    JobPod the runners also drive their jobs' pods (:data:`JOB_POD_ROLE_RULES`).
    """
    job_pods = JOB_POD_ROLE_RULES if mode is ExecutionMode.JOB_POD else ()
    rules = [dict(rule) for rule in (*RUNNER_ROLE_RULES, *EXECUTION_ROLE_RULES, *job_pods)]
    names = sessions_secret_names(pool.name, replicas)
    if names:
        rules.append({"apiGroups": [""], "resources": ["secrets"], "resourceNames": names, "verbs": ["get", "patch"]})
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(pool, runner_resource_name(pool.name)),
        "rules": rules,
    }


def build_sessions_secret(pool: PoolRef, index: int) -> dict[str, Any]:
    """The empty Secret in which runner pod ``<pool>-<index>`` keeps its native session ids."""
    name = f"{pool.name}-{index}"
    meta = _meta(pool, f"{SESSIONS_SECRET_PREFIX}{name}")
    meta["labels"] = {**meta["labels"], "helmhive.dev/runner": name}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta}


def build_role_binding(pool: PoolRef) -> dict[str, Any]:
    name = runner_resource_name(pool.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(pool, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pool.namespace}],
    }


def build_runner_config(pool: PoolRef, spec: RunnerPoolSpec) -> dict[str, Any]:
    """The content of ``runner.json``: the pool-derived settings the runner reads at start.

    The keys are the runner's ``RunnerFileConfig`` (camelCase, unknown keys refused); where
    the credential is comes from the environment (``HELMHIVE_CREDENTIAL_FILE`` or ``_DIR``).
    ``execution`` is the pool's ``spec.execution`` but ``warmPods`` (the operator keeps the warm pods;
    a change of their number rolls no runner); in mode JobPod, ``jobPodTemplate`` is the
    warm job pod (:func:`~helmhive.policy.jobpods.pod.build_job_pod`) the runner makes a cold one from.
    """
    config: dict[str, Any] = {
        "provider": spec.provider,
        "adapter": spec.adapter.to_wire(),
        "placementLabels": dict(spec.placement_labels),
        "capabilities": list(spec.capabilities),
        "concurrency": spec.concurrency,
        "heartbeat": spec.heartbeat.model_dump(mode="json", by_alias=True),
        "credentialEnvName": spec.credential.env_name,
        "jobLimits": spec.job_limits.to_wire(),
        "compaction": spec.compaction.to_wire(),
        "credentialIsolation": decide_isolation(
            requested=spec.credential_isolation,
            volume=spec.credential.volume is not None,
            provider=spec.provider,
            upstream=spec.egress.upstream,
        ).value,
        "egress": spec.egress.to_wire(),
        # warmPods is the operator's alone: a change of it must not restart the runners (config hash).
        "execution": spec.execution.model_copy(update={"warm_pods": 0}).to_wire(),
    }
    if spec.credential.volume is not None and spec.adapter.type is AdapterType.CLAUDE_CLI:
        config["credentialDirEnvName"] = CLAUDE_CONFIG_DIR_ENV
    if spec.execution.mode is ExecutionMode.JOB_POD:
        config["jobPodTemplate"] = build_job_pod(
            pool=pool, pool_spec=spec, namespace=pool.namespace, job=None, runner=None, timeout_seconds=None
        )
    return config


def _config_text(pool: PoolRef, spec: RunnerPoolSpec) -> str:
    return json.dumps(build_runner_config(pool, spec), sort_keys=True, indent=2) + "\n"


def build_config_map(pool: PoolRef, spec: RunnerPoolSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(pool, runner_resource_name(pool.name)),
        "data": {"runner.json": _config_text(pool, spec)},
    }


def build_stateful_set(pool: PoolRef, spec: RunnerPoolSpec, *, credential_generation: int) -> dict[str, Any]:
    """The runner pods (:func:`~helmhive.policy.runners.pod.build_pod_spec`): stable names, one pod per runner.

    The template's annotations roll the pods when the credential's generation or ``runner.json`` changes;
    it also carries the pool's ``podMetadata``.
    """
    config_hash = hashlib.sha256(_config_text(pool, spec).encode()).hexdigest()[:16]
    name = runner_resource_name(pool.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(pool, pool.name),
        "spec": {
            "replicas": spec.replicas,
            "serviceName": pool.name,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": _selector(pool.name)},
            "template": {
                "metadata": {
                    # The pool's own keys cannot clash: the model refuses Helmhive's (PodMetadata).
                    "labels": {**spec.pod_metadata.labels, **build_pool_labels(pool.name)},
                    "annotations": {
                        **spec.pod_metadata.annotations,
                        GENERATION_ANNOTATION: str(credential_generation),
                        CONFIG_HASH_ANNOTATION: config_hash,
                    },
                },
                "spec": build_pod_spec(pool=pool.name, spec=spec, service_account=name, config_map=name),
            },
        },
    }


HTTPS_PORTS: tuple[dict[str, Any], ...] = ({"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443})
DNS_PORTS: tuple[dict[str, Any], ...] = ({"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53})


def _https_destinations(cluster_cidrs: Sequence[ClusterNetwork]) -> list[dict[str, Any]]:
    """Every address of each family the cluster CIDRs name, except those networks."""
    blocks = []
    for everything, version in (("0.0.0.0/0", 4), ("::/0", 6)):
        excepted = [str(n) for n in cluster_cidrs if n.version == version]
        if excepted:
            blocks.append({"ipBlock": {"cidr": everything, "except": excepted}})
    return blocks


def build_network_policy(
    pool: PoolRef, *, cluster_cidrs: Sequence[ClusterNetwork] = (), mode: ExecutionMode = ExecutionMode.IN_RUNNER
) -> dict[str, Any]:
    """Deny all ingress; allow egress only to DNS (53) and HTTPS (443, and 6443 for API servers).

    DNS goes to any address (the cluster's DNS is a pod). HTTPS goes to any address when
    ``cluster_cidrs`` is empty; otherwise to every address of the families they name except
    those networks, so no pod in them answers a runner there. A family none of them is in gets no
    HTTPS egress at all (fail closed: its pod network is unknown). In ``mode`` JobPod the pool's
    job pods may reach the runners' proxy, and the runners their link
    (:func:`~helmhive.policy.jobpods.network.build_runner_job_pod_rules`).
    """
    https: dict[str, Any] = {"ports": [dict(p) for p in HTTPS_PORTS]}
    if cluster_cidrs:
        https = {"to": _https_destinations(cluster_cidrs), **https}
    ingress: list[dict[str, Any]] = []
    egress: list[dict[str, Any]] = [{"ports": [dict(p) for p in DNS_PORTS]}, https]
    if mode is ExecutionMode.JOB_POD:
        job_pods = build_runner_job_pod_rules(pool=pool.name)
        ingress += job_pods.ingress
        egress += job_pods.egress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool, runner_resource_name(pool.name)),
        "spec": {
            "podSelector": {"matchLabels": _selector(pool.name)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def build_pod_disruption_budget(pool: PoolRef, spec: RunnerPoolSpec) -> dict[str, Any] | None:
    """At most one runner voluntarily disrupted at a time; only for pools of more than one."""
    if spec.replicas <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(pool, pool.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(pool.name)}},
    }


def build_pool_objects(
    pool: PoolRef,
    spec: RunnerPoolSpec,
    *,
    credential_generation: int,
    cluster_cidrs: Sequence[ClusterNetwork] = (),
) -> list[dict[str, Any]]:
    """Every object the pool owns, in apply order (identity and RBAC before the pods).

    ``cluster_cidrs`` is the operator's setting, the same for every pool (:func:`build_network_policy`).
    In mode JobPod the job pods' NetworkPolicy comes before the StatefulSet; it is never pruned (a
    job pod left running after a switch back to InRunner stays fenced), the garbage collector
    removes it with the pool. The link key is not here: it is created once, never applied
    (:func:`helmhive.policy.jobpods.link.build_link_secret`).
    """
    mode = spec.execution.mode
    job_pods = (
        [build_job_pod_network_policy(pool=pool, namespace=pool.namespace)] if mode is ExecutionMode.JOB_POD else []
    )
    objects = [
        build_service_account(pool),
        build_role(pool, replicas=spec.replicas, mode=mode),
        build_role_binding(pool),
        build_config_map(pool, spec),
        build_network_policy(pool, cluster_cidrs=cluster_cidrs, mode=mode),
        *job_pods,
        build_stateful_set(pool, spec, credential_generation=credential_generation),
    ]
    objects += [build_sessions_secret(pool, i) for i in range(spec.replicas)]
    pdb = build_pod_disruption_budget(pool, spec)
    return [*objects, pdb] if pdb is not None else objects


def decide_pruned_objects(pool: PoolRef, spec: RunnerPoolSpec) -> list[tuple[str, str, str]]:
    """Owned objects the spec no longer wants, as (apiVersion, kind, name)."""
    if spec.replicas <= 1:
        return [("policy/v1", "PodDisruptionBudget", pool.name)]
    return []

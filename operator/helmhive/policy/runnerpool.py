"""Builds the Kubernetes objects a RunnerPool becomes, and decides its credential generation. Pure.

A pool ``P`` in namespace ``N`` becomes (names and labels are the contract in ``docs/runners.md``):
ServiceAccount, Role, RoleBinding, ConfigMap (``runner.json``) and NetworkPolicy
``helmhive-runner-P``; StatefulSet ``P``; and PodDisruptionBudget ``P`` when replicas > 1.
Every object carries an ownerReference to the pool, so the garbage collector removes them.

Nothing here does I/O. The credential's hash and generation are :mod:`helmhive.policy.credentials`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from helmhive.api.egress import decide_isolation
from helmhive.api.kinds import API_VERSION, GROUP
from helmhive.api.runnerpool import AdapterType, RunnerPoolSpec

__all__ = [
    "CONFIG_PATH",
    "CREDENTIAL_DIR",
    "EXECUTION_ROLE_RULES",
    "GENERATION_ANNOTATION",
    "MAX_POOL_NAME",
    "METRICS_PORT",
    "RUNNER_NAME_PREFIX",
    "RUNNER_ROLE_RULES",
    "SESSIONS_SECRET_PREFIX",
    "SOURCE_CREDENTIALS_DIR",
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
    "runner_resource_name",
    "sessions_secret_names",
]

GENERATION_ANNOTATION = "helmhive.dev/credential-generation"
CONFIG_HASH_ANNOTATION = "helmhive.dev/config-hash"
CONFIG_DIR = "/etc/helmhive"
CONFIG_PATH = f"{CONFIG_DIR}/runner.json"
CREDENTIAL_DIR = "/var/run/helmhive/credential"
SOURCE_CREDENTIALS_DIR = "/var/run/helmhive/source-credentials"
"""Where the pool's git credentials Secret is mounted (read-only), for the runner's source fetch."""
STATE_DIR = "/var/lib/helmhive"
HOME_DIR = "/home/runner"
RUNNER_UID = 65532
METRICS_PORT = 9090
"""The runner's Prometheus ``/metrics`` port: the container port named ``metrics`` and ``HELMHIVE_METRICS_PORT``."""
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


def build_role(pool: PoolRef, *, replicas: int) -> dict[str, Any]:
    """The runner's Role: register, heartbeat, report, run jobs, and its pods' sessions Secrets by name.

    RBAC cannot limit ``create`` by name, so runners cannot create Secrets at all; the operator
    creates each empty ``helmhive-sessions-<pod>`` (:func:`build_sessions_secret`).
    """
    rules = [dict(rule) for rule in (*RUNNER_ROLE_RULES, *EXECUTION_ROLE_RULES)]
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


def _credential_paths(spec: RunnerPoolSpec) -> tuple[str | None, str | None]:
    """(file, directory) where the runner finds its credential."""
    cred = spec.credential
    if cred.secret_ref is not None:
        if cred.secret_ref.key:
            return f"{CREDENTIAL_DIR}/{cred.secret_ref.key}", None
        return None, CREDENTIAL_DIR
    if cred.volume is not None:
        return None, cred.volume.mount_path
    return None, None


def build_runner_config(spec: RunnerPoolSpec) -> dict[str, Any]:
    """The content of ``runner.json``: the pool-derived settings the runner reads at start.

    The keys are the runner's ``RunnerFileConfig`` (camelCase, unknown keys refused); where
    the credential is comes from the environment (``HELMHIVE_CREDENTIAL_FILE`` or ``_DIR``).
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
    }
    if spec.credential.volume is not None and spec.adapter.type is AdapterType.CLAUDE_CLI:
        config["credentialDirEnvName"] = CLAUDE_CONFIG_DIR_ENV
    return config


def _config_text(spec: RunnerPoolSpec) -> str:
    return json.dumps(build_runner_config(spec), sort_keys=True, indent=2) + "\n"


def build_config_map(pool: PoolRef, spec: RunnerPoolSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(pool, runner_resource_name(pool.name)),
        "data": {"runner.json": _config_text(spec)},
    }


def _env(pool: str, spec: RunnerPoolSpec) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    env: list[dict[str, Any]] = [
        {"name": "HELMHIVE_RUNNER_NAME", "valueFrom": field("metadata.name")},
        {"name": "HELMHIVE_NAMESPACE", "valueFrom": field("metadata.namespace")},
        {"name": "HELMHIVE_POOL", "value": pool},
        {"name": "HELMHIVE_RUNNER_CONFIG", "value": CONFIG_PATH},
        {
            "name": "HELMHIVE_CREDENTIAL_GENERATION",
            "valueFrom": field(f"metadata.annotations['{GENERATION_ANNOTATION}']"),
        },
    ]
    file, directory = _credential_paths(spec)
    if file:
        env.append({"name": "HELMHIVE_CREDENTIAL_FILE", "value": file})
    if directory:
        env.append({"name": "HELMHIVE_CREDENTIAL_DIR", "value": directory})
    if spec.source.credentials_secret is not None:
        env.append({"name": "HELMHIVE_SOURCE_CREDENTIALS_DIR", "value": SOURCE_CREDENTIALS_DIR})
    env += [
        {"name": "HELMHIVE_STATE_DIR", "value": STATE_DIR},
        {"name": "HOME", "value": HOME_DIR},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "HELMHIVE_METRICS_PORT", "value": str(METRICS_PORT)},
    ]
    return env


def _volumes(pool: str, spec: RunnerPoolSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts): config, scratch, home and tmp emptyDirs, the credential, and git credentials."""
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": runner_resource_name(pool)}},
        {"name": "state", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "state", "mountPath": STATE_DIR},
        {"name": "home", "mountPath": HOME_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    cred = spec.credential
    if cred.secret_ref is not None:
        secret: dict[str, Any] = {"secretName": cred.secret_ref.name, "defaultMode": 0o440}
        if cred.secret_ref.key:
            secret["items"] = [{"key": cred.secret_ref.key, "path": cred.secret_ref.key}]
        volumes.append({"name": "credential", "secret": secret})
        mounts.append({"name": "credential", "mountPath": CREDENTIAL_DIR, "readOnly": True})
    elif cred.volume is not None:
        volumes.append({"name": "credential", "persistentVolumeClaim": {"claimName": cred.volume.claim_name}})
        mounts.append({"name": "credential", "mountPath": cred.volume.mount_path})
    git = spec.source.credentials_secret
    if git is not None:
        # Optional and without `items`: a missing Secret or key fails only the jobs that fetch a
        # source, with a named reason, instead of keeping every pod of the pool from starting.
        secret = {"secretName": git.name, "defaultMode": 0o440, "optional": True}
        volumes.append({"name": "source-credentials", "secret": secret})
        mounts.append({"name": "source-credentials", "mountPath": SOURCE_CREDENTIALS_DIR, "readOnly": True})
    return volumes, mounts


def _scheduling(spec: RunnerPoolSpec) -> dict[str, Any]:
    """The pod spec's placement fields the pool sets (none by default)."""
    placement: dict[str, Any] = {}
    if spec.node_selector:
        placement["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        placement["tolerations"] = [t.to_wire() for t in spec.tolerations]
    if spec.priority_class_name:
        placement["priorityClassName"] = spec.priority_class_name
    return placement


def build_stateful_set(pool: PoolRef, spec: RunnerPoolSpec, *, credential_generation: int) -> dict[str, Any]:
    """The runner pods: stable names, Pod Security Standards ``restricted``, one pod per runner."""
    labels = build_pool_labels(pool.name)
    volumes, mounts = _volumes(pool.name, spec)
    config_hash = hashlib.sha256(_config_text(spec).encode()).hexdigest()[:16]
    container = {
        "name": "runner",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["helmhive", "runner", "run"],
        "env": _env(pool.name, spec),
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "resources": spec.resources.to_wire(),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
    }
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
                    "labels": labels,
                    "annotations": {
                        GENERATION_ANNOTATION: str(credential_generation),
                        CONFIG_HASH_ANNOTATION: config_hash,
                    },
                },
                "spec": {
                    "serviceAccountName": runner_resource_name(pool.name),
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUNNER_UID,
                        "runAsGroup": RUNNER_UID,
                        "fsGroup": RUNNER_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                    **_scheduling(spec),
                    **(
                        {"imagePullSecrets": [{"name": ref.name} for ref in spec.image_pull_secrets]}
                        if spec.image_pull_secrets
                        else {}
                    ),
                },
            },
        },
    }


def build_network_policy(pool: PoolRef) -> dict[str, Any]:
    """Deny all ingress; allow egress only to DNS (53) and HTTPS (443, and 6443 for API servers)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool, runner_resource_name(pool.name)),
        "spec": {
            "podSelector": {"matchLabels": _selector(pool.name)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [
                {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]},
            ],
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


def build_pool_objects(pool: PoolRef, spec: RunnerPoolSpec, *, credential_generation: int) -> list[dict[str, Any]]:
    """Every object the pool owns, in apply order (identity and RBAC before the pods)."""
    objects = [
        build_service_account(pool),
        build_role(pool, replicas=spec.replicas),
        build_role_binding(pool),
        build_config_map(pool, spec),
        build_network_policy(pool),
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

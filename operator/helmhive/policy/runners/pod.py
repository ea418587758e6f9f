"""The runner pod a RunnerPool's StatefulSet makes: its container, environment, volumes and placement. Pure.

Pod Security Standards ``restricted``: non-root (uid 65532), no privilege escalation, every
capability dropped, ``RuntimeDefault`` seccomp and a read-only root filesystem, with ``emptyDir``
volumes for the runner's state, home and ``/tmp``. The pool's ``runner.json`` is mounted read-only
at :data:`CONFIG_PATH`, its credential at :data:`CREDENTIAL_DIR` (a Secret) or its own mount path
(a login volume). In ``execution.mode: JobPod`` the runner drives its jobs' pods: it also mounts
the pool's link key (:data:`~helmhive.api.jobpod.RUNNER_LINK_KEY_DIR`) and serves their provider
requests on the port named :data:`JOB_POD_EGRESS_PORT_NAME`. The StatefulSet around the pod, and
the pool's other objects, are :mod:`helmhive.policy.runners.pool`.
"""

from __future__ import annotations

from typing import Any

from helmhive.api.execution import ExecutionMode
from helmhive.api.jobpod import LINK_SECRET_KEY, RUNNER_LINK_KEY_DIR, RUNNER_PROXY_PORT, link_secret_name
from helmhive.api.runnerpool import RunnerPoolSpec

__all__ = [
    "CONFIG_PATH",
    "CREDENTIAL_DIR",
    "GENERATION_ANNOTATION",
    "JOB_POD_EGRESS_PORT_NAME",
    "METRICS_PORT",
    "SOURCE_CREDENTIALS_DIR",
    "build_pod_placement",
    "build_pod_spec",
]

GENERATION_ANNOTATION = "helmhive.dev/credential-generation"
"""On the pod template: the pool's credential generation (a new one rolls the pods), read by the runner."""
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
JOB_POD_EGRESS_PORT_NAME = "jobpod-egress"
"""The container port (:data:`~helmhive.api.jobpod.RUNNER_PROXY_PORT`) where job pods' provider requests arrive."""


def build_pod_spec(*, pool: str, spec: RunnerPoolSpec, service_account: str, config_map: str) -> dict[str, Any]:
    """The pod template's spec: one ``runner`` container running ``helmhive runner run``."""
    volumes, mounts = _volumes(spec, config_map)
    ports = [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
    if spec.execution.mode is ExecutionMode.JOB_POD:
        ports.append({"name": JOB_POD_EGRESS_PORT_NAME, "containerPort": RUNNER_PROXY_PORT, "protocol": "TCP"})
        # 0440 with the pod's fsGroup: the runner (gid 65532) reads it; the shim mounts its own copy.
        key = {"key": LINK_SECRET_KEY, "path": LINK_SECRET_KEY}
        secret = {"secretName": link_secret_name(pool), "defaultMode": 0o440, "items": [key]}
        volumes.append({"name": "jobpod-link", "secret": secret})
        mounts.append({"name": "jobpod-link", "mountPath": RUNNER_LINK_KEY_DIR, "readOnly": True})
    container = {
        "name": "runner",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["helmhive", "runner", "run"],
        "env": _env(pool, spec),
        "ports": ports,
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
        "serviceAccountName": service_account,
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
        **build_pod_placement(spec),
        **(
            {"imagePullSecrets": [{"name": ref.name} for ref in spec.image_pull_secrets]}
            if spec.image_pull_secrets
            else {}
        ),
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


def _env(pool: str, spec: RunnerPoolSpec) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    env: list[dict[str, Any]] = [
        {"name": "HELMHIVE_RUNNER_NAME", "valueFrom": field("metadata.name")},
        {"name": "HELMHIVE_NAMESPACE", "valueFrom": field("metadata.namespace")},
        # Where its job pods reach the runner's proxy (mode JobPod); set for every pool, as it costs nothing.
        {"name": "HELMHIVE_POD_IP", "valueFrom": field("status.podIP")},
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


def _volumes(spec: RunnerPoolSpec, config_map: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts): config, scratch, home and tmp emptyDirs, the credential, and git credentials."""
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map}},
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


def build_pod_placement(spec: RunnerPoolSpec) -> dict[str, Any]:
    """The pod spec's placement fields the pool sets (none by default), for its runner and job pods."""
    placement: dict[str, Any] = {}
    if spec.node_selector:
        placement["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        placement["tolerations"] = [t.to_wire() for t in spec.tolerations]
    if spec.priority_class_name:
        placement["priorityClassName"] = spec.priority_class_name
    return placement

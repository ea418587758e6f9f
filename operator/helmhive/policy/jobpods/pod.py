"""The job pod a RunnerPool in ``execution.mode: JobPod`` runs each job in, and the patch claiming a warm one. Pure.

Owns the Pod (:func:`build_job_pod`): two containers on the contract of :mod:`helmhive.api.jobpod`,
Pod Security Standards ``restricted`` (non-root uid 65532, no privilege escalation, every capability
dropped, ``RuntimeDefault`` seccomp, read-only root filesystems), no ServiceAccount token, no
Service links, and nothing of the pool's provider credential: the only Secret it mounts is the
pool's link key (:func:`helmhive.api.jobpod.link_secret_name`), in the shim alone. The agent's
container gets ``jobLimits`` as requests equal to limits (memory and CPU); the job volume and the
shim's copy of the tree are ``emptyDir`` volumes of ``jobLimits.diskBytes``.

A **warm** pod (``job`` None) is owned by its RunnerPool and labelled :data:`~helmhive.api.jobpod.LABEL_WARM`;
it has no deadline. A **cold** pod is created already claimed: owned by its AgentJob, labelled with the
job and its runner, and ended by the kubelet :data:`DEADLINE_MARGIN_SECONDS` after the job's timeout.
:func:`build_claim_patch` turns a warm pod into a claimed one; :func:`build_cold_job_pod` turns the warm
pod the operator hands its runners (runner.json's ``jobPodTemplate``) into a cold one with the same claim.

Must not do I/O or read the clock: the claim's ``now`` is the caller's.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

from helmhive.api.execution import ExecutionMode
from helmhive.api.jobpod import (
    AGENT_CONTAINER,
    JOB_HOME,
    JOB_TMP,
    JOB_WORKSPACE,
    LABEL_JOB,
    LABEL_RUNNER,
    LABEL_WARM,
    LINK_DIR,
    LINK_KEY_DIR,
    LINK_PORT,
    SHIM_CONTAINER,
    SHIM_DIR,
    link_secret_name,
)
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.policy.jobpods.identity import (
    JobRef,
    PoolIdentity,
    build_job_owner_reference,
    build_job_pod_labels,
    build_pool_owner_reference,
    label_value,
)
from helmhive.policy.jobpods.view import PodView
from helmhive.policy.runners.pod import build_pod_placement
from helmhive.policy.timestamps import as_utc

__all__ = [
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

JOB_POD_UID = 65532
"""The uid and gid both containers run as (the runner image's non-root user), and the volumes' fsGroup."""
DEADLINE_MARGIN_SECONDS = 120
"""Beyond the job's timeout, the time a job pod has for its setup (the tree and home from the runner)
and hand-back (the tree, the checks) before the kubelet ends it (``activeDeadlineSeconds``)."""
TERMINATION_GRACE_SECONDS = 10
"""The shim hands nothing back after a kill; the agent's processes need no long goodbye."""
SHIM_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "50m", "memory": "64Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi"},
}
"""The shim's fixed resources: it relays bytes and copies the tree, whatever the job."""
LINK_VOLUME_SIZE = "1Mi"
MAX_POD_NAME = 63
"""A pod's name is its hostname too: one DNS label."""
_GENERATED_SUFFIX = 5
"""The API server's random suffix after a ``generateName``."""
_NAME_SUFFIX = "-job-"


def job_pod_name_prefix(pool: str) -> str:
    """The ``generateName`` of the pool's job pods, ``<pool>-job-``, short enough for a 63-character name."""
    room = MAX_POD_NAME - _GENERATED_SUFFIX - len(_NAME_SUFFIX)
    return f"{pool[:room]}{_NAME_SUFFIX}"


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _job_mount(path: str, sub_path: str) -> dict[str, Any]:
    return {"name": "job", "mountPath": path, "subPath": sub_path}


def _shim(spec: RunnerPoolSpec) -> dict[str, Any]:
    return {
        "name": SHIM_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["helmhive-jobpod", "shim"],
        "env": [{"name": "HELMHIVE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "link", "containerPort": LINK_PORT, "protocol": "TCP"}],
        "resources": {kind: dict(values) for kind, values in SHIM_RESOURCES.items()},
        "securityContext": _security_context(),
        "volumeMounts": [
            _job_mount(JOB_WORKSPACE, "workspace"),
            _job_mount(JOB_HOME, "home"),
            {"name": "link", "mountPath": LINK_DIR},
            {"name": "link-key", "mountPath": LINK_KEY_DIR, "readOnly": True},
            {"name": "shim", "mountPath": SHIM_DIR},
        ],
    }


def _agent(spec: RunnerPoolSpec) -> dict[str, Any]:
    limits = spec.job_limits
    # Requests equal to limits: the scheduler reserves what the job may use (Guaranteed for memory),
    # so a job is never killed for a neighbour's use, only at its own limit.
    resources = {"memory": str(limits.memory_bytes), "cpu": f"{limits.cpu_millicores}m"}
    return {
        "name": AGENT_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["helmhive-jobpod", "agent"],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": _security_context(),
        "volumeMounts": [
            _job_mount(JOB_WORKSPACE, "workspace"),
            _job_mount(JOB_HOME, "home"),
            _job_mount(JOB_TMP, "tmp"),
            {"name": "link", "mountPath": LINK_DIR},
        ],
    }


def _volumes(pool: str, spec: RunnerPoolSpec) -> list[dict[str, Any]]:
    disk = str(spec.job_limits.disk_bytes)
    return [
        {"name": "job", "emptyDir": {"sizeLimit": disk}},
        {"name": "link", "emptyDir": {"medium": "Memory", "sizeLimit": LINK_VOLUME_SIZE}},
        {"name": "shim", "emptyDir": {"sizeLimit": disk}},
        # 0400, owner root: the fsGroup adds group read, so the shim (gid 65532) reads it and nothing else does.
        {"name": "link-key", "secret": {"secretName": link_secret_name(pool), "defaultMode": 0o400}},
    ]


def _placement(spec: RunnerPoolSpec) -> dict[str, Any]:
    """The pod spec's fields the pool sets: the runner pods' placement and pull secrets, and the RuntimeClass."""
    placement = build_pod_placement(spec)
    if spec.image_pull_secrets:
        placement["imagePullSecrets"] = [{"name": ref.name} for ref in spec.image_pull_secrets]
    if spec.execution.runtime_class_name:
        placement["runtimeClassName"] = spec.execution.runtime_class_name
    return placement


def _positive(value: int | None, what: str) -> int:
    if value is None or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}")
    return value


def build_job_pod(
    *,
    pool: PoolIdentity,
    pool_spec: RunnerPoolSpec,
    namespace: str,
    job: JobRef | None,
    runner: str | None,
    timeout_seconds: int | None,
) -> dict[str, Any]:
    """A job pod of ``pool``: warm when ``job`` is None, else cold (created claimed by ``job`` for ``runner``).

    A warm pod takes no ``runner`` or ``timeout_seconds`` (its claim sets them, :func:`build_claim_patch`);
    a cold one needs both. ``namespace`` is the pool's (an ownerReference cannot cross namespaces).
    Raises ValueError for a pool whose mode is not JobPod, and for arguments that break these rules.
    """
    if pool_spec.execution.mode is not ExecutionMode.JOB_POD:
        raise ValueError(f"RunnerPool {pool.name} runs its jobs {pool_spec.execution.mode.value}, not in job pods")
    if namespace != pool.namespace:
        raise ValueError(f"a job pod of {pool.namespace}/{pool.name} must be in {pool.namespace}, not {namespace}")
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": JOB_POD_UID,
            "runAsGroup": JOB_POD_UID,
            "fsGroup": JOB_POD_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_shim(pool_spec), _agent(pool_spec)],
        "volumes": _volumes(pool.name, pool_spec),
        **_placement(pool_spec),
    }
    if job is None:
        if runner is not None or timeout_seconds is not None:
            raise ValueError("a warm job pod has no runner and no timeout until it is claimed")
        owner = build_pool_owner_reference(pool)
    else:
        if not runner:
            raise ValueError(f"the job pod of AgentJob {job.name} needs the runner that drives it")
        spec["activeDeadlineSeconds"] = _positive(timeout_seconds, "timeout_seconds") + DEADLINE_MARGIN_SECONDS
        owner = build_job_owner_reference(name=job.name, uid=job.uid)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": job_pod_name_prefix(pool.name),
            "namespace": namespace,
            "labels": build_job_pod_labels(pool=pool.name, job=job.name if job else None, runner=runner),
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def decide_claim_deadline(*, started: dt.datetime | None, timeout_seconds: int, now: dt.datetime) -> int:
    """A claimed pod's ``activeDeadlineSeconds``: the whole seconds it has run, the job's timeout and the margin.

    The kubelet counts the deadline from the pod's ``status.startTime`` (``started``). The seconds it
    has run round up, so the job never gets less than its timeout; a pod not started yet (or a start
    after ``now``, clock skew) counts none, as its deadline will run from a start no earlier than now.
    """
    elapsed = 0 if started is None else max(0, math.ceil((as_utc(now) - as_utc(started)).total_seconds()))
    return elapsed + _positive(timeout_seconds, "timeout_seconds") + DEADLINE_MARGIN_SECONDS


def _claim(*, job_name: str, job_uid: str, runner: str, deadline: int) -> dict[str, Any]:
    """What a claim writes (a JSON merge patch): the warm label removed (null), the job's and its
    runner's labels, the AgentJob as the only (controller) owner, and the deadline."""
    return {
        "metadata": {
            "labels": {LABEL_WARM: None, LABEL_JOB: label_value(job_name), LABEL_RUNNER: label_value(runner)},
            "ownerReferences": [build_job_owner_reference(name=job_name, uid=job_uid)],
        },
        "spec": {"activeDeadlineSeconds": deadline},
    }


def _merge(target: Any, patch: Any) -> Any:
    """``patch`` applied to ``target`` as RFC 7386 says (null removes, objects merge, the rest replaces)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


def build_claim_patch(
    *, pod: PodView, job_name: str, job_uid: str, runner: str, timeout_seconds: int, now: dt.datetime
) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386, ``application/merge-patch+json``) that claims warm ``pod`` for a job.

    It removes :data:`~helmhive.api.jobpod.LABEL_WARM` (null), labels the pod with the job and its
    runner, replaces the ownerReferences (a merge patch replaces a list whole) with the AgentJob as
    controller, and sets ``activeDeadlineSeconds`` (:func:`decide_claim_deadline`). It carries the
    pod's ``resourceVersion``, so the API server refuses it (409 Conflict) if the pod changed since it
    was read: two claims of one pod cannot both succeed. Raises ValueError for a pod that is not warm.
    """
    if not pod.warm:
        raise ValueError(f"pod {pod.name} is not a warm job pod (claimed, or not of a warm set)")
    if not runner:
        raise ValueError(f"the claim of pod {pod.name} needs the runner that drives it")
    deadline = decide_claim_deadline(started=pod.status.start_time, timeout_seconds=timeout_seconds, now=now)
    patch = _claim(job_name=job_name, job_uid=job_uid, runner=runner, deadline=deadline)
    if pod.metadata.resource_version:
        patch["metadata"]["resourceVersion"] = pod.metadata.resource_version
    return patch


def build_cold_job_pod(
    template: Mapping[str, Any], *, job: JobRef, runner: str, timeout_seconds: int
) -> dict[str, Any]:
    """The pod to create for ``job`` when no warm pod is free: ``template`` (a warm pod as
    :func:`build_job_pod` makes it, ``job=None``) claimed as :func:`build_claim_patch` claims one.

    The warm label goes, the job's and ``runner``'s labels come, the AgentJob is the only owner,
    and the kubelet ends the pod ``timeout_seconds`` + :data:`DEADLINE_MARGIN_SECONDS` after it
    starts. ``template`` is not changed. Raises ValueError for a template that is not a warm job pod.
    """
    if template.get("kind") != "Pod" or not isinstance(template.get("spec"), Mapping):
        raise ValueError("the job pod template is not a Pod")
    view = PodView.parse({"metadata": template.get("metadata") or {}})
    if not view.warm:
        raise ValueError("the job pod template is not a warm job pod (no warm label, or claimed)")
    if not runner:
        raise ValueError(f"the job pod of AgentJob {job.name} needs the runner that drives it")
    deadline = _positive(timeout_seconds, "timeout_seconds") + DEADLINE_MARGIN_SECONDS  # counted from its start
    pod: dict[str, Any] = _merge(template, _claim(job_name=job.name, job_uid=job.uid, runner=runner, deadline=deadline))
    return pod

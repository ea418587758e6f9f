"""Who a job pod belongs to: its pool and its job, their ownerReferences, and the labels that select them. Pure.

Owns the job pods' labels and selector, the runner pods' selector as a job pod's NetworkPolicy
names it, and the ownerReferences to a RunnerPool (warm pods, the pool's job-pod objects) and to an
AgentJob (claimed pods). This package imports nothing of :mod:`helmhive.policy.runners`, so that the
runner pods' own builders can import it (:func:`helmhive.policy.jobpods.network.build_runner_job_pod_rules`):
a pool is anything with a ``name``, ``namespace`` and ``uid`` (:class:`PoolIdentity`, which
:class:`helmhive.policy.runners.pool.PoolRef` is), and the tests pin :func:`build_runner_selector` and
:func:`build_pool_owner_reference` to the runner side's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from helmhive.api.jobpod import COMPONENT, LABEL_JOB, LABEL_POOL, LABEL_RUNNER, LABEL_WARM
from helmhive.api.kinds import API_VERSION

__all__ = [
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

JOB_POD_NAME = "helmhive-job"
"""``app.kubernetes.io/name`` of every job pod (and of the pool's job-pod objects)."""
RUNNER_POD_NAME = "helmhive-runner"
"""``app.kubernetes.io/name`` of the runner pods (:func:`helmhive.policy.runners.pool.build_pool_labels`)."""
MANAGED_BY = "helmhive-operator"
MAX_LABEL_VALUE = 63


class PoolIdentity(Protocol):
    """A RunnerPool object's identity (:class:`helmhive.policy.runners.pool.PoolRef` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def uid(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class JobRef:
    """The AgentJob a pod runs: its name and uid (for the ownerReference)."""

    name: str
    uid: str


def label_value(name: str) -> str:
    """``name`` as a label value: at most 63 characters, ending in a letter or digit.

    An AgentJob's name may be longer than a label holds; the pod's ownerReference carries it whole.
    """
    return re.sub(r"[^A-Za-z0-9]+$", "", name[:MAX_LABEL_VALUE])


def build_job_pod_selector(pool: str) -> dict[str, str]:
    """The labels that select every job pod of ``pool`` (warm and claimed), and no runner pod."""
    return {"app.kubernetes.io/name": JOB_POD_NAME, LABEL_POOL: pool}


def build_runner_selector(pool: str) -> dict[str, str]:
    """The labels that select the pool's runner pods (their StatefulSet's selector), and no job pod."""
    return {"app.kubernetes.io/name": RUNNER_POD_NAME, LABEL_POOL: pool}


def build_job_pod_labels(*, pool: str, job: str | None, runner: str | None) -> dict[str, str]:
    """A job pod's labels: warm without a job, else the job's and its runner's names."""
    labels = {**build_pool_object_labels(pool), "app.kubernetes.io/component": COMPONENT}
    if job is None:
        return {**labels, LABEL_WARM: "true"}
    return {**labels, LABEL_JOB: label_value(job), LABEL_RUNNER: label_value(runner or "")}


def build_pool_object_labels(pool: str) -> dict[str, str]:
    """The labels of the pool's job-pod objects (its job pods' NetworkPolicy, its link key)."""
    return {"app.kubernetes.io/name": JOB_POD_NAME, "app.kubernetes.io/managed-by": MANAGED_BY, LABEL_POOL: pool}


def build_pool_owner_reference(pool: PoolIdentity) -> dict[str, Any]:
    """The controller ownerReference to the RunnerPool: of a warm pod and of the pool's job-pod objects."""
    return {
        "apiVersion": API_VERSION,
        "kind": "RunnerPool",
        "name": pool.name,
        "uid": pool.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_job_owner_reference(*, name: str, uid: str) -> dict[str, Any]:
    """The controller ownerReference of a claimed pod: its AgentJob (deleting the job deletes the pod)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentJob",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }

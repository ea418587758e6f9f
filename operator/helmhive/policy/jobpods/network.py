"""Who a pool's job pods may talk to: their NetworkPolicy, and the rules the runner pods' own policy adds. Pure.

A job pod talks to the pool's runner pods and nothing else:

- in: from the pool's runner pods, to the shim's link (:data:`~helmhive.api.jobpod.LINK_PORT`);
- out: to the pool's runner pods, to their proxy (:data:`~helmhive.api.jobpod.RUNNER_PROXY_PORT`).

No DNS (the runner dials the pod's IP, and the pod the runner's IP it was given), no other pod, no
address outside the cluster. The runner pods' side (:func:`build_runner_job_pod_rules`) is the mirror
image, which :func:`helmhive.policy.runners.pool.build_network_policy` adds for a pool in mode JobPod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from helmhive.api.jobpod import LINK_PORT, RUNNER_PROXY_PORT
from helmhive.policy.jobpods.identity import (
    PoolIdentity,
    build_job_pod_selector,
    build_pool_object_labels,
    build_pool_owner_reference,
    build_runner_selector,
)

__all__ = [
    "RunnerJobPodRules",
    "build_job_pod_network_policy",
    "build_runner_job_pod_rules",
    "job_pod_policy_name",
]


def job_pod_policy_name(pool: str) -> str:
    """The name of the NetworkPolicy of the pool's job pods."""
    return f"helmhive-job-{pool}"


def _port(port: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port}]


def build_job_pod_network_policy(*, pool: PoolIdentity, namespace: str) -> dict[str, Any]:
    """The pool's job pods: ingress only from its runner pods to the link, egress only to their proxy."""
    if namespace != pool.namespace:
        raise ValueError(f"the job pods of {pool.namespace}/{pool.name} are in {pool.namespace}, not {namespace}")
    runners = [{"podSelector": {"matchLabels": build_runner_selector(pool.name)}}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": job_pod_policy_name(pool.name),
            "namespace": namespace,
            "labels": build_pool_object_labels(pool.name),
            "ownerReferences": [build_pool_owner_reference(pool)],
        },
        "spec": {
            "podSelector": {"matchLabels": build_job_pod_selector(pool.name)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": runners, "ports": _port(LINK_PORT)}],
            "egress": [{"to": runners, "ports": _port(RUNNER_PROXY_PORT)}],
        },
    }


@dataclass(frozen=True, kw_only=True)
class RunnerJobPodRules:
    """What the runner pods' NetworkPolicy adds for their job pods: its ``ingress`` and ``egress`` entries."""

    ingress: tuple[dict[str, Any], ...]
    egress: tuple[dict[str, Any], ...]


def build_runner_job_pod_rules(*, pool: str) -> RunnerJobPodRules:
    """The runner pods accept their job pods on the proxy's port and may reach them on the link's port."""
    job_pods = [{"podSelector": {"matchLabels": build_job_pod_selector(pool)}}]
    return RunnerJobPodRules(
        ingress=({"from": job_pods, "ports": _port(RUNNER_PROXY_PORT)},),
        egress=({"to": job_pods, "ports": _port(LINK_PORT)},),
    )

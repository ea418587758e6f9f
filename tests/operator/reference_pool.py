"""A RunnerPool of the reference agent whose one pod runs locally, for the operator's end-to-end tests.

The pod is Pending on the test cluster (no kubelet); :func:`running_pod` starts it as
``helmhive dev run-pod`` does (the pod's own bound token, env and volumes) and hands it over
once its Runner is Schedulable, so a test starts from a runner the operator routes to. The
fixture :func:`start_reference_pod` (registered in this directory's conftest) does the same with the
running operator, the test's namespace and its ``tmp_path`` as the pod's state directory. The
tests give the pool's heartbeat, token and agent variables; the rest is the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import ClusterHandle
from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod, run_pod, stop_pod

__all__ = [
    "API",
    "TOKEN_SECRET",
    "PodStarter",
    "pool_docs",
    "profile_doc",
    "running_pod",
    "start_reference_pod",
    "workspace_doc",
]

GROUP, VERSION = "helmhive.dev", "v1alpha1"
API = f"{GROUP}/{VERSION}"
TOKEN_SECRET = "reference-token"


def pool_docs(
    *,
    token: str,
    name: str = "reference",
    provider: str = "reference",
    lease_seconds: int = 5,
    renew_seconds: int = 1,
    agent_env: dict[str, str] | None = None,
    capabilities: tuple[str, ...] = ("structured-output", "diff-review", "workspace-write"),
) -> list[dict[str, Any]]:
    """The pool's token Secret (``token`` is its key) and a one-replica, one-slot RunnerPool ``name``."""
    acp: dict[str, Any] = {"command": "helmhive-reference-agent"}
    if agent_env:
        acp["env"] = [{"name": key, "value": value} for key, value in agent_env.items()]
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": TOKEN_SECRET}, "stringData": {"token": token}},
        {
            "apiVersion": API,
            "kind": "RunnerPool",
            "metadata": {"name": name},
            "spec": {
                "provider": provider,
                "adapter": {"type": "acp", "acp": acp},
                "image": "ghcr.io/helmhive/helmhive:test",
                "credential": {
                    "secretRef": {"name": TOKEN_SECRET, "key": "token"},
                    "envName": "HELMHIVE_REFERENCE_AGENT_TOKEN",
                },
                "capabilities": list(capabilities),
                "concurrency": 1,
                "replicas": 1,
                "heartbeat": {
                    "leaseDurationSeconds": lease_seconds,
                    "renewIntervalSeconds": renew_seconds,
                    "reportRefreshSeconds": 60,
                },
            },
        },
    ]


def workspace_doc(name: str, profiles: dict[str, str]) -> dict[str, Any]:
    """A Workspace ``name`` binding each job kind to a profile."""
    return {
        "apiVersion": API,
        "kind": "Workspace",
        "metadata": {"name": name},
        "spec": {
            "repository": {"url": f"https://git.example.com/{name}.git"},
            "profiles": [{"jobKind": kind, "profile": profile} for kind, profile in profiles.items()],
        },
    }


def profile_doc(
    name: str,
    envelope: str,
    *,
    purpose: str,
    instructions: str = "Answer briefly.",
    provider: str = "reference",
    **spec: Any,
) -> dict[str, Any]:
    """A Profile ``name`` on ``envelope`` mapped to ``provider``; ``spec`` adds fields (session, memory)."""
    return {
        "apiVersion": API,
        "kind": "Profile",
        "metadata": {"name": name},
        "spec": {
            "envelope": envelope,
            **spec,
            "purpose": purpose,
            "instructions": instructions,
            "providerMappings": [{"provider": provider}],
        },
    }


def _schedulable(kube: Kube, namespace: str, name: str) -> bool:
    runner = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "runners", name)
    conds = (runner.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Schedulable" and c["status"] == "True" for c in conds)


@contextmanager
def running_pod(
    docs: list[dict[str, Any]],
    *,
    pod: str,
    kube: Kube,
    kubectl: Kubectl,
    namespace: str,
    admin_kubeconfig: Path,
    state_dir: Path,
) -> Iterator[LocalPod]:
    """Apply ``docs``, run the pool's pod ``pod`` locally, and yield it once its Runner is Schedulable."""
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))
    wait_for(lambda: kube.core.read_namespaced_pod(pod, namespace), timeout=60, describe=f"pod {pod}")
    local = run_pod(
        name=pod, namespace=namespace, admin_kubeconfig=admin_kubeconfig, state_dir=state_dir, tie_to_parent=True
    )
    try:
        wait_for(
            lambda: _schedulable(kube, namespace, pod),
            timeout=90,
            describe=f"runner {pod} Schedulable (log {local.root / 'container.log'})",
        )
        yield local
    finally:
        stop_pod(name=pod, namespace=namespace, state_dir=state_dir)


PodStarter = Callable[[list[dict[str, Any]], str], AbstractContextManager[LocalPod]]
"""Apply the documents, then run the named pod of their pool (see :func:`running_pod`)."""


@pytest.fixture
def start_reference_pod(
    operator: OperatorProcess, cluster: ClusterHandle, kube: Kube, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> PodStarter:
    """:func:`running_pod` in the test's namespace, with the operator running."""

    def start(docs: list[dict[str, Any]], pod: str) -> AbstractContextManager[LocalPod]:
        return running_pod(
            docs,
            pod=pod,
            kube=kube,
            kubectl=kubectl,
            namespace=namespace,
            admin_kubeconfig=cluster.kubeconfig,
            state_dir=tmp_path,
        )

    return start

"""A governed-change rig on the real API server: the operator, two runner pods, a real git server.

Two RunnerPools run the reference agent under two provider names, ``alpha`` and ``beta``, so a
review can land on a provider other than the implementation's. Their pods are started locally
the way ``helmhive dev run-pod`` starts them (the pod's own bound token, env and volumes). A git
repository made by the test is served by ``git daemon`` (and by authenticated smart HTTP where a
test asks), on loopback.

Profiles: planning and implementation map only ``alpha``; review maps ``alpha`` then ``beta``, so
review diversity picks ``beta``. The Workspace ``solo`` binds a review profile that maps only
``alpha``, for the fallback to the same provider in a fresh context.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import ClusterHandle
from harness.gitserver import GitDaemon, GitHttpServer, GitRepo
from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod, run_pod, stop_pod

API = "helmhive.dev/v1alpha1"
GROUP, VERSION = "helmhive.dev", "v1alpha1"
PROVIDER_CANARY = "canary-provider-key-7f3a9c"
GIT_USER = "ci-bot"
GIT_CANARY = "canary-git-password-51e0d2"
SESSION_PREFIX = "canary-sess-"
SOURCE = {
    "app.py": "def refund(key):\n    return key\n",
    "README.md": "# payments\n",
    "logo.bin": bytes(range(256)) * 4,
}


def pool(name: str, provider: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "RunnerPool",
        "metadata": {"name": name},
        "spec": {
            "provider": provider,
            "adapter": {
                "type": "acp",
                "acp": {
                    "command": "helmhive-reference-agent",
                    "env": [{"name": "HELMHIVE_REFERENCE_AGENT_SESSION_PREFIX", "value": SESSION_PREFIX}],
                },
            },
            "image": "ghcr.io/helmhive/helmhive:test",
            "credential": {
                "secretRef": {"name": f"{name}-token", "key": "token"},
                "envName": "HELMHIVE_REFERENCE_AGENT_TOKEN",
            },
            "placementLabels": {"domain": "code"},
            "capabilities": ["structured-output", "diff-review", "workspace-write"],
            "source": {"credentialsSecret": {"name": "git-credentials"}},
            "concurrency": 1,
            "replicas": 1,
            "heartbeat": {"leaseDurationSeconds": 10, "renewIntervalSeconds": 2, "reportRefreshSeconds": 60},
            **extra,
        },
    }


def profile(name: str, envelope: str, providers: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Profile",
        "metadata": {"name": name},
        "spec": {
            "envelope": envelope,
            "purpose": f"Governed {envelope} for the tests.",
            "instructions": "Follow the request exactly.",
            "providerMappings": [{"provider": p} for p in providers],
            **extra,
        },
    }


def workspace(name: str, review_profile: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Workspace",
        "metadata": {"name": name},
        "spec": {
            "repository": {"url": "git://127.0.0.1/payments.git"},
            "profiles": [
                {"jobKind": "change-planning", "profile": "plan"},
                {"jobKind": "change-implementation", "profile": "implement"},
                {"jobKind": "change-review", "profile": review_profile},
            ],
        },
    }


def base_docs() -> list[dict[str, Any]]:
    secrets = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{n}-token"}, "stringData": {"token": tok}}
        for n, tok in (("alpha", PROVIDER_CANARY), ("beta", PROVIDER_CANARY + "-b"))
    ]
    git = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "git-credentials"},
        "stringData": {"username": GIT_USER, "password": GIT_CANARY},
    }
    return [
        *secrets,
        git,
        pool("alpha", "alpha"),
        pool("beta", "beta"),
        profile("plan", "change-planning", ["alpha"]),
        profile("implement", "change-implementation", ["alpha"]),
        profile("review", "change-review", ["alpha", "beta"], filesystem="read"),
        profile("review-alpha", "change-review", ["alpha"], filesystem="read"),
        workspace("payments", "review"),
        workspace("solo", "review-alpha"),
    ]


def change(name: str, repository: str, commit: str, description: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Change",
        "metadata": {"name": name},
        "spec": {
            "workspace": spec.pop("workspace", "payments"),
            "request": {"title": f"Change {name}", "description": description},
            "criteria": ["Refunds are idempotent.", "Nothing else changes."],
            "source": {"repository": repository, "commit": commit},
            **spec,
        },
    }


@dataclass
class ChangeRig:
    namespace: str
    kube: Kube
    kubectl: Kubectl
    repo: GitRepo
    daemon: GitDaemon
    http: GitHttpServer
    pods: dict[str, LocalPod] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The repository over ``git daemon`` (anonymous)."""
        return self.daemon.url_for(self.repo)

    @property
    def private_url(self) -> str:
        """The repository over smart HTTP that needs the pools' git credentials."""
        return self.http.url_for(self.repo)

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump_all(list(docs)))

    def get(self, plural: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, plural, name
        )
        return obj

    def condition(self, name: str, ctype: str) -> dict[str, Any] | None:
        conditions = (self.get("changes", name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == ctype), None)

    def wait_ready(self, name: str, *, final: tuple[str, ...], timeout: float = 240) -> dict[str, Any]:
        """Wait until the Change's Ready condition has one of the ``final`` reasons; return the Change."""

        def done() -> dict[str, Any] | None:
            ready = self.condition(name, "Ready")
            return self.get("changes", name) if ready and ready["reason"] in final else None

        return wait_for(
            done, timeout=timeout, describe=f"change {name} Ready reason in {final}: {self._describe(name)}"
        )

    def _describe(self, name: str) -> str:
        with contextlib.suppress(Exception):
            return str(
                [(c["type"], c["status"], c["reason"]) for c in self.get("changes", name)["status"]["conditions"]]
            )
        return "?"


def start_runner(rig: ChangeRig, cluster: ClusterHandle, pod_name: str, state_dir: Path) -> LocalPod:
    wait_for(lambda: rig.kube.core.read_namespaced_pod(pod_name, rig.namespace), timeout=60, describe=pod_name)
    pod = run_pod(
        name=pod_name,
        namespace=rig.namespace,
        admin_kubeconfig=cluster.kubeconfig,
        state_dir=state_dir,
        tie_to_parent=True,
    )

    def schedulable() -> bool:
        runner = rig.get("runners", pod_name)
        conds = (runner.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Schedulable" and c["status"] == "True" for c in conds)

    wait_for(schedulable, timeout=120, describe=f"runner {pod_name} Schedulable (log {pod.root / 'container.log'})")
    rig.pods[pod_name] = pod
    return pod


@contextlib.contextmanager
def change_rig(
    *, cluster: ClusterHandle, kube: Kube, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> Iterator[ChangeRig]:
    repo = GitRepo.create(root=tmp_path / "git", name="payments", files=SOURCE)
    with (
        GitDaemon(root=tmp_path / "git") as daemon,
        GitHttpServer(root=tmp_path / "git", username=GIT_USER, password=GIT_CANARY) as http,
    ):
        rig = ChangeRig(namespace=namespace, kube=kube, kubectl=kubectl, repo=repo, daemon=daemon, http=http)
        rig.apply(*base_docs())
        try:
            for name in ("alpha-0", "beta-0"):
                start_runner(rig, cluster, name, tmp_path / "pods")
            yield rig
        finally:
            for name in list(rig.pods):
                stop_pod(name=name, namespace=namespace, state_dir=tmp_path / "pods")


@pytest.fixture
def rig(
    operator: OperatorProcess, cluster: ClusterHandle, kube: Kube, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> Iterator[ChangeRig]:
    """:func:`change_rig` with the running operator, in the test's namespace (registered in the conftest)."""
    with change_rig(cluster=cluster, kube=kube, kubectl=kubectl, namespace=namespace, tmp_path=tmp_path) as made:
        yield made

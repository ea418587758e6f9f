"""Helpers for the runner-pool cluster tests: a pool with a canary credential, its pods, its runners."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from simulated_runner import GROUP, VERSION, SimulatedRunner

from harness.kube import IdentityFactory, Kube
from harness.wait import wait_for

__all__ = [
    "CANARY",
    "Pool",
    "condition",
    "make_pool",
]

CANARY = f"sk-canary-{uuid.uuid4().hex}"
"""A fake API key planted in every test pool's Secret; it must never appear anywhere else."""


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return dict(cond)
    return {}


@dataclass
class Pool:
    """A RunnerPool created by a test, and the means to act as its runner pods."""

    kube: Kube
    identities: IdentityFactory
    namespace: str
    name: str
    secret: str

    @property
    def service_account(self) -> str:
        return f"helmhive-runner-{self.name}"

    def get(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "runnerpools", self.name
        )
        return obj

    def patch_spec(self, spec: dict[str, Any]) -> None:
        self.kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "runnerpools", self.name, {"spec": spec}
        )

    def runner(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "runners", name
        )
        return obj

    def patch_runner_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.kube.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, "runners", name, {"spec": spec})

    def wait_runner(self, name: str, describe: str, timeout: float = 30, **expected: str) -> dict[str, Any]:
        """Wait until runner ``name`` has ``reportedStatus`` and/or condition reasons as given.

        ``expected`` keys: ``status`` (reportedStatus), ``schedulable`` (the Schedulable
        condition's reason), ``online`` (the Online condition's reason), ``control``.
        """

        def matches() -> dict[str, Any] | None:
            obj = self.runner(name)
            status = obj.get("status") or {}
            seen = {
                "status": status.get("reportedStatus"),
                "schedulable": condition(obj, "Schedulable").get("reason"),
                "online": condition(obj, "Online").get("reason"),
                "control": status.get("effectiveControlState"),
            }
            assert all(seen[k] == v for k, v in expected.items()), seen
            return obj

        return wait_for(matches, timeout=timeout, describe=f"runner {name}: {describe}")

    def pod_names(self) -> list[str]:
        pods = self.kube.core.list_namespaced_pod(self.namespace, label_selector=f"helmhive.dev/pool={self.name}")
        return sorted(p.metadata.name for p in pods.items)

    def wait_pods(self, count: int, timeout: float = 30) -> list[str]:
        expected = [f"{self.name}-{i}" for i in range(count)]

        def pods() -> list[str]:
            names = self.pod_names()
            assert names == expected, names
            return names

        return wait_for(pods, timeout=timeout, describe=f"{count} pods of StatefulSet {self.name}")

    def acting_as(self, pod: str, *, lease_seconds: int = 5) -> SimulatedRunner:
        """A runner that writes with a token of the pool's ServiceAccount bound to ``pod``."""
        wait_for(
            lambda: self.kube.core.read_namespaced_service_account(self.service_account, self.namespace),
            timeout=30,
            describe=f"ServiceAccount {self.service_account}",
        )
        identity = self.identities(self.namespace, self.service_account, bound_pod=pod, create=False)
        return SimulatedRunner(
            identity=identity, namespace=self.namespace, pool=self.name, name=pod, lease_seconds=lease_seconds
        )

    def set_secret(self, value: str) -> None:
        data = {"api-key": base64.b64encode(value.encode()).decode()}
        self.kube.core.patch_namespaced_secret(self.secret, self.namespace, {"data": data})


def make_pool(
    kube: Kube,
    identities: IdentityFactory,
    namespace: str,
    name: str = "claude",
    *,
    replicas: int = 1,
    restricted: bool = True,
    **spec: Any,
) -> Pool:
    """A Secret holding :data:`CANARY` and a RunnerPool using it, in a namespace enforcing PSS restricted."""
    if restricted:
        labels = {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
        kube.core.patch_namespace(namespace, {"metadata": {"labels": labels}})
    secret = f"{name}-credential"
    kube.core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name=secret), string_data={"api-key": CANARY, "note": CANARY}),
    )
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RunnerPool",
        "metadata": {"name": name},
        "spec": {
            "provider": "anthropic",
            "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
            "image": "ghcr.io/helmhive/runner:test",
            "credential": {"secretRef": {"name": secret, "key": "api-key"}, "envName": "ANTHROPIC_API_KEY"},
            "placementLabels": {"domain": "code"},
            "capabilities": ["structured-output"],
            "replicas": replicas,
            "heartbeat": {"leaseDurationSeconds": 5, "renewIntervalSeconds": 1, "reportRefreshSeconds": 30},
            **spec,
        },
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "runnerpools", body)
    return Pool(kube=kube, identities=identities, namespace=namespace, name=name, secret=secret)

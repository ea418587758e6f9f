"""Where the tests' Kubernetes API comes from, and installing the project's CRDs into it.

Three sources, chosen by command-line options (see :mod:`harness.plugin`):

``local`` (default)
    The real control plane of :mod:`helmhive.devcluster`: etcd, kube-apiserver and
    kube-controller-manager built from the Go module proxy (cached in
    ``~/.cache/helmhive``) and started on loopback in a temporary state directory for
    this session. The binaries are built, if needed, right after collection, outside
    any test's timeout. There is no scheduler and no kubelet: Pods are stored but never
    run.
``kubeconfig``
    ``--kubeconfig PATH`` or ``$HELMHIVE_TEST_KUBECONFIG``: an existing cluster, used
    as-is with the kubeconfig's current context (it must be admin-like).
``kind``
    ``--kind``: a kind cluster made with pytest-kind (needs Docker and pytest-kind).

Whatever the source, a failure to get a cluster FAILS the tests that need it, with the
reason and the relevant log tail; it never skips them.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from harness.wait import wait_for
from helmhive.devcluster.build import DEFAULT_KUBE_VERSION, cache_root
from helmhive.devcluster.cluster import ClusterInfo

__all__ = ["ClusterHandle", "find_kubectl", "install_crds", "load_crd_documents"]


@dataclass(frozen=True, kw_only=True)
class ClusterHandle:
    """The session's cluster: how to reach it as admin, and what it is."""

    source: str  # "local", "kubeconfig" or "kind"
    kubeconfig: Path
    kubectl: Path | None
    info: ClusterInfo | None = None  # only for the local control plane
    expected_version: str | None = None  # gitVersion the server must report, when known

    def new_api_client(self) -> client.ApiClient:
        """A new admin ApiClient (the caller closes it; fixtures share one instead)."""
        return config.new_client_from_config(config_file=str(self.kubeconfig))


def find_kubectl() -> Path | None:
    """kubectl for a cluster we did not start: ``$HELMHIVE_KUBECTL``, the cached build, PATH."""
    explicit = os.environ.get("HELMHIVE_KUBECTL")
    if explicit:
        return Path(explicit)
    cached = cache_root() / "k8s" / DEFAULT_KUBE_VERSION / "kubectl"
    if (cached.parent / ".complete.json").is_file() and cached.is_file():
        return cached
    found = shutil.which("kubectl")
    return Path(found) if found else None


def load_crd_documents(crd_dir: Path) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition in ``crd_dir/*.yaml`` (sorted by file name)."""
    docs: list[dict[str, Any]] = []
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc:
                continue
            if doc.get("kind") != "CustomResourceDefinition":
                raise ValueError(f"{path}: expected only CustomResourceDefinitions, found {doc.get('kind')}")
            docs.append(doc)
    return docs


def _established(api: client.ApiextensionsV1Api, name: str) -> bool:
    crd = api.read_custom_resource_definition(name)
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def install_crds(api_client: client.ApiClient, crd_dir: Path, *, timeout: float = 60.0) -> list[str]:
    """Create or replace each CRD from ``crd_dir`` and wait until all are Established."""
    api = client.ApiextensionsV1Api(api_client)
    names: list[str] = []
    for doc in load_crd_documents(crd_dir):
        name = doc["metadata"]["name"]
        try:
            api.create_custom_resource_definition(doc)
        except ApiException as err:
            if err.status != 409:
                raise
            current = api.read_custom_resource_definition(name)
            version = current.metadata.resource_version
            body = {**doc, "metadata": {**doc["metadata"], "resourceVersion": version}}
            api.replace_custom_resource_definition(name, body)
        names.append(name)
    for name in names:
        wait_for(
            functools.partial(_established, api, name),
            timeout=timeout,
            describe=f"CRD {name} to be Established",
        )
    return names

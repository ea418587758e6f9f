"""A kind cluster for tests, made by pytest-kind with our own kind, kubectl and node image.

pytest-kind downloads kind and kubectl from the internet unless told where they are; here it is
given the binaries and the node image that :mod:`helmhive.devcluster.kind` built offline (cached
by version and inputs), creates the cluster from our two-node config, and loads images with
``kind load``: kube-router's through pytest-kind, Helmhive's two through
:func:`helmhive.devcluster.kind.cluster.load_images`, the function ``helmhive dev kind load`` and
``helmhive demo --kind`` use, so that the tier covers it. kube-router is installed after creation
for pod networking and NetworkPolicy.
Progress goes to the real stderr, so a cold build shows what it is doing under pytest's capture.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pytest_kind import KindCluster

from helmhive.devcluster.kind.cluster import build_kind_config, install_network, load_images, prepare
from helmhive.devcluster.kind.helmhive_images import HelmhiveImages, ensure_helmhive_images

__all__ = ["KindEnv", "kind_cluster"]


@dataclass(frozen=True, kw_only=True)
class KindEnv:
    """A ready kind cluster: its kubeconfig, tools and the images loaded into it."""

    name: str
    kubeconfig: Path
    kubectl: Path
    kind: Path
    images: HelmhiveImages
    debian_image: str
    nodes: tuple[str, ...]
    cluster: KindCluster


@contextmanager
def kind_cluster(name: str, *, workers: int = 1) -> Iterator[KindEnv]:
    """Build or reuse everything, create the cluster with pytest-kind, yield it, delete it after.

    ``HELMHIVE_KIND_KEEP=1`` keeps the cluster for the next run (pytest-kind then reuses it).
    """
    log = sys.__stderr__ or sys.stderr
    _engine, node_images, router, kind, kubectl = prepare(log)
    helmhive = ensure_helmhive_images(node_images.debian, log)
    workdir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    cluster = KindCluster(
        name=name, kubeconfig=workdir / "kubeconfig", image=node_images.node, kind_path=kind, kubectl_path=kubectl
    )
    config = workdir / "kind.yaml"
    config.write_text(build_kind_config(workers=workers, etcd_image_tag=node_images.etcd_image_tag), encoding="utf-8")
    existing = subprocess.run([str(kind), "get", "clusters"], capture_output=True, text=True, check=False).stdout
    if name in existing.split():
        # pytest-kind reuses a cluster of that name but writes no kubeconfig for it.
        subprocess.run(
            [str(kind), "export", "kubeconfig", "--name", name, "--kubeconfig", str(workdir / "kubeconfig")], check=True
        )
    log.write(f"creating (or reusing) kind cluster {name} with pytest-kind ({workers + 1} nodes) …\n")
    cluster.create(config_file=config)
    try:
        log.write(f"kind load docker-image {router} …\n")
        cluster.load_docker_image(router)
        load_images(name, [helmhive.operator, helmhive.runner], kind=kind, log=log)
        nodes = install_network(kubectl, workdir / "kubeconfig", router, expect_nodes=workers + 1, log=log)
        yield KindEnv(
            name=name,
            kubeconfig=workdir / "kubeconfig",
            kubectl=kubectl,
            kind=kind,
            images=helmhive,
            debian_image=node_images.debian,
            nodes=nodes,
            cluster=cluster,
        )
    finally:
        if os.environ.get("HELMHIVE_KIND_KEEP") != "1":
            cluster.delete()

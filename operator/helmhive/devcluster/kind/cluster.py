"""Create, reuse, load and delete Helmhive's kind cluster: two nodes, kube-router, images built here.

:func:`up` builds or reuses every input (engine, binaries, images; see :mod:`.node`) and creates
the cluster, or reuses it when one of that name already answers. Its kubeconfig is written to
``<state>/<name>.kubeconfig`` (never into the user's ``~/.kube/config``), and :func:`build_env`
gives the exports that point kubectl at it, as ``helmhive dev cluster env`` does for the local
control plane.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml

from helmhive.devcluster.build import DEFAULT_ETCD_VERSION, DEFAULT_KUBE_VERSION, cache_root, ensure_binaries
from helmhive.devcluster.gotools import GO_TOOLS, ensure_go_tool
from helmhive.devcluster.kind.engine import Engine, ensure_engine, ensure_host_packages
from helmhive.devcluster.kind.helmhive_images import HelmhiveImages, ensure_helmhive_images
from helmhive.devcluster.kind.images import (
    build_component_dockerfile,
    build_in_context,
    digest_inputs,
    ensure_debian_image,
    image_id,
)
from helmhive.devcluster.kind.network import KUBE_ROUTER_DOCKERFILE_PACKAGES, build_kube_router_manifests
from helmhive.devcluster.kind.node import NodeImages, ensure_node_image
from helmhive.devcluster.progress import step
from helmhive.devcluster.rootfs_bases import RootfsError, ensure_debian_base

__all__ = [
    "DEFAULT_NAME",
    "KindCluster",
    "KindError",
    "build_all",
    "build_env",
    "build_kind_config",
    "delete_cluster",
    "ensure_cluster",
    "existing",
    "kind_state_dir",
    "load_helmhive",
    "load_images",
    "prepare",
]

DEFAULT_NAME = "helmhive"


class KindError(RuntimeError):
    """The kind cluster could not be created or used; the message says which step and why."""


@dataclass(frozen=True, kw_only=True)
class KindCluster:
    """A running kind cluster and the tools that reach it."""

    name: str
    kubeconfig: Path
    kind: Path
    kubectl: Path
    node_image: str
    debian_image: str
    engine: Engine
    nodes: tuple[str, ...]
    reused: bool


def kind_state_dir() -> Path:
    """``$HELMHIVE_KIND_STATE_DIR``, else ``$XDG_STATE_HOME/helmhive/kind`` (kubeconfigs, dockerd's log)."""
    explicit = os.environ.get("HELMHIVE_KIND_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "helmhive" / "kind"


def build_kind_config(*, workers: int, etcd_image_tag: str) -> str:
    """kind's cluster config: a control plane and ``workers`` workers, no default CNI, cgroup v1 allowed."""
    config = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "networking": {"disableDefaultCNI": True},
        "nodes": [{"role": "control-plane"}] + [{"role": "worker"} for _ in range(workers)],
        "kubeadmConfigPatches": [
            # our etcd is the release we build and cache, not the one kubeadm names by default
            yaml.safe_dump({"kind": "ClusterConfiguration", "etcd": {"local": {"imageTag": etcd_image_tag}}}),
            # a 1.35+ kubelet refuses cgroup v1 hosts unless told otherwise
            yaml.safe_dump({"kind": "KubeletConfiguration", "failCgroupV1": False}),
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def build_env(cluster: KindCluster) -> list[str]:
    """Shell exports that point kubectl (and helm) at the cluster."""
    return [
        f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}",
        f'export PATH={shlex.quote(str(cluster.kubectl.parent))}:{shlex.quote(str(cluster.kind.parent))}:"$PATH"',
    ]


def _run(cmd: list[str], *, what: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise KindError(
            f"{what} failed ({proc.returncode}): {' '.join(cmd[:5])} …\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return proc.stdout


def _clusters(kind: Path) -> list[str]:
    out = subprocess.run([str(kind), "get", "clusters"], capture_output=True, text=True, check=False)
    return out.stdout.split() if out.returncode == 0 else []


def _nodes_ready(kubectl: Path, kubeconfig: Path) -> tuple[str, ...] | None:
    proc = subprocess.run(
        [str(kubectl), "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "json", "--request-timeout=10s"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    items = json.loads(proc.stdout).get("items", [])
    ready = [
        node["metadata"]["name"]
        for node in items
        if any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))
    ]
    return tuple(sorted(ready)) if ready and len(ready) == len(items) else None


def _ensure_kube_router_image(debian: str, cache: Path, log: TextIO) -> str:
    binary = ensure_go_tool(GO_TOOLS["kube-router"], log=log, root=cache)
    tag = f"helmhive.local/kube-router:{GO_TOOLS['kube-router'].version}"
    dockerfile = build_component_dockerfile(
        base=debian,
        binary="kube-router",
        entrypoint="/usr/local/bin/kube-router",
        packages=KUBE_ROUTER_DOCKERFILE_PACKAGES,
    )
    inputs = digest_inputs(tag, dockerfile, image_id(debian), str(binary.stat().st_mtime_ns))
    build_in_context(tag=tag, dockerfile_text=dockerfile, files={"kube-router": binary}, inputs=inputs, log=log)
    return tag


def prepare(
    log: TextIO, *, kube_version: str = DEFAULT_KUBE_VERSION, etcd_version: str = DEFAULT_ETCD_VERSION
) -> tuple[Engine, NodeImages, str, Path, Path]:
    """Everything a cluster is made from: engine, node image, kube-router image, kind, kubectl."""
    cache = cache_root()
    engine = ensure_engine(kind_state_dir(), log)
    with step(log, f"control-plane binaries etcd {etcd_version}, kubernetes {kube_version} (built once, then cached)"):
        binaries = ensure_binaries(kube_version=kube_version, etcd_version=etcd_version, log=log)
    ensure_host_packages({"debootstrap": "debootstrap", "gcc": "gcc", "git": "git"}, log)
    try:
        tree, release = ensure_debian_base("bookworm", log)
    except RootfsError as err:
        raise KindError(f"the Debian base image: {err}") from err
    debian = ensure_debian_image(tree, release, log)
    images = ensure_node_image(binaries, cache=cache, debian=debian, log=log)
    router = _ensure_kube_router_image(debian, cache, log)
    kind = ensure_go_tool(GO_TOOLS["kind"], log=log, root=cache)
    return engine, images, router, kind, binaries.kubectl


def ensure_cluster(name: str = DEFAULT_NAME, *, log: TextIO, workers: int = 1, timeout: float = 600.0) -> KindCluster:
    """Create the cluster (or reuse a healthy one of that name) and wait until every node is Ready."""
    engine, images, router, kind, kubectl = prepare(log)
    state = kind_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    kubeconfig = state / f"{name}.kubeconfig"

    def made(nodes: tuple[str, ...], *, reused: bool) -> KindCluster:
        return KindCluster(
            name=name, kubeconfig=kubeconfig, kind=kind, kubectl=kubectl, node_image=images.node,
            debian_image=images.debian, engine=engine, nodes=nodes, reused=reused,
        )  # fmt: skip

    if name in _clusters(kind):
        _run(
            [str(kind), "export", "kubeconfig", "--name", name, "--kubeconfig", str(kubeconfig)],
            what="kind export kubeconfig",
        )
        if (ready := _nodes_ready(kubectl, kubeconfig)) is not None and len(ready) == workers + 1:
            log.write(f"kind cluster {name!r} is running: reused ({len(ready)} nodes Ready)\n")
            return made(ready, reused=True)
        log.write(f"kind cluster {name!r} exists but is not healthy: deleting it\n")
        _run([str(kind), "delete", "cluster", "--name", name], what="kind delete cluster")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="kind-config-") as config:
        config.write(build_kind_config(workers=workers, etcd_image_tag=images.etcd_image_tag))
        config.flush()
        with step(log, f"kind create cluster {name} ({workers + 1} nodes, {images.node})"):
            _run(
                [
                    str(kind),
                    "create",
                    "cluster",
                    "--name",
                    name,
                    "--image",
                    images.node,
                    "--config",
                    config.name,
                    "--kubeconfig",
                    str(kubeconfig),
                ],
                what="kind create cluster",
            )
    load_images(name, [router], kind=kind, log=log)
    nodes = install_network(kubectl, kubeconfig, router, expect_nodes=workers + 1, log=log, timeout=timeout)
    return made(nodes, reused=False)


def install_network(
    kubectl: Path, kubeconfig: Path, router_image: str, *, expect_nodes: int, log: TextIO, timeout: float = 600.0
) -> tuple[str, ...]:
    """Apply kube-router (its image already loaded) and wait for Ready nodes, kube-router and CoreDNS."""
    manifests = "---\n".join(yaml.safe_dump(m, sort_keys=False) for m in build_kube_router_manifests(router_image))
    kube = [str(kubectl), "--kubeconfig", str(kubeconfig)]
    _run([*kube, "apply", "-f", "-"], what="applying kube-router", stdin=manifests)
    with step(log, "waiting for every node to be Ready (kube-router brings up pod networking)"):
        deadline = time.monotonic() + timeout
        while (nodes := _nodes_ready(kubectl, kubeconfig)) is None or len(nodes) != expect_nodes:
            if time.monotonic() > deadline:
                detail = subprocess.run(
                    [*kube, "get", "nodes,pods", "-A", "-o", "wide"], capture_output=True, text=True, check=False
                ).stdout
                raise KindError(f"nodes not Ready within {timeout:.0f} s:\n{detail[-3000:]}")
            time.sleep(2)
    for workload in ("daemonset/kube-router", "deployment/coredns"):
        with step(log, f"waiting for {workload}"):
            _run(
                [*kube, "-n", "kube-system", "rollout", "status", workload, f"--timeout={int(timeout)}s"],
                what=f"waiting for {workload}",
            )
    return nodes


def load_images(name: str, images: list[str], *, kind: Path, log: TextIO) -> None:
    """``kind load docker-image`` each image into every node of the cluster."""
    for image in images:
        with step(log, f"kind load docker-image {image}"):
            _run([str(kind), "load", "docker-image", "--name", name, image], what=f"loading {image}")


def delete_cluster(name: str = DEFAULT_NAME, *, log: TextIO) -> bool:
    """Delete the cluster; return whether there was one."""
    kind = ensure_go_tool(GO_TOOLS["kind"], log=log, root=cache_root())
    if name not in _clusters(kind):
        return False
    _run([str(kind), "delete", "cluster", "--name", name], what="kind delete cluster")
    (kind_state_dir() / f"{name}.kubeconfig").unlink(missing_ok=True)
    return True


def build_all(*, log: TextIO) -> HelmhiveImages:
    """Everything :func:`up` and the e2e tier need, built or reused; no cluster is created."""
    _engine, images, _router, _kind, _kubectl = prepare(log)
    return ensure_helmhive_images(images.debian, log)


def existing(name: str = DEFAULT_NAME, *, log: TextIO) -> KindCluster:
    """The running cluster of that name, without building anything; KindError if there is none."""
    cache = cache_root()
    kind = ensure_go_tool(GO_TOOLS["kind"], log=log, root=cache)
    kubectl = cache / "k8s" / DEFAULT_KUBE_VERSION / "kubectl"
    if name not in _clusters(kind) or not kubectl.is_file():
        raise KindError(f"no kind cluster named {name!r}; run `helmhive dev kind up` first")
    kubeconfig = kind_state_dir() / f"{name}.kubeconfig"
    _run(
        [str(kind), "export", "kubeconfig", "--name", name, "--kubeconfig", str(kubeconfig)],
        what="kind export kubeconfig",
    )
    engine = ensure_engine(kind_state_dir(), log)
    nodes = _nodes_ready(kubectl, kubeconfig) or ()
    return KindCluster(
        name=name,
        kubeconfig=kubeconfig,
        kind=kind,
        kubectl=kubectl,
        node_image="",
        debian_image=_debian_tag(),
        engine=engine,
        nodes=nodes,
        reused=True,
    )


def _debian_tag() -> str:
    out = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "helmhive.local/debian"],
        capture_output=True,
        text=True,
        check=False,
    )
    tags = sorted(out.stdout.split())
    if not tags:
        raise KindError("no helmhive.local/debian image; run `helmhive dev kind up` first")
    return tags[-1]


def load_helmhive(cluster: KindCluster, *, log: TextIO) -> HelmhiveImages:
    """docker build Helmhive's operator and runner images from the working tree and load them."""
    images = ensure_helmhive_images(cluster.debian_image, log)
    load_images(cluster.name, [images.operator, images.runner], kind=cluster.kind, log=log)
    return images

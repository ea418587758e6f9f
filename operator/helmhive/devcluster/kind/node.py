"""The kind node image, assembled offline in place of ``kind build node-image``.

``kind build node-image`` cannot run here: it asks ``ctr info`` (Debian's ctr has no such
command) and pulls etcd, CoreDNS, pause and kindnetd from registries. The same result is
assembled in a few docker steps instead:

1. the node base (``images/kind/base/Dockerfile``) over Debian's minbase image;
2. one image per component, tagged as kubeadm expects (:func:`ensure_component_images`);
3. a container of the base with kubeadm, kubelet and kubectl copied in, ``/kind/version``
   written, containerd started inside to import the component images into ``k8s.io``, then
   ``docker commit`` with kind's entrypoint.

The node image's tag carries the Kubernetes version; its ``helmhive.inputs`` label the digest of
everything above, so any change of input rebuilds it and nothing else does.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from helmhive.devcluster.build import Binaries, ensure_node_binaries
from helmhive.devcluster.gotools import GO_TOOLS, ensure_go_tool
from helmhive.devcluster.kind.images import (
    LABEL,
    REPO_ROOT,
    ImageError,
    build_component_dockerfile,
    build_in_context,
    digest_inputs,
    docker_build,
    go_module_dir,
    image_id,
    image_label,
    run_docker,
)
from helmhive.devcluster.progress import step

__all__ = ["PAUSE_TAGS", "NodeImages", "ensure_node_image", "etcd_image_tag"]

REGISTRY = "registry.k8s.io"
PAUSE_TAGS = (f"{REGISTRY}/pause:3.10", f"{REGISTRY}/pause:3.10.2")
"""containerd's sandbox image in kind's config, and kubeadm's pause: one image under both names."""
_RECIPE = "node-v1"  # bump when the assembly steps in _assemble_node change


@dataclass(frozen=True, kw_only=True)
class NodeImages:
    """What a kind cluster is created from."""

    node: str
    debian: str
    kube_version: str
    etcd_image_tag: str


def etcd_image_tag(etcd_version: str) -> str:
    """The tag our etcd image carries: kubeadm's form of its version (``3.6.16-0``)."""
    return etcd_version.removeprefix("v") + "-0"


def _component_images(
    binaries: Binaries, node_dir: Path, coredns: Path, pause: Path, debian: str
) -> list[tuple[str, str, dict[str, Path], tuple[str, ...]]]:
    """(tag, Dockerfile, context files, extra tags) for every image kubeadm will look for on the node."""
    v = binaries.kube_version
    plain = {
        "kube-apiserver": binaries.kube_apiserver,
        "kube-controller-manager": binaries.kube_controller_manager,
        "kube-scheduler": node_dir / "kube-scheduler",
    }
    out: list[tuple[str, str, dict[str, Path], tuple[str, ...]]] = []
    for name, path in plain.items():
        dockerfile = build_component_dockerfile(base=debian, binary=name, entrypoint=f"/usr/local/bin/{name}")
        out.append((f"{REGISTRY}/{name}:{v}", dockerfile, {name: path}, ()))
    proxy = build_component_dockerfile(
        base=debian,
        binary="kube-proxy",
        entrypoint="/usr/local/bin/kube-proxy",
        packages=("iptables", "conntrack", "ipset", "kmod"),
    )
    out.append((f"{REGISTRY}/kube-proxy:{v}", proxy, {"kube-proxy": node_dir / "kube-proxy"}, ()))
    etcd = build_component_dockerfile(base=debian, binary="etcd", entrypoint="/usr/local/bin/etcd")
    out.append((f"{REGISTRY}/etcd:{etcd_image_tag(binaries.etcd_version)}", etcd, {"etcd": binaries.etcd}, ()))
    dns = build_component_dockerfile(base="scratch", binary="coredns", entrypoint="/coredns")
    out.append((f"{REGISTRY}/coredns/coredns:{GO_TOOLS['coredns'].version}", dns, {"coredns": coredns}, ()))
    pause_df = build_component_dockerfile(base="scratch", binary="pause", entrypoint="/pause")
    out.append((PAUSE_TAGS[0], pause_df, {"pause": pause}, PAUSE_TAGS[1:]))
    return out


def _ensure_pause(kube_version: str, cache: Path, log: TextIO) -> Path:
    """``gcc -Os -static`` of the kubernetes module's own ``build/pause/linux/pause.c``."""
    binary = cache / "pause" / kube_version / "pause"
    if binary.is_file():
        return binary
    source = go_module_dir("k8s.io/kubernetes", kube_version) / "build" / "pause" / "linux" / "pause.c"
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    cmd = ["gcc", "-Os", "-static", "-DVERSION=" + kube_version, "-o", str(partial), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"compiling pause failed: {proc.stderr[-1500:]}")
    partial.rename(binary)
    return binary


def ensure_node_image(binaries: Binaries, *, cache: Path, debian: str, log: TextIO) -> NodeImages:
    """Build (or reuse) the component images and the node image; return their tags."""
    kube_version = binaries.kube_version
    node_dir = ensure_node_binaries(kube_version=kube_version, log=log, root=cache)
    crictl = ensure_go_tool(GO_TOOLS["crictl"], log=log, root=cache)
    coredns = ensure_go_tool(GO_TOOLS["coredns"], log=log, root=cache)
    pause = _ensure_pause(kube_version, cache, log)

    kind_files = go_module_dir("sigs.k8s.io/kind", GO_TOOLS["kind"].version) / "images" / "base" / "files"
    base_dockerfile = REPO_ROOT / "images" / "kind" / "base" / "Dockerfile"
    base_tag = f"helmhive.local/kind-base:{GO_TOOLS['kind'].version}"
    base_inputs = digest_inputs(
        base_dockerfile.read_text(encoding="utf-8"), image_id(debian), GO_TOOLS["crictl"].version, str(kind_files)
    )
    if image_label(base_tag) != base_inputs:
        with tempfile.TemporaryDirectory(prefix="helmhive-kind-base-") as tmp:
            context = Path(tmp)
            subprocess.run(["cp", "-a", str(kind_files), str(context / "files")], check=True)
            subprocess.run(["chmod", "-R", "u+w", str(context / "files")], check=True)
            subprocess.run(["cp", str(crictl), str(context / "crictl")], check=True)
            docker_build(
                context,
                tag=base_tag,
                inputs=base_inputs,
                log=log,
                dockerfile=base_dockerfile,
                build_args={"BASE_IMAGE": debian},
            )

    component_ids: list[str] = []
    components = _component_images(binaries, node_dir, coredns, pause, debian)
    for tag, dockerfile, files, extra in components:
        stamps = [f"{name}:{path.stat().st_size}:{path.stat().st_mtime_ns}" for name, path in files.items()]
        inputs = digest_inputs(tag, dockerfile, image_id(debian), *stamps)
        component_ids.append(
            build_in_context(tag=tag, dockerfile_text=dockerfile, files=files, inputs=inputs, log=log, extra_tags=extra)
        )

    node_tag = f"helmhive.local/kind-node:{kube_version}"
    node_inputs = digest_inputs(
        _RECIPE,
        _NOOP_CNI,
        image_id(base_tag),
        *component_ids,
        *(str((node_dir / b).stat().st_mtime_ns) for b in ("kubeadm", "kubelet")),
    )
    if image_label(node_tag) != node_inputs:
        with step(log, f"assembling the node image {node_tag}"):
            _assemble_node(
                base_tag,
                node_tag,
                inputs=node_inputs,
                node_dir=node_dir,
                kubectl=binaries.kubectl,
                images=[c[0] for c in components] + list(PAUSE_TAGS[1:]),
                version=kube_version,
                log=log,
            )
    return NodeImages(
        node=node_tag, debian=debian, kube_version=kube_version, etcd_image_tag=etcd_image_tag(binaries.etcd_version)
    )


_NOOP_CNI = """# Helmhive's kind clusters bring their own CNI (kube-router); kind applies this only with its own.
apiVersion: v1
kind: ConfigMap
metadata: {name: helmhive-no-default-cni, namespace: kube-system}
"""


def _assemble_node(
    base: str, tag: str, *, inputs: str, node_dir: Path, kubectl: Path, images: list[str], version: str, log: TextIO
) -> None:
    name = f"helmhive-node-build-{int(time.time())}"
    run_docker(
        ["run", "-d", "--privileged", "--name", name, "--entrypoint", "sleep", base, "infinity"],
        log,
        what="starting the node build container",
    )
    try:
        for binary in (node_dir / "kubeadm", node_dir / "kubelet", kubectl):
            run_docker(["cp", str(binary), f"{name}:/usr/bin/{binary.name}"], log, what=f"copying {binary.name}")
        script = (
            f"echo {version} > /kind/version && mkdir -p /kind/manifests\n"
            f"cat > /kind/manifests/default-cni.yaml <<'EOF'\n{_NOOP_CNI}EOF\n"
            "sed -i 's|^KUBELET_EXTRA_ARGS=|KUBELET_EXTRA_ARGS=--fail-cgroupv1=false |' /etc/default/kubelet\n"
            "(containerd > /var/log/containerd-build.log 2>&1 &)\n"
            "for i in $(seq 1 100); do ctr version >/dev/null 2>&1 && exit 0; sleep 0.2; done; exit 1\n"
        )
        run_docker(["exec", name, "bash", "-c", script], log, what="preparing the node and starting containerd")
        for image in images:
            save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
            proc = subprocess.run(
                [
                    "docker",
                    "exec",
                    "-i",
                    name,
                    "ctr",
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    "--all-platforms",
                    "--no-unpack",
                    "--digests",
                    "-",
                ],
                stdin=save.stdout,
                capture_output=True,
                check=False,
            )
            save.wait()
            if proc.returncode != 0 or save.returncode != 0:
                raise ImageError(
                    f"importing {image} into the node failed: {proc.stderr.decode(errors='replace')[-1500:]}"
                )
            log.write(f"  imported {image} into the node's containerd\n")
        run_docker(
            ["exec", name, "bash", "-c", "pkill containerd; sleep 1; rm -f /var/log/containerd-build.log"],
            log,
            what="stopping containerd",
        )
        changes = [
            'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
            "CMD []",
            "ENV container=docker",
            f"LABEL {LABEL}={inputs}",
        ]
        args = ["commit"]
        for change in changes:
            args += ["--change", change]
        run_docker([*args, name, tag], log, what="committing the node image")
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)

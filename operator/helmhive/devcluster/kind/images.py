"""The images a kind cluster needs, built offline with ``docker build`` and cached by their inputs.

- ``helmhive.local/debian:<release>-minbase``: Debian's minbase tree (the cached debootstrap of
  :mod:`helmhive.devcluster.rootfs_bases`) imported with ``docker import``. Every other image,
  Helmhive's own included, is built ``FROM`` it: no registry is reached.
- the kind node base (``images/kind/base/Dockerfile`` over kind's own ``images/base/files``);
- one image per control-plane component, tagged with the exact names
  ``kubeadm config images list`` prints, so kubeadm finds them already present on the node;
- kube-router, for NetworkPolicy and pod routing between nodes.

Each image carries a ``helmhive.inputs`` label, a digest of what it was built from (versions,
Dockerfile text, base image id). An image whose label matches is reused; anything else is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from helmhive.devcluster.build import BuildError
from helmhive.devcluster.progress import step

__all__ = [
    "LABEL",
    "ComponentImage",
    "ImageError",
    "build_component_dockerfile",
    "digest_inputs",
    "docker_build",
    "ensure_debian_image",
    "image_id",
    "image_label",
    "run_docker",
]

LABEL = "helmhive.inputs"
REPO_ROOT = Path(__file__).resolve().parents[4]


class ImageError(BuildError):
    """An image could not be built; the message names the step and shows its output's tail."""


@dataclass(frozen=True, kw_only=True)
class ComponentImage:
    """One image of a node's control plane: a binary in a small image, under kubeadm's tag."""

    tag: str
    binary: Path | None
    dockerfile: str


def digest_inputs(*parts: str) -> str:
    """A short, stable digest of an image's inputs."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def run_docker(args: Sequence[str], log: TextIO, *, what: str, stdin: bytes | None = None) -> str:
    """Run ``docker ARGS``; raise :class:`ImageError` with the output's tail if it fails."""
    proc = subprocess.run(
        ["docker", *args],
        input=stdin,
        capture_output=True,
        check=False,
        env=dict(os.environ, DOCKER_BUILDKIT=os.environ.get("DOCKER_BUILDKIT", "0")),
    )
    out = proc.stdout.decode(errors="replace")
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise ImageError(f"{what} failed: docker {' '.join(args[:4])} …\n{(out + err)[-2500:]}")
    return out.strip()


def image_label(tag: str) -> str | None:
    """The ``helmhive.inputs`` label of a local image, or None when there is no such image."""
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{LABEL}"}}}}', tag],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def image_id(tag: str) -> str:
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise ImageError(f"no local image {tag}")
    return proc.stdout.strip()


def docker_build(
    context: Path,
    *,
    tag: str,
    inputs: str,
    log: TextIO,
    dockerfile: Path | None = None,
    target: str | None = None,
    build_args: dict[str, str] | None = None,
    extra_tags: Sequence[str] = (),
) -> str:
    """``docker build`` ``context`` as ``tag`` unless an image with the same inputs exists; return its id.

    An empty ``inputs`` always builds, leaving what to redo to docker's layer cache.
    """
    if inputs and image_label(tag) == inputs:
        for extra in extra_tags:
            run_docker(["tag", tag, extra], log, what=f"tagging {extra}")
        return image_id(tag)
    args = ["build", "--label", f"{LABEL}={inputs}", "-t", tag]
    for extra in extra_tags:
        args += ["-t", extra]
    if dockerfile is not None:
        args += ["-f", str(dockerfile)]
    if target is not None:
        args += ["--target", target]
    for key, value in (build_args or {}).items():
        args += ["--build-arg", f"{key}={value}"]
    with step(log, f"docker build {tag}"):
        run_docker([*args, str(context)], log, what=f"building {tag}")
    return image_id(tag)


def ensure_debian_image(tree: Path, release: str, log: TextIO) -> str:
    """Import Debian's cached minbase tree as ``helmhive.local/debian:<release>-minbase``; return the tag."""
    tag = f"helmhive.local/debian:{release}-minbase"
    stamp = tree.parent / f"{tree.name}.complete.json"
    inputs = digest_inputs("debian", release, stamp.read_text(encoding="utf-8") if stamp.is_file() else "")
    if image_label(tag) == inputs:
        return tag
    with step(log, f"docker import {tag} from {tree}"):
        tar = subprocess.Popen(["tar", "-C", str(tree), "-c", "."], stdout=subprocess.PIPE)
        proc = subprocess.run(
            ["docker", "import", "--change", f"LABEL {LABEL}={inputs}", "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            check=False,
        )
        tar.wait()
    if proc.returncode != 0 or tar.returncode != 0:
        raise ImageError(f"docker import {tag} failed: {proc.stderr.decode(errors='replace')[-1500:]}")
    return tag


def build_component_dockerfile(*, base: str, binary: str, entrypoint: str, packages: Sequence[str] = ()) -> str:
    """A Dockerfile that puts one static binary into ``base`` (or ``scratch``), with Debian packages if asked."""
    lines = [f"FROM {base}"]
    if packages:
        lines.append(
            "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
            + " ".join(packages)
            + " && apt-get clean && rm -rf /var/lib/apt/lists/*"
        )
    lines.append(f"COPY {Path(binary).name} {entrypoint}")
    lines.append(f'ENTRYPOINT ["{entrypoint}"]')
    return "\n".join(lines) + "\n"


def build_in_context(
    *, tag: str, dockerfile_text: str, files: dict[str, Path], inputs: str, log: TextIO, extra_tags: Sequence[str] = ()
) -> str:
    """Build ``dockerfile_text`` in a fresh context holding ``files`` (name → source path or directory)."""
    if image_label(tag) == inputs:
        for extra in extra_tags:
            run_docker(["tag", tag, extra], log, what=f"tagging {extra}")
        return image_id(tag)
    with tempfile.TemporaryDirectory(prefix="helmhive-image-") as tmp:
        context = Path(tmp)
        for name, source in files.items():
            if source.is_dir():
                shutil.copytree(source, context / name, symlinks=True)
            else:
                shutil.copy2(source, context / name)
        (context / "Dockerfile").write_text(dockerfile_text, encoding="utf-8")
        return docker_build(context, tag=tag, inputs=inputs, log=log, extra_tags=extra_tags)


def go_module_dir(module: str, version: str) -> Path:
    """The directory of ``module@version`` in the Go module cache, downloading it if need be."""
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, GOFLAGS="-mod=mod", GO111MODULE="on"),
        cwd=tempfile.gettempdir(),
    )
    if proc.returncode != 0:
        raise ImageError(f"go mod download {module}@{version} failed: {proc.stdout[-800:]}{proc.stderr[-800:]}")
    return Path(json.loads(proc.stdout)["Dir"])

"""Helmhive's own images, built with ``docker build`` from the project's Dockerfiles, as users' CI does.

The Dockerfiles name ``debian:12.15-slim`` as their base; with no registry reachable, the build is
given ``--build-arg DEBIAN_IMAGE=<the imported Debian minbase>`` instead, the same release. pip and
apt inside the build reach PyPI and Debian's mirror. Docker's layer cache makes a rebuild with
unchanged sources a matter of seconds. Each image is also tagged with its id
(:func:`build_unique_tag`), and that tag is what the cluster is given, so that a rebuilt image
rolls the pods of a cluster that is reused.

The runner's ``node`` flavour is built only on request (:func:`ensure_runner_node_image`; the kind
tier runs ``base``). Its ``NODE_IMAGE`` base, ``node:<version>-bookworm-slim``, is stood in for by
:mod:`helmhive.devcluster.rootfs_bases`' tree of the same name (the Debian minbase tree plus
Node.js and npm from the npm registry), ``docker import``ed as ``helmhive.local/node:<version>-bookworm-slim``.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from helmhive.devcluster.kind.images import (
    LABEL,
    REPO_ROOT,
    ImageError,
    digest_inputs,
    docker_build,
    image_id,
    image_label,
    run_docker,
)
from helmhive.devcluster.progress import step
from helmhive.devcluster.rootfs_bases import NPM_VERSION, RootfsError, ensure_base_tree, rootfs_cache_dir

__all__ = [
    "OPERATOR_IMAGE",
    "RUNNER_IMAGE",
    "RUNNER_NODE_IMAGE",
    "HelmhiveImages",
    "build_unique_tag",
    "decide_node_base",
    "ensure_helmhive_images",
    "ensure_node_base_image",
    "ensure_runner_node_image",
]

OPERATOR_IMAGE = "helmhive.local/helmhive:dev"
RUNNER_IMAGE = "helmhive.local/helmhive-runner:dev"
RUNNER_NODE_IMAGE = "helmhive.local/helmhive-runner:dev-node"
RUNNER_DOCKERFILE = REPO_ROOT / "images/runner/Dockerfile"
_NODE_ARG = re.compile(r"^ARG NODE_IMAGE=(?P<image>node:(?P<version>\d+\.\d+\.\d+)-[a-z]+-slim)\s*$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class HelmhiveImages:
    operator: str
    runner: str


def _ca_build_args() -> dict[str, str]:
    """The site's own CAs (Debian's ``/usr/local/share/ca-certificates``), for pip where TLS is inspected."""
    root = Path(os.environ.get("HELMHIVE_BUILD_CA_DIR") or "/usr/local/share/ca-certificates")
    pems = [p.read_text(encoding="utf-8").strip() for p in sorted(root.rglob("*.crt"))] if root.is_dir() else []
    return {"BUILD_CA_CERTS": "\n".join(pems)} if pems else {}


def ensure_helmhive_images(debian: str, log: TextIO) -> HelmhiveImages:
    """Build the operator image and the runner's ``base`` target from the working tree."""
    for tag, dockerfile, target in (
        (OPERATOR_IMAGE, "images/operator/Dockerfile", None),
        (RUNNER_IMAGE, "images/runner/Dockerfile", "base"),
    ):
        # inputs="" never matches a label, so docker's own layer cache decides what is rebuilt
        docker_build(
            REPO_ROOT,
            tag=tag,
            inputs="",
            log=log,
            dockerfile=REPO_ROOT / dockerfile,
            target=target,
            build_args={"DEBIAN_IMAGE": debian, **_ca_build_args()},
        )
    operator, runner = (build_unique_tag(tag, image_id(tag)) for tag in (OPERATOR_IMAGE, RUNNER_IMAGE))
    for tag, unique in ((OPERATOR_IMAGE, operator), (RUNNER_IMAGE, runner)):
        run_docker(["tag", tag, unique], log, what=f"docker tag {unique}")
    return HelmhiveImages(operator=operator, runner=runner)


def build_unique_tag(tag: str, ident: str) -> str:
    """``tag`` with the image's id appended (``…:dev-<12 hex>``): a rebuilt image gets a new tag, so a
    ``helm upgrade`` or a RunnerPool on a cluster that is reused rolls its pods onto it (with the
    same tag and ``imagePullPolicy: Never`` they would keep running the old one)."""
    return f"{tag}-{ident.removeprefix('sha256:')[:12]}"


def decide_node_base(dockerfile_text: str) -> tuple[str, str]:
    """(the Dockerfile's ``NODE_IMAGE`` default, its Node.js version); the default must be an exact release."""
    match = _NODE_ARG.search(dockerfile_text)
    if match is None:
        raise ImageError("images/runner/Dockerfile has no `ARG NODE_IMAGE=node:<x.y.z>-<suite>-slim`")
    return match.group("image"), match.group("version")


def ensure_node_base_image(*, debian: str, log: TextIO) -> str:
    """``docker import`` rootfs_bases' tree for the runner's ``NODE_IMAGE`` as ``helmhive.local/<it>``.

    Returns the local tag. The image is reused while its label matches: the same Node.js and npm
    over the same imported Debian image.
    """
    node_image, version = decide_node_base(RUNNER_DOCKERFILE.read_text(encoding="utf-8"))
    local = f"helmhive.local/{node_image}"
    inputs = digest_inputs("node", node_image, NPM_VERSION, image_id(debian))
    if image_label(local) == inputs:
        return local
    cache = rootfs_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    # Next to the Debian tree, so that `cp --reflink=auto` can share its blocks.
    with tempfile.TemporaryDirectory(prefix="node-base-", dir=cache) as tmp, step(log, f"docker import {local}"):
        tree = Path(tmp) / "tree"
        try:
            ensure_base_tree(node_image, {}, tree, log)
        except RootfsError as err:
            raise ImageError(f"the {node_image} base tree: {err}") from err
        # As the official image: NODE_VERSION in the environment, `node` as the command.
        changes = [f"LABEL {LABEL}={inputs}", f"ENV NODE_VERSION={version}", 'CMD ["node"]']
        tar = subprocess.Popen(["tar", "-C", str(tree), "-c", "."], stdout=subprocess.PIPE)
        proc = subprocess.run(
            ["docker", "import", *(arg for change in changes for arg in ("--change", change)), "-", local],
            stdin=tar.stdout,
            capture_output=True,
            check=False,
        )
        if tar.stdout is not None:
            tar.stdout.close()  # so that tar ends (EPIPE) if docker import stopped reading early
        tar.wait()
    if proc.returncode != 0 or tar.returncode != 0:
        raise ImageError(f"docker import {local} failed: {proc.stderr.decode(errors='replace')[-1500:]}")
    return local


def ensure_runner_node_image(debian: str, log: TextIO) -> str:
    """Build the runner's ``node`` target (``base`` plus Node.js and the npm agents); return its tag.

    npm inside the build reaches the npm registry; the site's CAs reach it as ``BUILD_CA_CERTS``.
    """
    node = ensure_node_base_image(debian=debian, log=log)
    docker_build(
        REPO_ROOT,
        tag=RUNNER_NODE_IMAGE,
        inputs="",
        log=log,
        dockerfile=RUNNER_DOCKERFILE,
        target="node",
        build_args={"DEBIAN_IMAGE": debian, "NODE_IMAGE": node, **_ca_build_args()},
    )
    return RUNNER_NODE_IMAGE

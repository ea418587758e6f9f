"""Helmhive's own images, built with ``docker build`` from the project's Dockerfiles, as users' CI does.

The Dockerfiles name ``debian:12.15-slim`` as their base; with no registry reachable, the build is
given ``--build-arg DEBIAN_IMAGE=<the imported Debian minbase>`` instead, the same release. pip and
apt inside the build reach PyPI and Debian's mirror. Docker's layer cache makes a rebuild with
unchanged sources a matter of seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from helmhive.devcluster.kind.images import REPO_ROOT, docker_build, image_id

__all__ = ["OPERATOR_IMAGE", "RUNNER_IMAGE", "HelmhiveImages", "ensure_helmhive_images"]

OPERATOR_IMAGE = "helmhive.local/helmhive:dev"
RUNNER_IMAGE = "helmhive.local/helmhive-runner:dev"


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
        image_id(tag)
    return HelmhiveImages(operator=OPERATOR_IMAGE, runner=RUNNER_IMAGE)

"""Builds (or reuses from the cache) the ``helm`` binary from the Go module proxy.

Helm v3 has no replace directives, so a plain ``go install helm.sh/helm/v3/cmd/helm@vX``
builds it; the version ldflag makes ``helm version`` report the real version. Cached like
the control-plane binaries, under ``<cache>/helm/<version>/helm``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import TextIO

from helmhive.devcluster.build import BuildError, cache_root
from helmhive.devcluster.cachelock import cache_entry_lock

__all__ = ["DEFAULT_HELM_VERSION", "ensure_helm"]

DEFAULT_HELM_VERSION = "v3.22.0"


def ensure_helm(*, version: str = DEFAULT_HELM_VERSION, log: TextIO, root: Path | None = None) -> Path:
    """Return the path of ``helm`` at ``version``, building it if the cache lacks it."""
    directory = (root or cache_root()) / "helm" / version
    binary = directory / "helm"
    stamp = directory / ".complete"
    if binary.is_file() and stamp.is_file():
        return binary
    with cache_entry_lock(directory, log, what=f"helm {version}"):
        if binary.is_file() and stamp.is_file():  # built by another process while we waited
            return binary
        return _build_helm(version, directory, log)


def _build_helm(version: str, directory: Path, log: TextIO) -> Path:
    binary = directory / "helm"
    directory.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOBIN=str(directory), CGO_ENABLED="0", GOTOOLCHAIN="local")
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -buildvcs=false").strip()
    cmd = [
        "go",
        "install",
        "-trimpath",
        "-ldflags",
        f"-s -w -X helm.sh/helm/v3/internal/version.version={version}",
        f"helm.sh/helm/v3/cmd/helm@{version}",
    ]
    log.write(f"building helm {version} into {directory}\n$ {' '.join(cmd)}\n")
    log.flush()
    started = time.monotonic()
    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0 or not binary.is_file():
        raise BuildError(f"building helm {version} failed ({proc.returncode}); see {log.name}")
    (directory / ".complete").write_text(f"{time.monotonic() - started:.1f}\n", encoding="utf-8")
    return binary

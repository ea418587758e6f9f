"""Builds (or reuses from the cache) the Go tools a kind cluster needs: kind, crictl, CoreDNS, kube-router.

Each is ``go install <package>@<version>`` from the Go module proxy into
``<cache>/go-tools/<name>/<version>/``, marked complete by a stamp written last and guarded by
the same per-entry lock as the control-plane binaries, so parallel callers build once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from helmhive.devcluster.build import BuildError, cache_root
from helmhive.devcluster.cachelock import cache_entry_lock
from helmhive.devcluster.progress import step

__all__ = ["GO_TOOLS", "GoTool", "ensure_go_tool"]

_STAMP = ".complete.json"


@dataclass(frozen=True, kw_only=True)
class GoTool:
    """A pinned Go program: where it lives in the module proxy and what it is called."""

    name: str
    package: str
    version: str

    @property
    def binary(self) -> str:
        return self.package.rsplit("/", 1)[-1]


GO_TOOLS: dict[str, GoTool] = {
    tool.name: tool
    for tool in (
        GoTool(name="kind", package="sigs.k8s.io/kind", version="v0.33.0"),
        GoTool(name="crictl", package="sigs.k8s.io/cri-tools/cmd/crictl", version="v1.36.0"),
        GoTool(name="coredns", package="github.com/coredns/coredns", version="v1.14.6"),
        GoTool(
            name="kube-router", package="github.com/cloudnativelabs/kube-router/v2/cmd/kube-router", version="v2.1.0"
        ),
    )
}


def ensure_go_tool(tool: GoTool, *, log: TextIO, root: Path | None = None) -> Path:
    """Return the path of ``tool``'s binary, building it with ``go install`` if the cache lacks it."""
    directory = (root or cache_root()) / "go-tools" / tool.name / tool.version
    binary = directory / tool.binary
    if (directory / _STAMP).is_file() and binary.is_file():
        return binary
    if shutil.which("go") is None:
        raise BuildError(f"Go is needed to build {tool.name} {tool.version}, and `go` is not on PATH")
    with cache_entry_lock(directory, log, what=f"{tool.name} {tool.version}"):
        if (directory / _STAMP).is_file() and binary.is_file():
            return binary
        directory.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GOBIN=str(directory), CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-buildvcs=false")
        cmd = ["go", "install", "-trimpath", "-ldflags", "-s -w", f"{tool.package}@{tool.version}"]
        log.write(f"building {tool.name} {tool.version}: {' '.join(cmd)}\n")
        log.flush()
        started = time.monotonic()
        logfile = directory / "build.log"
        with logfile.open("w", encoding="utf-8") as out, step(log, f"go install {tool.name} {tool.version}"):
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=directory, check=False)
        if proc.returncode != 0 or not binary.is_file():
            tail = logfile.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise BuildError(f"building {tool.name} {tool.version} failed ({proc.returncode}); {logfile}:\n{tail}")
        seconds = round(time.monotonic() - started, 1)
        (directory / _STAMP).write_text(json.dumps({"version": tool.version, "build_seconds": seconds}) + "\n")
    return binary

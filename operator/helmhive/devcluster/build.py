"""Builds (or reuses from the cache) etcd and the Kubernetes binaries.

The local control plane needs etcd, kube-apiserver, kube-controller-manager and kubectl
(:func:`ensure_binaries`); a kind node image needs kubelet, kubeadm, kube-proxy and
kube-scheduler too (:func:`ensure_node_binaries`), kept in a cache entry of their own so the
control-plane tier never waits for them.

Binaries are built from the Go module proxy with ``go build`` in small wrapper modules
(see :mod:`helmhive.devcluster.gomod`) and cached by version outside the repository, in
``$HELMHIVE_CACHE_DIR`` or ``$XDG_CACHE_HOME/helmhive`` or ``~/.cache/helmhive``.
A finished build is marked by a stamp file written last, so a build that was interrupted
is redone rather than trusted.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from helmhive.devcluster.cachelock import cache_entry_lock
from helmhive.devcluster.gomod import (
    build_etcd_main,
    build_etcd_wrapper_gomod,
    build_kube_ldflags,
    build_kube_wrapper_gomod,
    parse_kube_release,
)
from helmhive.devcluster.progress import step

__all__ = [
    "DEFAULT_ETCD_VERSION",
    "DEFAULT_KUBE_VERSION",
    "Binaries",
    "BuildError",
    "cache_root",
    "ensure_binaries",
    "ensure_node_binaries",
]

DEFAULT_KUBE_VERSION = "v1.37.2"
DEFAULT_ETCD_VERSION = "v3.6.16"
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kubectl")
NODE_BINARIES = ("kubelet", "kubeadm", "kube-proxy", "kube-scheduler")
_STAMP = ".complete.json"


class BuildError(RuntimeError):
    """A control-plane binary could not be built; the message names the log file."""


@dataclass(frozen=True, kw_only=True)
class Binaries:
    """Paths of the built control-plane binaries."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path
    kube_version: str
    etcd_version: str


def cache_root() -> Path:
    """Return the cache directory for everything ``helmhive dev cluster`` keeps."""
    explicit = os.environ.get("HELMHIVE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "helmhive"


def _go_version() -> str:
    out = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True)
    version = out.stdout.strip().removeprefix("go")
    parts = version.split(".")
    return ".".join(parts[:2]) + ".0" if len(parts) >= 2 else version


def _run(cmd: list[str], *, cwd: Path, log: TextIO, env: dict[str, str]) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        raise BuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}; see {log.name}")


def _fetch_module_file(module: str, version: str, *, cwd: Path, log: TextIO, env: dict[str, str]) -> Path:
    """Download ``module@version`` through the Go module proxy and return its go.mod path."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    log.write(out.stderr)
    if out.returncode != 0:
        raise BuildError(f"go mod download {module}@{version} failed: {out.stdout.strip()[:2000]}")
    info = json.loads(out.stdout)
    return Path(info["GoMod"])


def _build_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "")
    env["GOFLAGS"] = (env["GOFLAGS"] + " -mod=mod -buildvcs=false").strip()
    env["CGO_ENABLED"] = "0"
    env["GOTOOLCHAIN"] = "local"
    return env


def _stamped(directory: Path, names: tuple[str, ...]) -> bool:
    return (directory / _STAMP).is_file() and all((directory / n).is_file() for n in names)


def _write_stamp(directory: Path, seconds: float, version: str) -> None:
    (directory / _STAMP).write_text(
        json.dumps({"version": version, "build_seconds": round(seconds, 1)}) + "\n", encoding="utf-8"
    )


def _build_kube(version: str, out_dir: Path, log: TextIO, binaries: tuple[str, ...] = KUBE_BINARIES) -> None:
    release = parse_kube_release(version)
    env = _build_env()
    work = out_dir / "src"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    go_version = _go_version()
    (work / "go.mod").write_text(f"module helmhive.dev/devcluster/probe\n\ngo {go_version}\n", encoding="utf-8")
    gomod_path = _fetch_module_file("k8s.io/kubernetes", version, cwd=work, log=log, env=env)
    wrapper = build_kube_wrapper_gomod(
        release=release, kube_gomod=gomod_path.read_text(encoding="utf-8"), go_version=go_version
    )
    (work / "go.mod").write_text(wrapper, encoding="utf-8")
    (work / "tools.go").write_text(
        "//go:build tools\n\npackage tools\n\n" + "".join(f'import _ "k8s.io/kubernetes/cmd/{b}"\n' for b in binaries),
        encoding="utf-8",
    )
    _run(["go", "mod", "tidy", "-e"], cwd=work, log=log, env=env)
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ldflags = build_kube_ldflags(release=release, build_date=date)
    cmd = ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(out_dir) + "/"]
    cmd += [f"k8s.io/kubernetes/cmd/{b}" for b in binaries]
    _run(cmd, cwd=work, log=log, env=env)


def _build_etcd(version: str, out_dir: Path, log: TextIO) -> None:
    env = _build_env()
    work = out_dir / "src"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    go_version = _go_version()
    (work / "go.mod").write_text(
        build_etcd_wrapper_gomod(etcd_version=version, go_version=go_version), encoding="utf-8"
    )
    (work / "main.go").write_text(build_etcd_main(), encoding="utf-8")
    _run(["go", "mod", "tidy", "-e"], cwd=work, log=log, env=env)
    _run(
        ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out_dir / "etcd"), "."],
        cwd=work,
        log=log,
        env=env,
    )


def ensure_binaries(
    *,
    kube_version: str = DEFAULT_KUBE_VERSION,
    etcd_version: str = DEFAULT_ETCD_VERSION,
    log: TextIO,
    root: Path | None = None,
) -> Binaries:
    """Return the binaries for these versions, building the ones the cache lacks."""
    base = root or cache_root()
    kube_dir = base / "k8s" / kube_version
    etcd_dir = base / "etcd" / etcd_version
    if shutil.which("go") is None and not (_stamped(kube_dir, KUBE_BINARIES) and _stamped(etcd_dir, ("etcd",))):
        raise BuildError("Go is needed to build the control-plane binaries, and `go` is not on PATH")
    for directory, names, builder, version in (
        (etcd_dir, ("etcd",), _build_etcd, etcd_version),
        (kube_dir, KUBE_BINARIES, _build_kube, kube_version),
    ):
        if _stamped(directory, names):
            continue
        with cache_entry_lock(directory, log, what=f"{', '.join(names)} {version}"):
            if _stamped(directory, names):  # another process built it while we waited
                continue
            directory.mkdir(parents=True, exist_ok=True)
            log.write(f"building {', '.join(names)} {version} into {directory}\n")
            log.flush()
            started = time.monotonic()
            with step(log, f"go build {', '.join(names)} {version}"):
                builder(version, directory, log)
            _write_stamp(directory, time.monotonic() - started, version)
            shutil.rmtree(directory / "src", ignore_errors=True)
    return Binaries(
        etcd=etcd_dir / "etcd",
        kube_apiserver=kube_dir / "kube-apiserver",
        kube_controller_manager=kube_dir / "kube-controller-manager",
        kubectl=kube_dir / "kubectl",
        kube_version=kube_version,
        etcd_version=etcd_version,
    )


def _build_node(version: str, out_dir: Path, log: TextIO) -> None:
    _build_kube(version, out_dir, log, NODE_BINARIES)


def ensure_node_binaries(*, kube_version: str = DEFAULT_KUBE_VERSION, log: TextIO, root: Path | None = None) -> Path:
    """Return the directory holding kubelet, kubeadm, kube-proxy and kube-scheduler, building them if needed."""
    directory = (root or cache_root()) / "k8s-node" / kube_version
    if _stamped(directory, NODE_BINARIES):
        return directory
    if shutil.which("go") is None:
        raise BuildError("Go is needed to build the node binaries, and `go` is not on PATH")
    with cache_entry_lock(directory, log, what=f"{', '.join(NODE_BINARIES)} {kube_version}"):
        if not _stamped(directory, NODE_BINARIES):
            directory.mkdir(parents=True, exist_ok=True)
            log.write(f"building {', '.join(NODE_BINARIES)} {kube_version} into {directory}\n")
            log.flush()
            started = time.monotonic()
            with step(log, f"go build {', '.join(NODE_BINARIES)} {kube_version}"):
                _build_node(kube_version, directory, log)
            _write_stamp(directory, time.monotonic() - started, kube_version)
            shutil.rmtree(directory / "src", ignore_errors=True)
    return directory

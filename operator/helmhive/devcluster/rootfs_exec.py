"""Run one command inside an image's filesystem tree, the way a container runtime would.

``python -m helmhive.devcluster.rootfs_exec SPEC_JSON`` is started by
:mod:`helmhive.devcluster.rootfs` under ``unshare --mount --propagation private`` (root, in a
new mount namespace, so every mount below disappears with the process). It:

1. with ``read_only``, bind-mounts the tree onto itself and remounts it read-only, after creating
   the mount points the spec names (a runtime creates them before it makes the root read-only);
2. mounts ``/proc``, a ``/dev`` with the usual device nodes (null, zero, full, random, urandom,
   tty) bound from the host, ``tmpfs`` mounts, and the spec's bind mounts;
3. ``chroot``s into the tree, changes to ``cwd``, drops to ``uid``/``gid`` with no
   supplementary groups (all capabilities go with uid 0) and sets ``no_new_privs``
   (``allowPrivilegeEscalation: false``);
4. ``exec``s ``argv`` with exactly ``env`` as its environment (``PATH`` from ``env`` finds it).

The process keeps its pid through every step, so a signal sent to it reaches the command.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
PR_SET_NO_NEW_PRIVS = 38


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def inside(root: Path, path: str, *, hops: int = 32) -> Path:
    """``path`` of the tree at ``root`` as a host path, following the tree's symlinks inside it.

    Symlinks are resolved as if ``root`` were ``/`` (Debian's ``/var/run -> /run`` would
    otherwise point at the host's ``/run``); ``..`` never climbs above ``root``.
    """
    resolved = root
    todo = [part for part in Path(path).parts if part not in ("/", "")]
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            resolved = resolved.parent if resolved != root else root
            continue
        candidate = resolved / part
        if candidate.is_symlink():
            hops -= 1
            if hops < 0:
                raise SystemExit(f"rootfs_exec: too many symlinks in {path}")
            link = Path(candidate.readlink())
            todo = [p for p in link.parts if p not in ("/", "")] + todo
            if link.is_absolute():
                resolved = root
            continue
        resolved = candidate
    return resolved


def _mount_point(root: Path, path: str, *, file: bool) -> Path:
    target = inside(root, path)
    if file:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.touch()
    else:
        target.mkdir(parents=True, exist_ok=True)
    return target


def setup(spec: dict[str, Any]) -> None:
    root = Path(spec["root"]).resolve()
    binds: list[dict[str, Any]] = spec.get("binds", [])
    tmpfs: list[str] = spec.get("tmpfs", [])
    for bind in binds:
        _mount_point(root, bind["target"], file=Path(bind["source"]).is_file())
    for path in ["/proc", "/dev", *tmpfs]:
        _mount_point(root, path, file=False)
    if spec.get("read_only"):
        _mount("--bind", str(root), str(root))
        _mount("-o", "remount,bind,ro", str(root))
    _mount("-t", "proc", "proc", str(root / "proc"))
    _mount("-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", str(root / "dev"))
    for device in DEVICES:
        node = root / "dev" / device
        node.touch()
        _mount("--bind", f"/dev/{device}", str(node))
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        (root / "dev" / link).symlink_to(target)
    (root / "dev" / "stderr").symlink_to("/proc/self/fd/2")
    (root / "dev" / "shm").mkdir()
    _mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "shm", str(root / "dev" / "shm"))
    for path in tmpfs:
        _mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", str(inside(root, path)))
    for bind in binds:
        target = str(inside(root, bind["target"]))
        _mount("--bind", bind["source"], target)
        if bind.get("read_only"):
            _mount("-o", "remount,bind,ro", target)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m helmhive.devcluster.rootfs_exec SPEC_JSON")
    spec = json.loads(argv[0])
    setup(spec)
    os.chroot(spec["root"])
    os.chdir(spec.get("cwd") or "/")
    uid, gid = int(spec.get("uid", 0)), int(spec.get("gid", 0))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SystemExit(f"rootfs_exec: prctl(PR_SET_NO_NEW_PRIVS) failed: errno {ctypes.get_errno()}")
    env: dict[str, str] = spec["env"]
    command: list[str] = spec["argv"]
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        print(f"rootfs_exec: cannot run {command[0]!r} in {spec['root']}: {err}", file=sys.stderr)
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])

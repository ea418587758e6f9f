"""A read-only view of the file system for the agent: it cannot change what the runner relies on.

Landlock governs what a process may read and write, not a file's *metadata*: ``chmod``, ``chown``,
``utime`` and extended attributes are checked by ownership alone. The agent runs as the runner's
uid (an unprivileged pod can map no other into a user namespace), so it owns the runner's files --
its state directory, its credential copy, its kubeconfig, the mounted secret -- and could
``chmod 000`` them and break the runner, or another job.

So the launcher (:mod:`helmhive.runner.sandbox.landlock`), when its policy has ``"readOnly": true``,
gives the agent a mount namespace of its own (:func:`enter_read_only_view`, in the job's user
namespace, or as root) in which **every mount is read-only** but bind mounts of the paths the job
may write (its workspace when writable, its HOME and TMPDIR, the pool's ``writePaths``). A change
of any kind, metadata included, anywhere else fails with ``EROFS``, by any path (the same inode
is on the same read-only mount whatever the name; another process's ``/proc/<pid>/root`` needs
ptrace, which Landlock denies). The runner's own view is untouched: the namespace is the agent's
(and its checks') alone, and ends with it. This is ``bwrap --ro-bind / / --bind <dir> <dir>``.

A mount the launcher cannot reach (``EACCES``: a directory its uid may not search) is left as it
is: the agent, with the same uid and fewer capabilities, cannot reach it either. Landlock denies
the agent ``mount``/``umount`` (a sandboxed process cannot change its file system topology), so
it cannot undo this; a root agent's capabilities hold only in its own user namespace anyway.

Only the standard library is imported (the launcher starts fast).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["enter_read_only_view", "mount_points"]

_CLONE_NEWNS = 0x00020000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_NOATIME = 1024
_MS_NODIRATIME = 2048
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MS_RELATIME = 1 << 21
_MS_STRICTATIME = 1 << 24
# A remount in a user namespace must keep the flags its mount was locked with.
_KEPT = {
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": _MS_NOATIME,
    "nodiratime": _MS_NODIRATIME,
    "relatime": _MS_RELATIME,
    "strictatime": _MS_STRICTATIME,
}
_UNREACHABLE = (errno.EACCES, errno.ENOENT)


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _mount(libc: Any, source: str | None, target: str, flags: int) -> None:
    src = os.fsencode(source) if source is not None else None
    if libc.mount(src, os.fsencode(target), None, ctypes.c_ulong(flags), None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {target}: {os.strerror(code)}")


def _unescape(field: str) -> str:
    """``/proc/self/mountinfo`` writes space, tab, newline and backslash as ``\\ooo``."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str) -> Iterator[tuple[str, int]]:
    """Each mount point of a ``mountinfo`` text with the flags a remount must keep (pure)."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        kept = 0
        for option in fields[5].split(","):
            kept |= _KEPT.get(option, 0)
        yield _unescape(fields[4]), kept


def _beneath(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def enter_read_only_view(*, writable: Sequence[str]) -> None:
    """Move this process into a mount namespace of its own where every mount is read-only but bind
    mounts of ``writable`` (those that exist). Needs CAP_SYS_ADMIN in the current user namespace.
    Raises :class:`OSError` if any reachable mount cannot be made read-only (fail closed)."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWNS): {os.strerror(code)}")
    _mount(libc, None, "/", _MS_REC | _MS_PRIVATE)  # nothing done here reaches the runner's view
    kept = []
    for path in dict.fromkeys(os.path.realpath(p) for p in writable):
        if os.path.exists(path):  # its own mount first: a bind copies the flags of its source
            _mount(libc, path, path, _MS_BIND | _MS_REC)
            kept.append(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        points = list(mount_points(fh.read()))
    for point, flags in points:
        if _beneath(point, kept):
            continue
        try:
            _mount(libc, None, point, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)
        except OSError as exc:
            if exc.errno not in _UNREACHABLE:
                raise

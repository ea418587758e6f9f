"""A job's disk limit: its workspace, HOME and TMPDIR together, measured by the runner.

In a job pod the limit is the ``emptyDir``'s ``sizeLimit``; in the runner pod there is no
unprivileged way to bound a directory's size -- a size-limited tmpfs, a loop device or a project
quota each needs ``mount`` or quota privileges in the pod's own namespace, which a runner
(uid 65532, no capabilities) does not have, and a tmpfs in the agent's own mount namespace would
hide the workspace from the runner, which reads it after the agent (the patch, the checks). So
the runner does what the kubelet does for an ``emptyDir`` ``sizeLimit``: it **measures**
(:func:`measure_usage`: the blocks each file takes, each inode once, symbolic links not followed)
every :data:`DISK_CHECK_SECONDS` while the job runs (:func:`watch_disk`) and once more when its agent
has ended, and a job over its ``jobLimits.diskBytes`` ends ``ResourceLimitExceeded:disk``.

Between two measurements a job can write more than its limit; ``RLIMIT_FSIZE`` (the launcher's
``FSIZE`` at the same value: :mod:`helmhive.runner.sandbox.limits`) bounds what one file can take, so
one runaway write stops at the limit (``EFBIG``). Files the job deleted but holds open are not seen
by a walk; the pod's own ephemeral-storage limit is the backstop for those (``docs/security.md``).
The cost is one ``lstat`` per file of the three directories per measurement.

:func:`decide_disk_hit` is pure; :func:`measure_usage` reads the file system; :func:`watch_disk` loops.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["DISK_CHECK_SECONDS", "decide_disk_hit", "measure_usage", "watch_disk"]

DISK_CHECK_SECONDS = 2.0
"""How often a running job's directories are measured."""
_MIB = 1024 * 1024


def _walk(root: Path, seen: set[tuple[int, int]]) -> int:
    used = 0
    stack = [str(root)]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:  # gone, or not searchable (mode 000): the runner makes it so again to remove it
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            used += info.st_blocks * 512
            if stat.S_ISDIR(info.st_mode):
                stack.append(entry.path)
    return used


def measure_usage(paths: Iterable[Path]) -> int:
    """The bytes the files below ``paths`` take on disk (allocated blocks: a sparse file counts what it
    uses; a hard link once)."""
    seen: set[tuple[int, int]] = set()
    used = 0
    for path in dict.fromkeys(paths):
        try:
            info = path.lstat()
        except OSError:
            continue
        if (info.st_dev, info.st_ino) not in seen and stat.S_ISDIR(info.st_mode):
            seen.add((info.st_dev, info.st_ino))
            used += info.st_blocks * 512 + _walk(path, seen)
    return used


def decide_disk_hit(*, used: int, limit: int) -> str | None:
    """The message for a job over its disk limit, or None (pure)."""
    if used <= limit:
        return None
    return (
        f"the job's workspace, HOME and TMPDIR took {used // _MIB} MiB, over its {limit // _MIB} MiB "
        "(jobLimits.diskBytes)"
    )


async def watch_disk(
    *, paths: tuple[Path, ...], limit: int, exceeded: Callable[[str], None], every: float = DISK_CHECK_SECONDS
) -> None:
    """Measure ``paths`` every ``every`` seconds until cancelled; call ``exceeded`` once with the
    message when they are over ``limit`` (and stop)."""
    while True:
        await asyncio.sleep(every)
        used = await asyncio.to_thread(measure_usage, paths)
        hit = decide_disk_hit(used=used, limit=limit)
        if hit is not None:
            exceeded(hit)
            return

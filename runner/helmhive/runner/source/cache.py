"""The runner's source cache on disk: its per-repository lock, its size, and eviction.

Owns :func:`locked` (an exclusive ``flock`` on a repository's lock file, waited for up to a
deadline or tried once), :func:`tree_size`, and :func:`evict`, which removes the
least-recently-used repositories :func:`~helmhive.runner.source.rules.decide_evictions` names,
skipping any another job holds at that moment. A repository's last use is the mtime of its
:data:`USED_MARKER` file. :func:`helmhive.runner.source.fetch.ensure_source` uses them.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from helmhive.runner.logs import fields
from helmhive.runner.source.rules import CacheEntry, DeadlinePassed, decide_evictions

__all__ = ["USED_MARKER", "evict", "locked", "tree_size"]

log = logging.getLogger("helmhive.runner.source.fetch")

USED_MARKER = "helmhive-last-used"
_LOCK_POLL_S = 0.1


@contextlib.contextmanager
def locked(path: Path, *, deadline: float | None) -> Iterator[bool]:
    """Hold an exclusive lock on ``path``; yield False at once if busy and ``deadline`` is None.

    Raises :class:`~helmhive.runner.source.rules.DeadlinePassed` when ``deadline`` passes first."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is None:
                    yield False
                    return
                if time.monotonic() >= deadline:
                    raise DeadlinePassed() from None
                time.sleep(_LOCK_POLL_S)
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def tree_size(path: Path) -> int:
    """Bytes of the files under ``path`` (what is unreadable counts nothing)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def _cache_entries(cache_dir: Path) -> list[CacheEntry]:
    entries = []
    for repo in cache_dir.glob("*.git"):
        try:
            last_used = (repo / USED_MARKER).stat().st_mtime
        except OSError:
            last_used = 0.0
        entries.append(CacheEntry(key=repo.name, size=tree_size(repo), last_used=last_used))
    return entries


def evict(cache_dir: Path, *, max_bytes: int, keep: str) -> None:
    """Remove least-recently-used repositories while the cache is over ``max_bytes``; never ``keep``,
    nor one whose lock another job holds."""
    for key in decide_evictions(_cache_entries(cache_dir), max_bytes=max_bytes, keep=keep):
        with locked(cache_dir / f"{key}.lock", deadline=None) as held:
            if not held:  # another job is using it right now
                log.info("source cache: in use, not evicted", extra=fields(cache_key=key))
                continue
            size = tree_size(cache_dir / key)
            shutil.rmtree(cache_dir / key, ignore_errors=True)
            log.info("source cache: evicted", extra=fields(cache_key=key, bytes=size, max_bytes=max_bytes))

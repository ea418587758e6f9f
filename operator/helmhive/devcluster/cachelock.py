"""One builder at a time per cache entry: an exclusive ``flock`` beside the entry.

The caches under ``~/.cache/helmhive`` (control-plane binaries, helm, the Debian base tree, npm
packages) are shared by every process on the machine: two test sessions, a demo and a test run, or
parallel test workers. Each ``ensure_*`` takes this lock before it looks at the entry's stamp, so
a second process waits for the first build instead of deleting its work directory or running the
same build beside it, then finds the stamp and reuses the result. The lock is released when the
process ends, however it ends (kernel ``flock``), so a killed build never blocks the next one.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["cache_entry_lock"]


@contextmanager
def cache_entry_lock(entry: Path, log: IO[str] | None = None, *, what: str = "") -> Iterator[None]:
    """Hold ``<entry>.lock`` exclusively; say so in ``log`` if another process holds it first."""
    lock_path = entry.with_name(entry.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log is not None:
                log.write(f"waiting for another process that is building {what or entry} ({lock_path})\n")
                log.flush()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock

"""Progress lines for long steps: what is being done, and how long so far, at least every 30 s.

A cold build of the Kubernetes binaries takes minutes of silent ``go build``; a user who sees
nothing for that long cannot tell a build from a hang. :func:`step` prints a line when a step
starts, a ``still …`` line every ``every`` seconds while it runs (from a daemon thread, so the
step itself needs no changes), and one line with the elapsed time when it ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

__all__ = ["step"]


@contextmanager
def step(log: IO[str], what: str, *, every: float = 30.0) -> Iterator[None]:
    """Report ``what`` on ``log``: at the start, every ``every`` seconds, and with its duration at the end."""
    started = time.monotonic()
    done = threading.Event()
    lock = threading.Lock()

    def _say(line: str) -> None:
        with lock:
            log.write(line + "\n")
            log.flush()

    def _tick() -> None:
        while not done.wait(every):
            _say(f"  … still {what} ({time.monotonic() - started:.0f} s)")

    _say(f"{what} …")
    ticker = threading.Thread(target=_tick, name=f"progress:{what[:30]}", daemon=True)
    ticker.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        done.set()
        ticker.join()
        _say(f"{'done' if ok else 'failed'}: {what} ({time.monotonic() - started:.1f} s)")

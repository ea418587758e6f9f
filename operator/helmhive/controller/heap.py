"""Give the C heap's free pages back to the OS after a burst of short-lived allocations (glibc only).

A restarted operator lists every AgentJob and passes each through the job steps: at 10,000 jobs,
hundreds of MiB of parsed JSON allocated and freed within a minute, much of it in the API
threads' malloc arenas. memray on such a restart showed the live heap back at about 110 MiB
while the RSS stayed near 400 MiB: memory freed, but kept by the allocator between live blocks.
:func:`trim_heap` asks glibc (``malloc_trim(0)``) to return the free pages of every arena; it
touches nothing live, and is a no-op where the C library has no such call (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable

__all__ = ["rss_mib", "trim_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim  # ctypes releases the GIL during the call
    except (OSError, AttributeError):
        return None
    return trim


def trim_heap() -> bool:
    """Return the allocator's free pages to the OS; True when the C library did (and released some)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def rss_mib() -> float | None:
    """This process's resident set in MiB (Linux ``/proc``), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20

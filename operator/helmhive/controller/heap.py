"""Give the C heap's free pages back to the OS after a burst of short-lived allocations (glibc only).

A restarted operator lists every AgentJob and passes each through the job steps: at 10,000 jobs,
hundreds of MiB of parsed JSON allocated and freed within a minute, much of it in the API
threads' malloc arenas. memray on such a restart showed the live heap back at about 110 MiB
while the RSS stayed near 400 MiB: memory freed, but kept by the allocator between live blocks.
:func:`trim_heap` asks glibc (``malloc_trim(0)``) to return the free pages of every arena; it
touches nothing live, and is a no-op where the C library has no such call (musl, macOS).

:func:`limit_arenas` caps glibc's malloc arenas (``mallopt(M_ARENA_MAX)``) at start-up, before
the operator starts its threads: by default glibc gives each thread that allocates concurrently
an arena of its own (up to 8 per core), and a freed page inside one arena cannot serve another,
so the API threads' short-lived pages of parsed JSON fragment several heaps at once. Two arenas
is the conventional setting for Python services (``MALLOC_ARENA_MAX=2``); an explicit
``MALLOC_ARENA_MAX`` in the environment is left as the user set it.

:func:`freeze_start_up` is about Python's own cyclic garbage collector, not the C heap: once
the operator has started (its modules, Kopf, the kubernetes client's model classes, the first
listing of jobs), those objects live as long as the process, yet every full collection scanned
them all again: a quarter of a second each, several times in a burst of jobs (about 6% of the
operator's CPU in a 2,000-job burst). ``gc.freeze()`` moves them to the collector's permanent
generation, which later collections skip. Objects freed by their reference count are still
freed; only a reference cycle among the frozen objects that becomes garbage later is kept, so
one full collection runs first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
from collections.abc import Callable

__all__ = ["DEFAULT_ARENAS", "freeze_start_up", "limit_arenas", "rss_mib", "trim_heap"]

DEFAULT_ARENAS = 2
_M_ARENA_MAX = -8  # glibc <malloc.h>


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    trim: Callable[[int], int] | None = getattr(_libc(), "malloc_trim", None)  # ctypes releases the GIL
    return trim


def limit_arenas(arenas: int = DEFAULT_ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``arenas`` unless ``MALLOC_ARENA_MAX`` is set; True when it was capped."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt: Callable[[int, int], int] | None = getattr(_libc(), "mallopt", None)
    return bool(mallopt(_M_ARENA_MAX, arenas)) if mallopt is not None else False


def trim_heap() -> bool:
    """Return the allocator's free pages to the OS; True when the C library did (and released some)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def freeze_start_up() -> int:
    """Collect once, then freeze every object the collector tracks now; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def rss_mib() -> float | None:
    """This process's resident set in MiB (Linux ``/proc``), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20

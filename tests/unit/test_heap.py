"""The operator's malloc arena cap (:func:`helmhive.controller.heap.limit_arenas`), in a real process.

Each case runs a fresh interpreter (the cap must come before threads allocate), starts six
threads that allocate while all are alive, and counts glibc's heaps with ``malloc_info``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import ctypes, ctypes.util, sys, threading
from helmhive.controller.heap import limit_arenas
capped = limit_arenas() if sys.argv[1] == "cap" else None
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
hold, barrier = [], threading.Barrier(6)
def work():
    hold.append(bytearray(200_000))  # past pymalloc: from the thread's malloc arena
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads: t.start()
for t in threads: t.join()
fp = libc.fopen(sys.argv[2].encode(), b"w"); libc.malloc_info(0, fp); libc.fclose(fp)
print(capped)
"""


def _heaps(tmp_path: Path, mode: str, **env: str) -> tuple[str, int]:
    info = tmp_path / f"{mode}-{len(env)}.xml"
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(info)],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip(), info.read_text().count("<heap nr=")


def test_the_cap_keeps_concurrent_threads_to_two_arenas_unless_the_user_set_one(tmp_path: Path) -> None:
    capped, heaps = _heaps(tmp_path, "cap")
    assert (capped, heaps) == ("True", 2)
    uncapped = _heaps(tmp_path, "none")[1]
    assert uncapped > 2  # glibc's default: an arena per concurrently allocating thread
    assert _heaps(tmp_path, "cap", MALLOC_ARENA_MAX="3") == ("False", 3)  # the user's setting stands


FREEZE_PROBE = """
import gc, weakref
from helmhive.controller.heap import freeze_start_up

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a

kept = cycle()                      # start-up state that lives on
garbage = weakref.ref(cycle())      # start-up garbage: collected before the freeze, not frozen
frozen = freeze_start_up()
later = weakref.ref(cycle())        # made after the freeze: still collected
gc.collect()
print(frozen > 1000, garbage() is None, later() is None, kept.other.other is kept)
"""


def test_freezing_the_start_up_keeps_what_lives_and_still_collects_what_comes_after() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FREEZE_PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["True", "True", "True", "True"]

"""The cache lock: a second builder waits for the first, says so, and a killed holder frees it."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

from harness import wait_for
from helmhive.devcluster.cachelock import cache_entry_lock

_HOLDER = (
    "import sys; from pathlib import Path; from helmhive.devcluster.cachelock import cache_entry_lock\n"
    "with cache_entry_lock(Path(sys.argv[1])):\n"
    "    print('held', flush=True); sys.stdin.readline()\n"
)


def _holder(entry: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(entry)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


class _Log(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            return super().write(text)


def _waiter(entry: Path, log: _Log) -> tuple[threading.Thread, threading.Event]:
    acquired = threading.Event()

    def run() -> None:
        with cache_entry_lock(entry, log, what="etcd v0"):
            acquired.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, acquired


def test_a_second_builder_waits_for_the_first_and_says_what_it_waits_for(tmp_path: Path) -> None:
    entry = tmp_path / "etcd" / "v0"
    holder = _holder(entry)
    log = _Log()
    thread, acquired = _waiter(entry, log)
    wait_for(lambda: "waiting for another process that is building etcd v0" in log.getvalue(), timeout=30)
    assert not acquired.is_set()
    assert holder.stdin is not None
    holder.stdin.write("done\n")
    holder.stdin.flush()
    assert acquired.wait(30)
    thread.join(30)
    assert holder.wait(30) == 0


def test_a_killed_holder_frees_the_lock(tmp_path: Path) -> None:
    entry = tmp_path / "helm" / "v0"
    holder = _holder(entry)
    log = _Log()
    _, acquired = _waiter(entry, log)
    wait_for(lambda: "waiting for another process" in log.getvalue(), timeout=30)
    holder.kill()
    holder.wait(30)
    assert acquired.wait(30)


def test_an_uncontended_lock_is_silent(tmp_path: Path) -> None:
    log = _Log()
    with cache_entry_lock(tmp_path / "npm" / "x", log):
        pass
    assert log.getvalue() == ""
    assert (tmp_path / "npm" / "x.lock").exists()

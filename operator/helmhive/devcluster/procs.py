"""Process bookkeeping for the local control plane: ports, pid records, probes, log tails.

A started component is recorded as ``<state>/pids/<name>.json`` with its pid and the
kernel's start time of that pid, so a later ``down`` stops the very process it started
and never an unrelated one that happens to reuse the pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "LOOPBACK",
    "ProcessRecord",
    "free_ports",
    "is_alive",
    "log_tail",
    "probe",
    "read_record",
    "spawn",
    "terminate",
]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class ProcessRecord:
    """What ``up`` wrote about one component it started."""

    name: str
    pid: int
    start_ticks: int | None
    argv: list[str]
    log: str


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports on loopback that are free right now."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _proc_stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Return the kernel start time of ``pid`` (clock ticks since boot), if it is knowable."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def is_alive(pid: int, ticks: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, if ``ticks`` is given, is the same process."""
    fields = _proc_stat(pid)
    if fields is None:
        if Path("/proc/self/stat").exists():
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    if fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


def _parent_death_hook() -> Callable[[], None] | None:
    """Return a pre-exec hook that makes Linux send SIGTERM to the child when its parent dies."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    return hook


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    pid_dir: Path,
    tie_to_parent: bool = False,
) -> ProcessRecord:
    """Start ``argv`` in its own session with output to ``log_path`` and record it in ``pid_dir``.

    With ``tie_to_parent`` the process is also ended when the calling process dies
    (Linux only), which is what a test session wants; ``helmhive dev cluster up`` does
    not tie, so the cluster outlives the command.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pid_dir.mkdir(parents=True, exist_ok=True)
    preexec = _parent_death_hook() if tie_to_parent else None
    with log_path.open("ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,  # noqa: PLW1509 - only sets the parent-death signal
            close_fds=True,
        )
    record = ProcessRecord(
        name=name, pid=proc.pid, start_ticks=start_ticks(proc.pid), argv=list(argv), log=str(log_path)
    )
    (pid_dir / f"{name}.json").write_text(json.dumps(asdict(record)) + "\n", encoding="utf-8")
    return record


def read_record(pid_dir: Path, name: str) -> ProcessRecord | None:
    """Return the record ``spawn`` wrote for ``name``, or None."""
    path = pid_dir / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ProcessRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def terminate(record: ProcessRecord, *, grace: float = 10.0) -> bool:
    """Stop the recorded process (SIGTERM, then SIGKILL after ``grace`` seconds).

    Returns whether it had been running. A pid that now belongs to another process is
    left alone.
    """
    if not is_alive(record.pid, record.start_ticks):
        _reap(record.pid)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(record.pid)
        if not is_alive(record.pid, record.start_ticks):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGKILL)
    for _ in range(100):
        _reap(record.pid)
        if not is_alive(record.pid, record.start_ticks):
            break
        time.sleep(0.05)
    return True


def log_tail(path: Path | str, *, lines: int = 40, max_bytes: int = 64_000) -> str:
    """Return the last ``lines`` lines of a log file (or a note that there is none)."""
    try:
        with Path(path).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read().decode("utf-8", errors="replace")
    except OSError as err:
        return f"(no log at {path}: {err})"
    return "\n".join(data.splitlines()[-lines:])


def probe(
    url_path: str,
    *,
    port: int,
    tls: ssl.SSLContext | None = None,
    timeout: float = 2.0,
) -> tuple[bool, str]:
    """GET ``url_path`` on loopback ``port``; return (HTTP 200?, short body or error)."""
    conn: http.client.HTTPConnection
    if tls is None:
        conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection(LOOPBACK, port, timeout=timeout, context=tls)
    try:
        conn.request("GET", url_path)
        response = conn.getresponse()
        body = response.read(4096).decode("utf-8", errors="replace").strip()
        return response.status == 200, (body if response.status == 200 else f"HTTP {response.status}: {body}")
    except (OSError, http.client.HTTPException) as err:
        return False, f"{type(err).__name__}: {err}"
    finally:
        conn.close()


def client_tls(*, ca_file: Path, cert_file: Path | None = None, key_file: Path | None = None) -> ssl.SSLContext:
    """Return a TLS context that trusts ``ca_file`` and presents the client pair if given."""
    context = ssl.create_default_context(cafile=str(ca_file))
    if cert_file is not None and key_file is not None:
        context.load_cert_chain(str(cert_file), str(key_file))
    return context

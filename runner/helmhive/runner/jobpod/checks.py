"""The shim's checks: one ``CHECK`` run in the shim's copy of the handed-back tree.

The in-runner checks (:mod:`helmhive.runner.source.checks`) run in the runner's sandbox; here the
check runs in the shim container, which also holds the pool's link key. So it runs the same way,
under the same Landlock launcher (``python -P -m helmhive.runner.sandbox.landlock``): read the
system and the runtime but **not the key's directory nor the shim's own directory** (Landlock
grants by allow-list, so a system directory holding the key is granted child by child, without
it: :func:`carve_read_paths`), write only the copy and a fresh tmp, **no TCP connect or bind and
no datagrams**. A check never runs without that (Landlock ABI 4+): otherwise it is ``notRun``.

Its environment is :func:`build_shim_check_env`'s and nothing else (a fixed ``PATH``, ``HOME`` and
``TMPDIR`` in the shim's tmp, ``LANG``/``LC_ALL``). It runs in its own process group, killed whole
at its timeout. stdout and stderr are captured together; the result keeps what
:class:`~helmhive.api.governed.CheckEvidence` keeps (:meth:`CheckReport.to_evidence`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from helmhive.runner.jobpod.frames import Check, CheckReport
from helmhive.runner.jobpod.trees import clear_dir
from helmhive.runner.sandbox.plan import SYSTEM_READ_PATHS, runtime_read_paths
from helmhive.runner.sandbox.workdir import build_launcher
from helmhive.runner.source.checks import CHECK_PATH, OutputCapture, drain_output, kill_group, resolve_command

__all__ = ["build_shim_check_env", "build_shim_check_policy", "carve_read_paths", "run_check"]

_DRAIN_GRACE_S = 5.0
_LAUNCHER_EXITS = (126, 127)
_CARVE_DEPTH = 8


def build_shim_check_env(tmpdir: Path) -> dict[str, str]:
    """A check's whole environment: nothing of the shim's (no key path, no pod or runner variable)."""
    return {"PATH": CHECK_PATH, "HOME": str(tmpdir), "TMPDIR": str(tmpdir), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _inside(parent: str, child: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def carve_read_paths(paths: Iterable[str], excluded: Iterable[str]) -> list[str]:
    """``paths`` with every ``excluded`` path cut out: a path holding one is replaced by its
    children (recursively), a path inside one (or a symlink resolving there) is dropped."""
    cut = [os.path.realpath(p) for p in excluded]
    granted: list[str] = []

    def visit(path: str, depth: int) -> None:
        real = os.path.realpath(path)
        if any(_inside(e, real) for e in cut):
            return
        if not any(_inside(real, e) for e in cut):
            granted.append(path)
            return
        if depth >= _CARVE_DEPTH:
            return  # too deep to carve: grant nothing of it
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(path)):
                visit(os.path.join(path, name), depth + 1)

    for path in paths:
        if os.path.lexists(path):
            visit(os.path.normpath(path), 0)
    return list(dict.fromkeys(granted))


def build_shim_check_policy(*, workdir: Path, tmpdir: Path, excluded: Sequence[str]) -> dict[str, Any]:
    read = carve_read_paths([*SYSTEM_READ_PATHS, *runtime_read_paths()], excluded)
    return {
        "read": [*read, str(workdir), str(tmpdir)],
        "write": [str(workdir), str(tmpdir)],
        "devices": ["/dev"],
        "tcpConnect": [],
        "datagrams": False,
    }


def _tail(text: str, chars: int) -> str:
    return text[-chars:] if chars > 0 else ""


def _not_run(request: Check, why: str, *, exit_code: int | None = None) -> CheckReport:
    raw = why.encode()
    return CheckReport(
        name=request.name,
        exit_code=exit_code,
        output_tail=_tail(why, request.output_tail_chars),
        output_bytes=len(raw),
        output_sha256=hashlib.sha256(raw).hexdigest(),
        not_run=why,
    )


def _fresh_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    clear_dir(path)


async def run_check(
    request: Check,
    *,
    workdir: Path,
    tmpdir: Path,
    excluded: Sequence[str],
    landlock_abi: int,
    python: str = sys.executable,
    clock: Callable[[], float] = time.monotonic,
) -> CheckReport:
    """Run one check in ``workdir`` (the shim's copy); ``tmpdir`` is emptied first."""
    if not (workdir.is_absolute() and tmpdir.is_absolute()):  # the sandbox launcher runs in the tree
        raise ValueError("a check's directories must be absolute paths")
    if landlock_abi < 4:
        why = f"the network cannot be disabled for checks here (Landlock ABI {landlock_abi}; needs 4)"
        return _not_run(request, why)
    executable = resolve_command(request.command[0], workdir=workdir)
    if executable is None:
        return _not_run(request, f"command not found or not executable: {request.command[0]}")
    await asyncio.to_thread(_fresh_dir, tmpdir)
    policy = build_shim_check_policy(workdir=workdir, tmpdir=tmpdir, excluded=excluded)
    argv = (*build_launcher(policy, python=python), executable, *request.command[1:])
    # Our own pipe, not asyncio's: the exit is then not tied to every holder of the output closing it.
    read_fd, write_fd = os.pipe()
    started = clock()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=workdir,
            env=build_shim_check_env(tmpdir),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,
        )
    except OSError as exc:
        os.close(read_fd)
        return _not_run(request, f"the check could not be started: {exc.strerror or exc}")
    finally:
        os.close(write_fd)
    capture = OutputCapture()
    reader = asyncio.create_task(drain_output(read_fd, capture))
    try:
        code: int | None = await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=request.timeout_seconds)
    except TimeoutError:
        code = None
    finally:
        kill_group(proc.pid)  # at the timeout, on cancellation, and whatever it left running in its group
    await proc.wait()
    duration = max(clock() - started, 0.0)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(reader), timeout=_DRAIN_GRACE_S)
    if not reader.done():  # a process that left the group still holds the pipe
        reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    not_run = None
    if code in _LAUNCHER_EXITS and capture.from_launcher:
        not_run = "the check sandbox could not start the command"
    return CheckReport(
        name=request.name,
        exit_code=code,
        duration_ms=round(duration * 1000),
        timed_out=code is None,
        output_tail=_tail(capture.tail(), request.output_tail_chars),
        output_bytes=capture.total,
        output_sha256=capture.sha256,
        not_run=not_run,
    )

"""The checks of an implementation job, run by the runner on the patched tree, in the sandbox.

Each :class:`~helmhive.api.governed.CheckSpec` runs in order, after the patch is computed (so a
check cannot change it), as::

    python -P -m helmhive.runner.sandbox.landlock --policy <check policy> -- <command...>

with the work tree as its working directory and the check policy of
:func:`helmhive.runner.sandbox.workdir.build_check_policy`: read the system and runtime, write only the
tree and the job's tmp, **no TCP connect at all and no bind**, and the agent's per-job resource
limits (:mod:`helmhive.runner.sandbox.limits`; a check that hits one fails like any other, its exit code
saying how: ``-24`` for SIGXCPU). Its environment is
:func:`build_check_env` and nothing else: a fixed ``PATH``, ``HOME`` and ``TMPDIR`` in the
job's tmp, ``LANG`` -- no credential, no ``KUBECONFIG``, no provider key, no runner variable.
It runs in its own process group; at its timeout the whole group is killed (``TimedOut``).

stdout and stderr are captured together: the evidence keeps the exit code, the duration, the
last :data:`~helmhive.api.governed.CHECK_OUTPUT_TAIL_MAX` characters, the byte count and the
SHA-256 of the whole output. A command that cannot be started is ``NotRun``; so is every check
when the network cannot be disabled (no Landlock ABI 4+): a check never runs with the network.

A failing check does not fail the job: the evidence goes to status and to the reviewer.
:func:`decide_checks_reason` names the outcome (``ChecksPassed``, ``ChecksFailed``, ``NoChecks``).
``build_*``/``decide_*`` are pure; :func:`run_checks` starts processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from helmhive.api.governed import CHECK_OUTPUT_TAIL_MAX, CheckEvidence, CheckOutcome, CheckSpec
from helmhive.api.reasons import Reason
from helmhive.runner.sandbox.workdir import SandboxPlan, build_check_policy, build_launcher

__all__ = [
    "CHECK_PATH",
    "ChecksRun",
    "OutputCapture",
    "build_check_argv",
    "build_check_env",
    "build_checks_message",
    "decide_checks_reason",
    "drain_output",
    "kill_group",
    "resolve_command",
    "run_checks",
]

CHECK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The only ``PATH`` a check gets: commands elsewhere are named by absolute path."""
_DRAIN_GRACE_S = 5.0
"""After the check ends, how long its output may still be read (a child that escaped the group)."""
_LAUNCHER_MARK = b"helmhive sandbox: "
_LAUNCHER_EXITS = (126, 127)


class OutputCapture:
    """The whole output counted and hashed; only its end kept."""

    def __init__(self) -> None:
        self.total = 0
        self._hash = hashlib.sha256()
        self._tail = bytearray()
        self._head = b""

    def feed(self, chunk: bytes) -> None:
        if not self._head:
            self._head = chunk[: len(_LAUNCHER_MARK)]
        self.total += len(chunk)
        self._hash.update(chunk)
        self._tail += chunk
        keep = CHECK_OUTPUT_TAIL_MAX * 4  # UTF-8: at most 4 bytes per character
        if len(self._tail) > keep:
            del self._tail[: len(self._tail) - keep]

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    @property
    def from_launcher(self) -> bool:
        return self._head.startswith(_LAUNCHER_MARK)

    def tail(self) -> str:
        raw = bytes(self._tail)
        if self.total > len(raw):  # cut: skip a character split at the front
            while raw and 0x80 <= raw[0] < 0xC0:
                raw = raw[1:]
        return raw.decode(errors="replace")[-CHECK_OUTPUT_TAIL_MAX:]


def build_check_env(plan: SandboxPlan) -> dict[str, str]:
    """A check's whole environment: nothing of the runner's is inherited."""
    return {
        "PATH": CHECK_PATH,
        "HOME": str(plan.tmpdir),
        "TMPDIR": str(plan.tmpdir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


def resolve_command(command: str, *, workdir: Path, path: str = CHECK_PATH) -> str | None:
    """The executable ``command`` names (a bare name is looked up in ``path``, others in the tree)."""
    if "/" not in command:
        for directory in path.split(os.pathsep):
            candidate = os.path.join(directory, command)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        return None
    candidate = os.path.normpath(command if os.path.isabs(command) else os.path.join(workdir, command))
    if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
        return candidate
    return None


def build_check_argv(
    *, executable: str, args: Sequence[str], plan: SandboxPlan, python: str = sys.executable
) -> tuple[str, ...]:
    return (*build_launcher(build_check_policy(plan), python=python), executable, *args)


def decide_checks_reason(evidence: Sequence[CheckEvidence]) -> Reason:
    if not evidence:
        return Reason.NO_CHECKS
    return Reason.CHECKS_PASSED if all(e.passed for e in evidence) else Reason.CHECKS_FAILED


def build_checks_message(evidence: Sequence[CheckEvidence]) -> str:
    """``ChecksFailed: 1 of 2 checks did not pass (unit: Failed, exit 1; lint: Passed)``."""
    reason = decide_checks_reason(evidence)
    if reason is Reason.NO_CHECKS:
        return f"{reason.value}: the job declares no checks"
    failed = sum(1 for e in evidence if not e.passed)
    parts = []
    for e in evidence:
        exit_code = f", exit {e.exit_code}" if e.exit_code is not None and e.outcome is not CheckOutcome.PASSED else ""
        parts.append(f"{e.name}: {e.outcome.value}{exit_code}")
    head = (
        f"all {len(evidence)} check(s) passed"
        if reason is Reason.CHECKS_PASSED
        else f"{failed} of {len(evidence)} check(s) did not pass"
    )
    return f"{reason.value}: {head} ({'; '.join(parts)})"[:1000]


def _not_run(spec: CheckSpec, why: str) -> CheckEvidence:
    raw = why.encode()
    return CheckEvidence(
        name=spec.name,
        outcome=CheckOutcome.NOT_RUN,
        output_tail=why[-CHECK_OUTPUT_TAIL_MAX:],
        output_bytes=len(raw),
        output_sha256=hashlib.sha256(raw).hexdigest(),
    )


def kill_group(pid: int) -> None:
    """SIGKILL a check's process group (gone already, or not ours: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def drain_output(read_fd: int, capture: OutputCapture) -> None:
    """Feed everything read from ``read_fd`` to ``capture`` until end of file."""
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader(limit=64 * 1024)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(stream), os.fdopen(read_fd, "rb", buffering=0)
    )
    try:
        while chunk := await stream.read(64 * 1024):
            capture.feed(chunk)
    finally:
        transport.close()


async def _run_check(
    spec: CheckSpec, *, plan: SandboxPlan, cancel: asyncio.Event, clock: Callable[[], float]
) -> CheckEvidence | None:
    """One check's evidence; None if ``cancel`` was set while it ran (it is killed)."""
    executable = resolve_command(spec.command[0], workdir=plan.workdir)
    if executable is None:
        return _not_run(spec, f"command not found or not executable: {spec.command[0]}")
    argv = build_check_argv(executable=executable, args=spec.command[1:], plan=plan)
    # Our own pipe, not asyncio's: the process's exit is then not tied to every holder of its
    # output closing it (a child left running would hold up the wait).
    read_fd, write_fd = os.pipe()
    started = clock()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=plan.workdir,
            env=build_check_env(plan),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,
        )
    except OSError as exc:
        os.close(read_fd)
        return _not_run(spec, f"the check could not be started: {exc.strerror or exc}")
    finally:
        os.close(write_fd)
    capture = OutputCapture()
    reader = asyncio.create_task(drain_output(read_fd, capture))
    waiter = asyncio.create_task(proc.wait())
    cancelled = asyncio.create_task(cancel.wait())
    try:
        done, _ = await asyncio.wait({waiter, cancelled}, timeout=spec.timeout_seconds, return_when="FIRST_COMPLETED")
    finally:
        cancelled.cancel()
    exited = waiter in done
    kill_group(proc.pid)  # at the timeout or a cancel, and whatever the check left running in its group
    code = await waiter
    duration = max(clock() - started, 0.0)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(reader), timeout=_DRAIN_GRACE_S)
    if not reader.done():  # a process that left the group still holds the pipe: stop reading
        reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    if not exited and cancel.is_set():
        return None
    timed_out = not exited
    if timed_out:
        outcome, exit_code = CheckOutcome.TIMED_OUT, None
    elif code in _LAUNCHER_EXITS and capture.from_launcher:
        outcome, exit_code = CheckOutcome.NOT_RUN, code
    else:
        outcome, exit_code = (CheckOutcome.PASSED if code == 0 else CheckOutcome.FAILED), code
    return CheckEvidence(
        name=spec.name,
        outcome=outcome,
        exit_code=exit_code,
        duration_seconds=round(duration, 3),
        output_tail=capture.tail(),
        output_bytes=capture.total,
        output_sha256=capture.sha256,
    )


@dataclass(frozen=True, kw_only=True)
class ChecksRun:
    evidence: list[CheckEvidence]
    cancelled: bool


async def run_checks(
    specs: Sequence[CheckSpec],
    *,
    plan: SandboxPlan,
    landlock_abi: int,
    cancel: asyncio.Event,
    clock: Callable[[], float] = time.monotonic,
) -> ChecksRun:
    """Run every check in order; stop (``cancelled``) when ``cancel`` is set."""
    evidence: list[CheckEvidence] = []
    for spec in specs:
        if cancel.is_set():
            return ChecksRun(evidence=evidence, cancelled=True)
        if not plan.landlock or landlock_abi < 4:
            why = f"the network cannot be disabled for checks here (Landlock ABI {landlock_abi}; needs 4)"
            evidence.append(_not_run(spec, why))
            continue
        found = await _run_check(spec, plan=plan, cancel=cancel, clock=clock)
        if found is None:
            return ChecksRun(evidence=evidence, cancelled=True)
        evidence.append(found)
    return ChecksRun(evidence=evidence, cancelled=False)

"""``helmhive-jobpod agent``: the launcher, the agent container's PID 1.

It connects to the shim's UNIX socket (retrying until the shim has made it), waits for START,
and spawns the agent with exactly the argv, environment (nothing inherited) and cwd sent, in a
process group of its own, with pipes. It relays stdin, stdout and stderr over the socket,
signals the agent's group on ``SIGNAL`` (and SIGKILLs it when the socket ends: the runner is
gone), and when the agent exits it kills what is left of its group, reports ``EXIT`` and exits
itself -- as the container's PID 1, taking every other process of the container with it.

The socket is read at all times (stdin is queued for the agent, not written inline), so a
``SIGNAL`` is never stuck behind an agent that does not read its input. As PID 1 it also reaps
the orphans the agent leaves, which would otherwise stay zombies for the agent's whole run.
Logs never hold the environment's values or stdio bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from pathlib import Path

from helmhive.runner.jobpod.frames import (
    Exit,
    FrameStream,
    FrameType,
    LinkError,
    LinkReason,
    SignalRequest,
    Start,
    Started,
    decode,
    expect,
)

__all__ = ["STDIN_BUFFER_MAX", "connect_socket", "run_launcher"]

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
STDIN_BUFFER_MAX = 64 * 1024 * 1024
"""Input queued for an agent that does not read it; past this the agent is killed."""
_DRAIN_GRACE_S = 5.0
_SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT}


async def connect_socket(path: Path, seconds: float) -> FrameStream:
    """Connect to the shim's socket, retrying until it exists (the shim may start after us)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
            return FrameStream(reader, writer)
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise LinkError(LinkReason.LAUNCHER, f"the shim's socket did not appear in {seconds:g}s") from None
            await asyncio.sleep(0.1)


class _Agent:
    def __init__(self, proc: asyncio.subprocess.Process, conn: FrameStream) -> None:
        self.proc = proc
        self.conn = conn
        self.stdin: deque[bytes | None] = deque()  # None: close stdin
        self.stdin_bytes = 0
        self.stdin_ready = asyncio.Event()

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def pump_output(self, stream: asyncio.StreamReader, kind: FrameType) -> None:
        while chunk := await stream.read(CHUNK):
            with contextlib.suppress(LinkError):  # the shim is gone: keep draining, the agent is being killed
                await self.conn.send(kind, chunk)

    async def pump_control(self) -> None:
        """The shim's frames: stdin queued, signals delivered; EOF kills the agent's group."""
        while True:
            try:
                frame = expect(await self.conn.read(), FrameType.STDIN, FrameType.STDIN_EOF, FrameType.SIGNAL)
            except LinkError as exc:
                if exc.reason in (LinkReason.CLOSED, LinkReason.EOF):
                    log.warning("the shim closed the socket: killing the agent")
                    self.signal(signal.SIGKILL)
                    return
                log.warning("bad frame from the shim (%s)", exc.reason)
                continue
            if frame.type is FrameType.SIGNAL:
                try:
                    name = decode(frame, SignalRequest).signal
                except LinkError:
                    continue
                log.info("signal %s to the agent's group", name)
                self.signal(_SIGNALS[name])
            else:
                self.stdin.append(frame.payload if frame.type is FrameType.STDIN else None)
                self.stdin_bytes += len(frame.payload)
                self.stdin_ready.set()
                if self.stdin_bytes > STDIN_BUFFER_MAX:
                    log.warning("the agent does not read its input (%d bytes queued): killing it", self.stdin_bytes)
                    self.signal(signal.SIGKILL)

    async def pump_stdin(self, pipe: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self.stdin_ready.wait()
                self.stdin_ready.clear()
                while self.stdin:
                    data = self.stdin.popleft()
                    if data is None:
                        pipe.close()
                        return
                    self.stdin_bytes -= len(data)
                    pipe.write(data)
                    await pipe.drain()
        except (BrokenPipeError, ConnectionResetError):
            return  # the agent closed its stdin or exited


async def _read_pipe(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=CHUNK * 4)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
    return reader


async def _write_pipe(fd: int) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    pipe = os.fdopen(fd, "wb", buffering=0)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
    return asyncio.StreamWriter(transport, protocol, None, loop)


class _Pid:
    """The agent's pid once it runs (0 before): signals and the reaper need it."""

    agent = 0


async def _reap_orphans() -> None:
    """As PID 1: wait for exited orphans, never for the agent (asyncio collects its status)."""
    while True:
        await asyncio.sleep(1.0)
        while True:
            try:
                found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # noqa: ASYNC222 - WNOHANG
            except ChildProcessError:
                break
            if found is None or found.si_pid == _Pid.agent:
                break  # nothing waitable, or the agent first in line: asyncio will take it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(found.si_pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: returns at once


async def _serve(conn: FrameStream) -> int:
    try:
        frame = expect(await conn.read(), FrameType.START)
        start = decode(frame, Start)
    except LinkError as exc:
        log.info("no START (%s): exiting", exc.reason)
        return 0
    # Our own pipes, not asyncio's: the agent's exit is then not tied to every holder of its stdio
    # closing it (something it left running would hold up the EXIT).
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *start.argv,
            env=start.env,  # exactly as sent: nothing of ours is inherited
            cwd=start.cwd,
            stdin=stdin_r,
            stdout=stdout_w,
            stderr=stderr_w,
            start_new_session=True,
        )
    except OSError as exc:
        for fd in (stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w):
            os.close(fd)
        why = f"cannot start {os.path.basename(start.argv[0])!r}: {exc.strerror or exc}"
        log.warning("%s", why)
        with contextlib.suppress(LinkError):
            await conn.send(FrameType.STDERR, f"helmhive-jobpod: {why}\n".encode())
            await conn.send(FrameType.EXIT, Exit(code=127))
        return 127
    _Pid.agent = proc.pid
    log.info("started the agent (pid %d)", proc.pid)
    for fd in (stdin_r, stdout_w, stderr_w):
        os.close(fd)
    agent = _Agent(proc, conn)
    stdin = await _write_pipe(stdin_w)
    stdout, stderr = await _read_pipe(stdout_r), await _read_pipe(stderr_r)
    with contextlib.suppress(LinkError):
        await conn.send(FrameType.STARTED, Started(pid=proc.pid))
    outputs = [
        asyncio.create_task(agent.pump_output(stdout, FrameType.STDOUT)),
        asyncio.create_task(agent.pump_output(stderr, FrameType.STDERR)),
    ]
    helpers = [asyncio.create_task(agent.pump_control()), asyncio.create_task(agent.pump_stdin(stdin))]
    if os.getpid() == 1:
        helpers.append(asyncio.create_task(_reap_orphans()))
    code = await proc.wait()
    agent.signal(signal.SIGKILL)  # whatever the agent left running in its group
    _, pending = await asyncio.wait(outputs, timeout=_DRAIN_GRACE_S)
    for task in [*pending, *helpers]:
        task.cancel()
    stdin.close()
    ended = Exit(code=code) if code >= 0 else Exit(signal=-code)
    log.info("the agent exited (code %s, signal %s)", ended.code, ended.signal)
    with contextlib.suppress(LinkError):
        await conn.send(FrameType.EXIT, ended)
    return ended.status


async def _main(socket_path: Path, connect_timeout: float) -> int:
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None

    def on_signal(sig: signal.Signals) -> None:
        # PID 1 gets no default handler: a SIGTERM (the pod being deleted) must be passed on by hand.
        if _Pid.agent:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(_Pid.agent, sig)
        else:
            main_task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        conn = await connect_socket(socket_path, connect_timeout)
    except asyncio.CancelledError:
        return 143
    log.info("connected to the shim")
    try:
        return await _serve(conn)
    except asyncio.CancelledError:
        return 143
    finally:
        await conn.close()


def run_launcher(socket_path: Path, connect_timeout: float) -> int:
    try:
        return asyncio.run(_main(socket_path, connect_timeout))
    except LinkError as exc:
        log.error("%s", exc)
        return 1

"""``helmhive-jobpod attach``: a local stand-in for an agent that runs in a job pod.

The runner spawns it *in place of the agent*, as a wrapper (``helmhive-jobpod attach ... -- ARGV``),
so its adapters drive a job pod's agent with no change. It takes its whole environment as the
agent's (read from ``/proc/self/environ``, so not even the interpreter's own locale coercion is
added; nothing dropped), connects and authenticates, sends START, then pipes its stdin, stdout
and stderr to and from the link and exits with the agent's exit status (128 + the signal if a
signal killed it). SIGTERM and SIGINT are passed on as ``SIGNAL`` frames. If the bridge is
killed outright, the link drops and the shim kills the agent.

A failure of the link itself (refused, lost) is one line on stderr and exit status
:data:`LINK_FAILURE_EXIT`; nothing of the environment or the stdio is ever printed or logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from helmhive.runner.jobpod.auth import read_key
from helmhive.runner.jobpod.frames import Exit, LinkError, SignalName
from helmhive.runner.jobpod.link import AgentStream, JobPodLink
from helmhive.runner.jobpod.relay import parse_address

__all__ = ["LINK_FAILURE_EXIT", "AttachOptions", "attach", "own_environment", "run_attach"]

LINK_FAILURE_EXIT = 125
_CHUNK = 64 * 1024


@dataclass(frozen=True, kw_only=True)
class AttachOptions:
    address: str
    """The job pod's shim, ``host:port``."""
    pod: str
    key_file: Path
    job_uid: str
    cwd: str
    """The agent's working directory in the pod."""
    argv: tuple[str, ...]
    egress_target: str | None = None
    """``host:port`` of the runner's proxy, relayed from the pod's loopback; None: no relay."""
    timeout: float = 30.0


def own_environment() -> dict[str, str]:
    """This process's environment as it was exec'd (``os.environ`` may hold the interpreter's additions)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


class _Output:
    """One of our output fds, written without blocking the loop (a pipe) or directly (a file)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._writer: asyncio.StreamWriter | None = None
        self._broken = False

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, OSError):  # a regular file: plain writes
            pipe = os.fdopen(self._fd, "wb", buffering=0, closefd=False)
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
            # drain() then waits until every byte is in the pipe: nothing is left in a buffer at exit.
            transport.set_write_buffer_limits(high=0)
            self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def write(self, data: bytes) -> None:
        if self._broken:
            return  # our reader went away: the rest is discarded, the agent still runs to its end
        try:
            if self._writer is not None:
                self._writer.write(data)
                await self._writer.drain()
            else:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._broken = True

    async def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.drain()
            self._writer.close()


async def _pump_stdin(agent: AgentStream) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_CHUNK * 4)
    transport: asyncio.BaseTransport | None = None
    try:
        with contextlib.suppress(ValueError):  # a regular file cannot be a pipe transport: read it directly
            source = os.fdopen(0, "rb", buffering=0, closefd=False)
            transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), source)
        while True:
            chunk = await reader.read(_CHUNK) if transport else await asyncio.to_thread(os.read, 0, _CHUNK)
            if not chunk:
                break
            await agent.write(chunk)
        await agent.close_stdin()
    except OSError:  # no stdin at all
        with contextlib.suppress(LinkError):
            await agent.close_stdin()
    except LinkError:
        return  # the link is gone; the main loop reports it
    finally:
        if transport is not None:
            transport.close()


async def attach(options: AttachOptions, *, env: Mapping[str, str] | None = None) -> int:
    """Run the agent in the pod through the link; the agent's exit status."""
    host, port = parse_address(options.address)
    key = read_key(options.key_file)
    agent_env = own_environment() if env is None else dict(env)
    loop = asyncio.get_running_loop()
    async with JobPodLink.connect(
        host, port, key=key, pod=options.pod, job_uid=options.job_uid, timeout=options.timeout
    ) as link:
        agent = await link.start(options.argv, env=agent_env, cwd=options.cwd, egress_target=options.egress_target)
        pending: set[asyncio.Task[None]] = set()

        def forward(name: SignalName) -> None:
            task = asyncio.create_task(agent.signal(name))
            pending.add(task)
            task.add_done_callback(pending.discard)

        forwarded: tuple[tuple[signal.Signals, SignalName], ...] = ((signal.SIGTERM, "TERM"), (signal.SIGINT, "INT"))
        for sig, name in forwarded:
            loop.add_signal_handler(sig, functools.partial(forward, name))
        outputs = {"stdout": _Output(1), "stderr": _Output(2)}
        for output in outputs.values():
            await output.open()
        stdin = asyncio.create_task(_pump_stdin(agent))
        try:
            while True:
                item = await agent.read()
                if isinstance(item, Exit):
                    break
                await outputs[item.stream].write(item.data)
        finally:
            stdin.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stdin
            for output in outputs.values():
                await output.close()
        return item.status


def run_attach(options: AttachOptions) -> int:
    try:
        return asyncio.run(attach(options))
    except LinkError as exc:
        sys.stderr.write(f"helmhive-jobpod attach: {exc.reason}: {exc.message}\n")
        return LINK_FAILURE_EXIT

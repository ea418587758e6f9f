"""The runner's end of the job pod link: an authenticated connection to a job pod's shim.

::

    async with JobPodLink.connect(host, port, key=key, pod=pod, job_uid=uid, timeout=30) as link:
        await link.put_tree("workspace", tree)
        agent = await link.start(argv, env=env, cwd="/job/workspace")   # this connection is now the agent's stdio
    ...
    async with JobPodLink.connect(...) as link:                         # after EXIT: a new connection
        await link.get_tree("workspace", empty_dir)
        result = await link.run_check(spec)                             # result.to_evidence()
        await link.finish()

One connection carries one operation at a time. After :meth:`JobPodLink.start` it carries only
the agent's stdio (:class:`AgentStream`) and ends with its EXIT. Every expected failure is a
:class:`LinkError` with a reason name (``auth``, ``claimed``, ``running``, ``tree``, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Literal

from helmhive.api.governed import CHECK_OUTPUT_TAIL_MAX, CheckSpec
from helmhive.runner.jobpod import auth as link_auth
from helmhive.runner.jobpod.frames import (
    FATAL_REASONS,
    AuthOk,
    Check,
    CheckReport,
    Exit,
    Frame,
    FrameStream,
    FrameType,
    Hello,
    LinkError,
    LinkReason,
    Ok,
    PodState,
    SignalName,
    SignalRequest,
    Start,
    Started,
    TreePart,
    TreeRequest,
    decode,
    expect,
)
from helmhive.runner.jobpod.trees import TreeStats, receive_tree, send_tar, write_tar

__all__ = ["AgentStream", "Connecting", "JobPodLink", "LinkError", "Output", "TreeStats"]

_STDIN_CHUNK = 64 * 1024
_CHECK_SLACK_S = 15.0  # the shim's kill and drain after a check's timeout
_STREAM_LIMIT = 4 * 1024 * 1024


def _empty_dir(directory: Path) -> bool:
    """Make ``directory`` if need be; whether it is empty."""
    directory.mkdir(parents=True, exist_ok=True)
    return not any(directory.iterdir())


@dataclass(frozen=True, slots=True)
class Output:
    stream: Literal["stdout", "stderr"]
    data: bytes


class AgentStream:
    """The agent's stdio over the link, from START to EXIT."""

    def __init__(self, stream: FrameStream, *, pid: int | None, first: Frame | None) -> None:
        self._stream = stream
        self.pid = pid
        """The agent's pid in the job pod (None if it could not be started: EXIT follows)."""
        self._pending = first
        self.exit: Exit | None = None

    async def write(self, data: bytes) -> None:
        for offset in range(0, len(data), _STDIN_CHUNK):
            await self._stream.send(FrameType.STDIN, data[offset : offset + _STDIN_CHUNK])

    async def close_stdin(self) -> None:
        await self._stream.send(FrameType.STDIN_EOF)

    async def signal(self, name: SignalName) -> None:
        await self._stream.send(FrameType.SIGNAL, SignalRequest(signal=name))

    async def read(self) -> Output | Exit:
        """The agent's next output, or its :class:`Exit` (the last thing the stream carries)."""
        if self.exit is not None:
            return self.exit
        frame, self._pending = self._pending, None
        if frame is None:
            frame = await self._stream.read()
        frame = expect(frame, FrameType.STDOUT, FrameType.STDERR, FrameType.EXIT)
        if frame.type is FrameType.EXIT:
            self.exit = decode(frame, Exit)
            return self.exit
        return Output("stdout" if frame.type is FrameType.STDOUT else "stderr", frame.payload)

    async def wait(self) -> tuple[Exit, bytes, bytes]:
        """Read to the EXIT: (exit, all stdout, all stderr). For short runs and tests."""
        out, err = bytearray(), bytearray()
        while True:
            item = await self.read()
            if isinstance(item, Exit):
                return item, bytes(out), bytes(err)
            (out if item.stream == "stdout" else err).extend(item.data)


class Connecting:
    """``await JobPodLink.connect(...)`` or ``async with JobPodLink.connect(...) as link``."""

    def __init__(self, opening: Awaitable[JobPodLink]) -> None:
        self._opening = opening
        self._link: JobPodLink | None = None

    def __await__(self) -> Generator[object, None, JobPodLink]:
        return self._opening.__await__()

    async def __aenter__(self) -> JobPodLink:
        self._link = await self._opening
        return self._link

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._link is not None:
            await self._link.close()


class JobPodLink:
    def __init__(self, stream: FrameStream, *, hello: Hello, timeout: float) -> None:
        self._stream = stream
        self._hello = hello
        self._timeout = timeout
        self._agent: AgentStream | None = None

    @classmethod
    def connect(cls, host: str, port: int, *, key: bytes, pod: str, job_uid: str, timeout: float = 30.0) -> Connecting:
        """Connect and authenticate (both ways); ``timeout`` bounds the connect, the handshake and
        each wait for a frame of a tree transfer."""
        return Connecting(cls._open(host, port, key=key, pod=pod, job_uid=job_uid, seconds=timeout))

    @classmethod
    async def _open(cls, host: str, port: int, *, key: bytes, pod: str, job_uid: str, seconds: float) -> JobPodLink:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=_STREAM_LIMIT), seconds)
        except TimeoutError:
            raise LinkError(LinkReason.TIMEOUT, f"no connection to {host}:{port} in {seconds:g}s") from None
        except OSError as exc:
            raise LinkError(LinkReason.CONNECT, f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        stream = FrameStream(reader, writer)
        try:
            hello = decode(expect(await stream.read(seconds), FrameType.HELLO), Hello)
            request = link_auth.answer_hello(key=key, hello=hello, pod=pod, job_uid=job_uid)
            await stream.send(FrameType.AUTH, request)
            ok = decode(expect(await stream.read(seconds), FrameType.AUTH_OK), AuthOk)
            link_auth.verify_auth_ok(key=key, hello=hello, auth=request, ok=ok)
        except BaseException:
            await stream.close()
            raise
        return cls(stream, hello=hello, timeout=seconds)

    @property
    def pod_state(self) -> PodState:
        """The pod's state when this connection was made (from the shim's HELLO)."""
        return self._hello.state

    def _idle(self) -> FrameStream:
        if self._agent is not None:
            raise LinkError(LinkReason.STATE, "this connection carries the agent's stdio")
        return self._stream

    async def _reply(self, kind: FrameType, seconds: float | None) -> Frame:
        return expect(await self._stream.read(seconds), kind)

    # -- trees ----------------------------------------------------------------------------------
    async def put_tree(self, part: TreePart, directory: Path) -> TreeStats:
        """Send ``directory``'s contents to ``/job/<part>`` (before START). Returns what the shim wrote."""
        if not await asyncio.to_thread(directory.is_dir):
            raise LinkError(LinkReason.TREE, f"not a directory: {directory}")
        return await self._put(part, lambda fileobj: write_tar(fileobj, directory))

    async def put_tar(self, part: TreePart, tar: BinaryIO) -> TreeStats:
        """Send an already made tar stream (the shim extracts it as safely as any other)."""
        return await self._put(part, lambda fileobj: shutil.copyfileobj(tar, fileobj))

    async def _put(self, part: TreePart, produce: Callable[[BinaryIO], object]) -> TreeStats:
        stream = self._idle()
        await stream.send(FrameType.PUT_TREE, TreeRequest(part=part))
        try:
            await send_tar(stream, produce)
        except LinkError as exc:
            if exc.reason in FATAL_REASONS:
                raise
            with contextlib.suppress(LinkError):  # the shim answers our ERROR with its own
                await self._reply(FrameType.OK, self._timeout)
            raise
        ok = decode(await self._reply(FrameType.OK, self._timeout), Ok)
        return TreeStats(ok.files, ok.bytes)

    async def get_tree(self, part: TreePart, directory: Path) -> TreeStats:
        """Extract the pod's ``/job/<part>`` (its copy, after the agent exited) into an empty ``directory``."""
        stream = self._idle()
        if not await asyncio.to_thread(_empty_dir, directory):
            raise LinkError(LinkReason.NOT_EMPTY, f"{directory} is not empty")
        await stream.send(FrameType.GET_TREE, TreeRequest(part=part))
        return await receive_tree(stream, directory, seconds=self._timeout)

    # -- checks and the end ---------------------------------------------------------------------
    async def run_check(self, spec: CheckSpec, *, output_tail_chars: int = CHECK_OUTPUT_TAIL_MAX) -> CheckReport:
        """Run one check in the pod's copy of the workspace (after the agent exited)."""
        stream = self._idle()
        request = Check(
            name=spec.name,
            command=list(spec.command),
            timeout_seconds=spec.timeout_seconds,
            output_tail_chars=output_tail_chars,
        )
        await stream.send(FrameType.CHECK, request)
        wait = spec.timeout_seconds + _CHECK_SLACK_S + self._timeout
        return decode(await self._reply(FrameType.CHECK_RESULT, wait), CheckReport)

    async def finish(self) -> None:
        """Tell the shim to kill anything left, close and exit (the pod completes)."""
        stream = self._idle()
        await stream.send(FrameType.FINISH)
        await self._reply(FrameType.OK, self._timeout)
        await self.close()

    # -- the agent ------------------------------------------------------------------------------
    async def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        egress_target: str | None = None,
        start_timeout: float = 180.0,
    ) -> AgentStream:
        """Start the pod's agent (once per pod); from now on this connection is its stdio."""
        stream = self._idle()
        request = Start(argv=list(argv), env=dict(env), cwd=cwd, egress_target=egress_target)
        await stream.send(FrameType.START, request)
        first = expect(
            await stream.read(start_timeout), FrameType.STARTED, FrameType.STDOUT, FrameType.STDERR, FrameType.EXIT
        )
        if first.type is FrameType.STARTED:
            self._agent = AgentStream(stream, pid=decode(first, Started).pid, first=None)
        else:  # it could not be started: its stderr and EXIT follow
            self._agent = AgentStream(stream, pid=None, first=first)
        return self._agent

    async def close(self) -> None:
        await self._stream.close()

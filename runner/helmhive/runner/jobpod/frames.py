"""The job pod link's framing: frame types, their payloads, and reading and writing frames.

Every frame is a header ``struct('!BI')`` (type u8, payload length u32) and then its payload, at
most :data:`MAX_PAYLOAD` bytes. Control frames carry one JSON object (the pydantic model of
:data:`CONTROL_MODELS`, camelCase on the wire, unknown fields refused); ``DATA`` and the stdio
frames carry bytes; ``END``, ``STDIN_EOF`` and ``FINISH`` carry nothing. The same framing runs
over the runner's TCP link to the shim and over the shim's UNIX socket to the launcher.

Everything that goes wrong is a :class:`LinkError` with a reason name (:class:`LinkReason`, or
the reason of the peer's ``ERROR`` frame). A framing error (oversize, unknown type, EOF inside a
frame) leaves the stream out of step: the connection must be closed after it.

Pure but for :class:`FrameStream`, which wraps an asyncio stream pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import struct
from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic.alias_generators import to_camel

from helmhive.api.governed import CHECK_OUTPUT_TAIL_MAX, CheckEvidence, CheckOutcome

__all__ = [
    "CONTROL_MODELS",
    "FATAL_REASONS",
    "HEADER",
    "MAX_PAYLOAD",
    "PROTOCOL_VERSION",
    "Auth",
    "AuthOk",
    "Check",
    "CheckReport",
    "ErrorPayload",
    "Exit",
    "Frame",
    "FrameStream",
    "FrameType",
    "Hello",
    "LinkError",
    "LinkReason",
    "Ok",
    "PodState",
    "SignalName",
    "SignalRequest",
    "Start",
    "Started",
    "TreePart",
    "TreeRequest",
    "decode",
    "encode_frame",
    "expect",
    "read_frame",
]

PROTOCOL_VERSION = 1
HEADER = struct.Struct("!BI")
MAX_PAYLOAD = 1024 * 1024

PodState = Literal["idle", "claimed", "running", "done"]
TreePart = Literal["workspace", "home"]
SignalName = Literal["TERM", "KILL", "INT"]

_Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32,128}$")]
_Mac = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
_ADDRESS_PATTERN = r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}$"
_Address = Annotated[str, StringConstraints(pattern=_ADDRESS_PATTERN, max_length=300)]


class FrameType(enum.IntEnum):
    HELLO = 1
    AUTH = 2
    AUTH_OK = 3
    ERROR = 4
    OK = 5
    PUT_TREE = 16
    GET_TREE = 17
    DATA = 18
    END = 19
    START = 32
    STARTED = 33
    STDIN = 34
    STDIN_EOF = 35
    SIGNAL = 36
    STDOUT = 37
    STDERR = 38
    EXIT = 39
    CHECK = 48
    CHECK_RESULT = 49
    FINISH = 64


BYTES_FRAMES = frozenset({FrameType.DATA, FrameType.STDIN, FrameType.STDOUT, FrameType.STDERR})
EMPTY_FRAMES = frozenset({FrameType.END, FrameType.STDIN_EOF, FrameType.FINISH})


class LinkReason(enum.StrEnum):
    """Why a link operation failed. A peer's ``ERROR`` frame may name one of these or its own."""

    CONNECT = "connect"
    TIMEOUT = "timeout"
    CLOSED = "closed"  # the peer closed the connection between frames
    EOF = "eof"  # ... or inside one
    OVERSIZE = "oversize"
    UNKNOWN_TYPE = "unknown-type"
    BAD_FRAME = "bad-frame"
    BAD_PAYLOAD = "bad-payload"
    UNEXPECTED = "unexpected"  # a well-formed frame this side does not accept here
    VERSION = "version"
    POD = "pod-mismatch"
    AUTH = "auth"
    CLAIMED = "claimed"
    STATE = "state"  # not in this state of the pod (a tree put after START, a second operation on a stdio link)
    STARTED = "started"  # a second START
    RUNNING = "running"  # the agent has not exited (GET_TREE, CHECK)
    LAUNCHER = "launcher"
    EGRESS = "egress"
    TREE = "tree"  # a refused or unreadable tree
    NOT_EMPTY = "not-empty"
    KEY = "key"


FATAL_REASONS = frozenset(
    {
        LinkReason.CLOSED,
        LinkReason.EOF,
        LinkReason.TIMEOUT,
        LinkReason.OVERSIZE,
        LinkReason.UNKNOWN_TYPE,
        LinkReason.BAD_FRAME,
    }
)
"""Reasons after which the connection is out of step (or gone): it must be closed."""


class LinkError(Exception):
    """An expected failure of the link, named by ``reason``; ``message`` never holds payload data."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        self.message = message


class WireModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Hello(WireModel):
    nonce: _Hex
    pod: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    state: PodState
    protocol: int


class Auth(WireModel):
    nonce: _Hex
    mac: _Mac
    job_uid: Annotated[str, StringConstraints(min_length=1, max_length=128)]


class AuthOk(WireModel):
    mac: _Mac


class ErrorPayload(WireModel):
    reason: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    message: Annotated[str, StringConstraints(max_length=1000)] = ""


class Ok(WireModel):
    files: Annotated[int, Field(ge=0)] = 0
    bytes: Annotated[int, Field(ge=0)] = 0


class TreeRequest(WireModel):
    part: TreePart


class Start(WireModel):
    argv: Annotated[list[str], Field(min_length=1)]
    env: dict[str, str]
    cwd: Annotated[str, StringConstraints(min_length=1)]
    egress_target: _Address | None = None


class Started(WireModel):
    pid: int


class SignalRequest(WireModel):
    signal: SignalName


class Exit(WireModel):
    """How the agent ended: ``code`` if it exited, ``signal`` (a number) if a signal killed it."""

    code: int | None = None
    signal: int | None = None

    @property
    def status(self) -> int:
        """As a shell reports it: the code, or 128 + the signal."""
        if self.code is not None:
            return self.code
        return 128 + (self.signal or 0)


class Check(WireModel):
    name: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    command: Annotated[list[Annotated[str, StringConstraints(min_length=1)]], Field(min_length=1, max_length=32)]
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = 300
    output_tail_chars: Annotated[int, Field(ge=0, le=CHECK_OUTPUT_TAIL_MAX)] = CHECK_OUTPUT_TAIL_MAX


class CheckReport(WireModel):
    """A check's result; :meth:`to_evidence` is the runner's :class:`CheckEvidence` for it, field for field.

    ``notRun`` names why the command did not run (then the output describes that, as in-runner
    checks do, and ``exitCode`` is the sandbox launcher's, or null if nothing was started)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    exit_code: int | None = None
    duration_ms: Annotated[int, Field(ge=0)] = 0
    timed_out: bool = False
    output_tail: str = ""
    output_bytes: Annotated[int, Field(ge=0)] = 0
    output_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    not_run: str | None = None

    def to_evidence(self) -> CheckEvidence:
        if self.not_run is not None:
            outcome = CheckOutcome.NOT_RUN
        elif self.timed_out:
            outcome = CheckOutcome.TIMED_OUT
        else:
            outcome = CheckOutcome.PASSED if self.exit_code == 0 else CheckOutcome.FAILED
        return CheckEvidence(
            name=self.name,
            outcome=outcome,
            exit_code=None if self.timed_out else self.exit_code,
            duration_seconds=self.duration_ms / 1000,
            output_tail=self.output_tail[-CHECK_OUTPUT_TAIL_MAX:] if self.output_tail else "",
            output_bytes=self.output_bytes,
            output_sha256=self.output_sha256,
        )


CONTROL_MODELS: dict[FrameType, type[WireModel]] = {
    FrameType.HELLO: Hello,
    FrameType.AUTH: Auth,
    FrameType.AUTH_OK: AuthOk,
    FrameType.ERROR: ErrorPayload,
    FrameType.OK: Ok,
    FrameType.PUT_TREE: TreeRequest,
    FrameType.GET_TREE: TreeRequest,
    FrameType.START: Start,
    FrameType.STARTED: Started,
    FrameType.SIGNAL: SignalRequest,
    FrameType.EXIT: Exit,
    FrameType.CHECK: Check,
    FrameType.CHECK_RESULT: CheckReport,
}

M = TypeVar("M", bound=WireModel)


@dataclass(frozen=True, slots=True)
class Frame:
    type: FrameType
    payload: bytes = b""


def encode_frame(kind: FrameType, payload: bytes | WireModel | None = None) -> bytes:
    """Header and payload, checked against the frame type's payload kind and the size limit."""
    if isinstance(payload, WireModel):
        if CONTROL_MODELS.get(kind) is not type(payload):
            raise LinkError(LinkReason.BAD_FRAME, f"{kind.name} does not carry a {type(payload).__name__}")
        try:
            body = payload.model_dump_json(by_alias=True).encode()
        except (ValueError, UnicodeEncodeError):
            raise LinkError(LinkReason.BAD_PAYLOAD, f"{kind.name} holds text that is not valid UTF-8") from None
    else:
        body = payload or b""
        if kind in CONTROL_MODELS or (body and kind in EMPTY_FRAMES):
            raise LinkError(LinkReason.BAD_FRAME, f"{kind.name} cannot carry raw bytes")
    if len(body) > MAX_PAYLOAD:
        raise LinkError(LinkReason.OVERSIZE, f"a {kind.name} payload of {len(body)} bytes (the limit is {MAX_PAYLOAD})")
    return HEADER.pack(int(kind), len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    """The next frame; :class:`LinkError` on EOF, an oversize or unknown frame, or a malformed empty one."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise LinkError(LinkReason.CLOSED, "the peer closed the connection") from None
        raise LinkError(LinkReason.EOF, "the connection ended inside a frame header") from None
    except ConnectionError:
        raise LinkError(LinkReason.CLOSED, "the connection was reset") from None
    code, length = HEADER.unpack(header)
    try:
        kind = FrameType(code)
    except ValueError:
        raise LinkError(LinkReason.UNKNOWN_TYPE, f"unknown frame type {code}") from None
    if length > MAX_PAYLOAD:
        raise LinkError(LinkReason.OVERSIZE, f"a {kind.name} frame of {length} bytes (the limit is {MAX_PAYLOAD})")
    if length and kind in EMPTY_FRAMES:
        raise LinkError(LinkReason.BAD_FRAME, f"{kind.name} must carry no payload")
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise LinkError(LinkReason.EOF, f"the connection ended inside a {kind.name} frame") from None
    except ConnectionError:
        raise LinkError(LinkReason.CLOSED, "the connection was reset") from None
    return Frame(kind, payload)


def decode(frame: Frame, model: type[M]) -> M:
    """The frame's JSON payload as ``model``; the error names fields, never their values."""
    if CONTROL_MODELS.get(frame.type) is not model:
        raise LinkError(LinkReason.UNEXPECTED, f"expected a {model.__name__}, got {frame.type.name}")
    try:
        return model.model_validate_json(frame.payload)
    except ValidationError as exc:
        where = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'payload'}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False, include_context=False)[:5]
        )
        raise LinkError(LinkReason.BAD_PAYLOAD, f"{frame.type.name}: {where}"[:500]) from None


def expect(frame: Frame, *kinds: FrameType) -> Frame:
    """``frame`` if it is one of ``kinds``; the peer's ``ERROR`` raised as a :class:`LinkError`."""
    if frame.type is FrameType.ERROR and FrameType.ERROR not in kinds:
        error = decode(frame, ErrorPayload)
        raise LinkError(error.reason, error.message)
    if frame.type not in kinds:
        names = " or ".join(k.name for k in kinds)
        raise LinkError(LinkReason.UNEXPECTED, f"expected {names}, got {frame.type.name}")
    return frame


class FrameStream:
    """One connection: frames in, frames out. Sends are serialised, so tasks may share it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._send_lock = asyncio.Lock()

    async def read(self, seconds: float | None = None) -> Frame:
        """The next frame, waiting at most ``seconds`` for it (None: as long as it takes)."""
        if seconds is None:
            return await read_frame(self.reader)
        try:
            return await asyncio.wait_for(read_frame(self.reader), seconds)
        except TimeoutError:
            raise LinkError(LinkReason.TIMEOUT, f"no frame from the peer in {seconds:g}s") from None

    async def send(self, kind: FrameType, payload: bytes | WireModel | None = None) -> None:
        await self._write(encode_frame(kind, payload))

    async def forward(self, frame: Frame) -> None:
        """Pass on a frame read from another stream (its size was checked when it was read)."""
        await self._write(HEADER.pack(int(frame.type), len(frame.payload)) + frame.payload)

    async def _write(self, data: bytes) -> None:
        async with self._send_lock:
            try:
                self.writer.write(data)  # one write per frame: frames never interleave
                await self.writer.drain()
            except (ConnectionError, RuntimeError) as exc:  # RuntimeError: the transport is closing
                raise LinkError(LinkReason.CLOSED, "the connection is closed") from exc

    async def send_error(self, reason: str, message: str = "") -> None:
        """Best effort: the peer may be gone already."""
        with contextlib.suppress(LinkError):
            await self.send(FrameType.ERROR, ErrorPayload(reason=reason[:64], message=message[:1000]))

    def peer(self) -> str:
        name = self.writer.get_extra_info("peername")
        if isinstance(name, tuple) and len(name) >= 2:
            return f"{name[0]}:{name[1]}"
        return "local"

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            await self.writer.wait_closed()

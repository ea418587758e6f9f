"""``helmhive-jobpod shim``: the trusted end of a job pod, serving the runner's authenticated link.

It creates the launcher's UNIX socket at start, accepts exactly one launcher connection and
unlinks the path (so nothing the agent starts later can connect), and listens on the link port.
Each connection is authenticated (:mod:`helmhive.runner.jobpod.auth`) and then carries operations:

``PUT_TREE``   before START only: a tar stream extracted safely into ``/job/<part>``.
``START``      once per pod: the egress relay (if asked), then START to the launcher; the connection
               then carries the agent's stdio and ends with its EXIT. If it drops before EXIT, the
               agent is killed: nothing runs on without its runner.
``GET_TREE``   after the agent exited: ``/job/<part>`` copied once into the shim's private directory,
               then that copy streamed back. Checks run in the same copy, so the tree handed back
               and the tree checked are the same bytes (get the tree before running checks: a check
               may write into the copy).
``CHECK``      after the agent exited: one check in the copy (:mod:`helmhive.runner.jobpod.checks`).
``FINISH``     kill the agent if it still runs, close everything, exit 0 (the pod completes).

Logs name operations, reasons and sizes, never the key, environment values or stdio bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from helmhive.runner.jobpod.auth import judge_auth, new_nonce
from helmhive.runner.jobpod.checks import run_check
from helmhive.runner.jobpod.frames import (
    FATAL_REASONS,
    PROTOCOL_VERSION,
    Auth,
    Check,
    Exit,
    Frame,
    FrameStream,
    FrameType,
    Hello,
    LinkError,
    LinkReason,
    Ok,
    PodState,
    SignalRequest,
    Start,
    TreeRequest,
    decode,
    expect,
)
from helmhive.runner.jobpod.relay import EgressRelay
from helmhive.runner.jobpod.trees import discard_tree, receive_tree, send_tar, snapshot_tree, write_tar
from helmhive.runner.sandbox.landlock import landlock_abi

__all__ = ["Shim", "ShimConfig"]

log = logging.getLogger(__name__)

_KILL_WAIT_S = 10.0
PARTS = ("workspace", "home")


@dataclass(frozen=True, kw_only=True)
class ShimConfig:
    pod: str
    key: bytes
    key_path: Path
    host: str | None
    port: int
    egress_port: int
    socket_path: Path
    job_root: Path
    shim_dir: Path
    auth_timeout: float = 30.0
    launcher_timeout: float = 120.0
    io_timeout: float = 300.0
    """The longest wait for the next frame of a tree being put."""


class Shim:
    def __init__(self, config: ShimConfig, *, landlock_abi: int) -> None:
        self.config = config
        self.landlock_abi = landlock_abi
        self.claimed_by: str | None = None
        self.start_taken = False
        self.launcher: FrameStream | None = None
        self.launcher_ready = asyncio.Event()
        self.launcher_lost = False
        self.stdio: FrameStream | None = None
        self.exited = asyncio.Event()
        self.relay: EgressRelay | None = None
        self.finished = asyncio.Event()
        self.exit_status = 0
        self.tree_lock = asyncio.Lock()
        self.snapshots: set[str] = set()
        self._unix_server: asyncio.Server | None = None

    @property
    def state(self) -> PodState:
        if self.exited.is_set():
            return "done"
        if self.start_taken:
            return "running"
        return "claimed" if self.claimed_by is not None else "idle"

    # -- life --------------------------------------------------------------------------------
    async def run(self) -> int:
        c = self.config
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        for part in PARTS:  # mount points in a pod; directories when run as a local process
            (c.job_root / part).mkdir(parents=True, exist_ok=True)
        # The agent's tmp is mounted in its container only: on the shim's read-only root there is
        # no creating it, and no need (a local run makes it for the launcher).
        with contextlib.suppress(OSError):
            (c.job_root / "tmp").mkdir(parents=True, exist_ok=True)
        c.shim_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            c.socket_path.unlink()  # a stale socket of an earlier start
        self._unix_server = await asyncio.start_unix_server(self._on_launcher, path=str(c.socket_path))
        server = await asyncio.start_server(self._on_client, c.host, c.port)
        log.info("shim of pod %s listening on port %d", c.pod, c.port)
        try:
            await self.finished.wait()
        finally:
            server.close()
            await self._shutdown()
        log.info("shim exiting (%d)", self.exit_status)
        return self.exit_status

    def _on_signal(self, sig: int) -> None:
        log.warning("signal %d: stopping", sig)
        self.exit_status = 128 + sig
        self.finished.set()

    async def _shutdown(self) -> None:
        await self._kill_agent("the shim is stopping")
        if self.start_taken and not self.exited.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exited.wait(), _KILL_WAIT_S)
        await self._close_relay()
        if self._unix_server is not None:
            self._unix_server.close()
        with contextlib.suppress(FileNotFoundError):
            self.config.socket_path.unlink()
        if self.launcher is not None:
            await self.launcher.close()  # the launcher sees EOF and exits

    async def _close_relay(self) -> None:
        relay, self.relay = self.relay, None
        if relay is not None:
            await relay.close()

    async def _kill_agent(self, why: str) -> None:
        if self.launcher is None or not self.start_taken or self.exited.is_set():
            return
        log.warning("killing the agent: %s", why)
        with contextlib.suppress(LinkError):
            await self.launcher.send(FrameType.SIGNAL, SignalRequest(signal="KILL"))

    # -- the launcher ------------------------------------------------------------------------
    async def _on_launcher(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = FrameStream(reader, writer)
        if self.launcher is not None:
            await conn.close()
            return
        self.launcher = conn
        if self._unix_server is not None:
            self._unix_server.close()  # exactly one launcher: nothing started later can connect
        with contextlib.suppress(FileNotFoundError):
            self.config.socket_path.unlink()
        self.launcher_ready.set()
        log.info("launcher connected")
        try:
            while True:
                frame = await conn.read()
                if frame.type is FrameType.EXIT:
                    ended = decode(frame, Exit)
                    log.info("the agent exited (code %s, signal %s)", ended.code, ended.signal)
                    await self._to_client(frame)
                    await self._agent_ended()
                    return
                if frame.type in (FrameType.STARTED, FrameType.STDOUT, FrameType.STDERR):
                    await self._to_client(frame)
                else:
                    log.warning("unexpected %s from the launcher", frame.type.name)
        except LinkError as exc:
            if self.exited.is_set():
                return
            log.warning("lost the launcher before the agent exited (%s)", exc.reason)
            self.launcher_lost = True
            if self.stdio is not None:
                await self.stdio.send_error(LinkReason.LAUNCHER, "the launcher went away before the agent exited")
            if self.start_taken:
                await self._agent_ended()  # the launcher is the agent container's PID 1: the agent is gone

    async def _to_client(self, frame: Frame) -> None:
        conn = self.stdio
        if conn is None:
            return
        try:
            await conn.forward(frame)
        except LinkError:
            self.stdio = None
            await self._kill_agent("the runner's link dropped")

    async def _agent_ended(self) -> None:
        self.exited.set()
        await self._close_relay()  # nothing gets out through the relay once the agent is gone

    # -- the runner's connections --------------------------------------------------------------
    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = FrameStream(reader, writer)
        peer = conn.peer()
        try:
            job_uid = await self._handshake(conn, peer)
            if job_uid is not None:
                await self._serve(conn)
        except LinkError as exc:
            if exc.reason not in (LinkReason.CLOSED, LinkReason.EOF):
                await conn.send_error(exc.reason, exc.message)
            log.info("connection from %s ended: %s", peer, exc.reason)
        finally:
            await conn.close()

    async def _handshake(self, conn: FrameStream, peer: str) -> str | None:
        c = self.config
        hello = Hello(nonce=new_nonce(), pod=c.pod, state=self.state, protocol=PROTOCOL_VERSION)
        await conn.send(FrameType.HELLO, hello)
        try:
            auth = decode(expect(await conn.read(c.auth_timeout), FrameType.AUTH), Auth)
        except LinkError as exc:
            log.warning("unauthenticated connection from %s: %s", peer, exc.reason)
            await conn.send_error(LinkReason.AUTH, "authentication failed")
            return None
        verdict = judge_auth(key=c.key, hello=hello, auth=auth, claimed_by=self.claimed_by)
        if verdict.error is not None or verdict.ok is None or verdict.job_uid is None:
            reason = verdict.error.reason if verdict.error else LinkReason.AUTH
            log.warning("refused a connection from %s: %s", peer, reason)
            await conn.send_error(reason, verdict.error.message if verdict.error else "")
            return None
        if self.claimed_by is None:  # no await since the verdict: the first to get here claims the pod
            self.claimed_by = verdict.job_uid
            log.info("pod claimed by job %s", verdict.job_uid)
        await conn.send(FrameType.AUTH_OK, verdict.ok)
        return verdict.job_uid

    async def _serve(self, conn: FrameStream) -> None:
        while True:
            try:
                frame = await conn.read()
            except LinkError as exc:
                if exc.reason == LinkReason.CLOSED:
                    return
                raise
            try:
                if frame.type is FrameType.PUT_TREE:
                    await self._put_tree(conn, decode(frame, TreeRequest))
                elif frame.type is FrameType.GET_TREE:
                    await self._get_tree(conn, decode(frame, TreeRequest))
                elif frame.type is FrameType.CHECK:
                    await self._check(conn, decode(frame, Check))
                elif frame.type is FrameType.START:
                    if await self._start(conn, decode(frame, Start)):
                        return  # the connection carried the agent's stdio; it ends with EXIT
                elif frame.type is FrameType.FINISH:
                    await self._finish(conn)
                    return
                else:
                    raise LinkError(LinkReason.UNEXPECTED, f"{frame.type.name} is not an operation")
            except LinkError as exc:
                if exc.reason in FATAL_REASONS or exc.reason == LinkReason.UNEXPECTED:
                    raise
                await conn.send_error(exc.reason, exc.message)

    async def _put_tree(self, conn: FrameStream, request: TreeRequest) -> None:
        async with self.tree_lock:
            dest = self.config.job_root / request.part
            if self.start_taken:
                await discard_tree(conn, seconds=self.config.io_timeout)
                raise LinkError(LinkReason.STATE, "trees are put before the agent starts")
            try:
                stats = await receive_tree(conn, dest, seconds=self.config.io_timeout)
            except LinkError as exc:
                log.warning("refused the %s tree: %s", request.part, exc.reason)
                raise
        log.info("put the %s tree: %d files, %d bytes", request.part, stats.files, stats.bytes)
        await conn.send(FrameType.OK, Ok(files=stats.files, bytes=stats.bytes))

    def _require_exited(self) -> None:
        if not self.exited.is_set():
            why = "the agent has not exited" if self.start_taken else "the agent was never started"
            raise LinkError(LinkReason.RUNNING, why)

    async def _copy(self, part: str) -> Path:
        copy = self.config.shim_dir / "copy" / part
        if part not in self.snapshots:
            await asyncio.to_thread(snapshot_tree, self.config.job_root / part, copy)
            self.snapshots.add(part)
            log.info("copied the %s tree into the shim's directory", part)
        return copy

    async def _get_tree(self, conn: FrameStream, request: TreeRequest) -> None:
        self._require_exited()
        async with self.tree_lock:
            copy = await self._copy(request.part)
            try:
                await send_tar(conn, lambda fileobj: write_tar(fileobj, copy))
            except LinkError as exc:
                if exc.reason in FATAL_REASONS:
                    raise
                log.warning("could not hand back the %s tree: %s", request.part, exc.reason)
                return  # send_tar ended the stream with the ERROR
        log.info("handed back the %s tree", request.part)

    async def _check(self, conn: FrameStream, request: Check) -> None:
        self._require_exited()
        c = self.config
        async with self.tree_lock:
            workdir = await self._copy("workspace")
            result = await run_check(
                request,
                workdir=workdir,
                tmpdir=c.shim_dir / "tmp",
                excluded=[str(c.key_path.parent), str(c.shim_dir)],
                landlock_abi=self.landlock_abi,
            )
        outcome = result.to_evidence().outcome.value
        log.info("check %s: %s (exit %s, %d ms)", request.name, outcome, result.exit_code, result.duration_ms)
        await conn.send(FrameType.CHECK_RESULT, result)

    async def _start(self, conn: FrameStream, request: Start) -> bool:
        async with self.tree_lock:  # not while a tree is being put
            if self.start_taken:
                raise LinkError(LinkReason.STARTED, "the agent of this pod was already started")
            if self.launcher_lost:
                raise LinkError(LinkReason.LAUNCHER, "the launcher went away")
            self.start_taken = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.launcher_ready.wait(), self.config.launcher_timeout)
        launcher = self.launcher
        if launcher is None or self.launcher_lost:
            self.start_taken = False
            raise LinkError(LinkReason.LAUNCHER, "the launcher is not connected")
        if request.egress_target is not None:
            relay = EgressRelay(port=self.config.egress_port, target=request.egress_target)
            try:
                await relay.start()
            except (OSError, ValueError) as exc:
                self.start_taken = False
                raise LinkError(LinkReason.EGRESS, f"cannot start the egress relay: {exc}") from None
            self.relay = relay
        self.stdio = conn
        log.info("starting the agent (%d arguments, %d environment variables)", len(request.argv), len(request.env))
        try:
            await launcher.send(FrameType.START, request)
        except LinkError:
            await conn.send_error(LinkReason.LAUNCHER, "the launcher went away")
            return True
        await self._pump_input(conn)
        return True

    async def _pump_input(self, conn: FrameStream) -> None:
        """The runner's stdin and signals to the launcher, until EXIT has been sent or the link drops."""
        assert self.launcher is not None
        exited = asyncio.create_task(self.exited.wait())
        try:
            while not self.exited.is_set():
                reading = asyncio.create_task(conn.read())
                await asyncio.wait({reading, exited}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    reading.cancel()
                    return
                try:
                    frame = reading.result()
                except LinkError as exc:
                    if self.stdio is conn:
                        self.stdio = None
                        await self._kill_agent(f"the runner's link dropped before the agent exited ({exc.reason})")
                    return
                if frame.type in (FrameType.STDIN, FrameType.STDIN_EOF):
                    with contextlib.suppress(LinkError):
                        await self.launcher.forward(frame)
                elif frame.type is FrameType.SIGNAL:
                    try:
                        request = decode(frame, SignalRequest)
                    except LinkError as exc:
                        await conn.send_error(exc.reason, exc.message)
                        continue
                    log.info("signal %s to the agent", request.signal)
                    with contextlib.suppress(LinkError):
                        await self.launcher.send(FrameType.SIGNAL, request)
                else:
                    await conn.send_error(LinkReason.STATE, "this connection carries the agent's stdio")
        finally:
            exited.cancel()

    async def _finish(self, conn: FrameStream) -> None:
        log.info("finish")
        await self._kill_agent("the runner finished the pod")
        if self.start_taken and not self.exited.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exited.wait(), _KILL_WAIT_S)
        await conn.send(FrameType.OK, Ok())
        self.finished.set()


def run_shim(config: ShimConfig) -> int:
    abi = landlock_abi()
    if abi < 4:
        log.warning("Landlock ABI %d: checks cannot run without the network here; every check will be notRun", abi)
    return asyncio.run(Shim(config, landlock_abi=abi).run())

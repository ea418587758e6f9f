"""The shim's egress relay: the agent's provider base URL on the pod's loopback, relayed to the runner's proxy.

While the agent runs, the shim listens on ``127.0.0.1:<egress port>`` and forwards every
connection byte for byte to the target the runner named in START (its proxy, which checks the
phantom key and the pod's address). The relay never looks at the bytes and never logs them. It is
closed when the agent exits, so a check (or anything left behind) has no way out through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

__all__ = ["EgressRelay", "parse_address"]

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S = 15.0
_CHUNK = 64 * 1024


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as (host, port); ValueError if it is neither."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


class EgressRelay:
    def __init__(self, *, port: int, target: str) -> None:
        self._port = port
        self._target = parse_address(target)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[object]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._port)
        log.info("egress relay listening on 127.0.0.1:%d", self._port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._relay(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self._target
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, port), _CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            log.warning("egress relay: cannot reach the runner's proxy: %s", getattr(exc, "strerror", None) or exc)
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(OSError, ConnectionError):
                    await w.wait_closed()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            log.info("egress relay closed")
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One direction, then a half close, so the other direction may still finish."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()

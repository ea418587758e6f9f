"""A watch stream through the operator's ``Kube`` door: one streaming GET, its events as dicts.

Owns :class:`WatchStream`: a ``?watch=1`` request on the same connection pool, TLS and
credentials as every other call (:meth:`helmhive.controller.kube.jsonapi.JsonKube.request`), read in a
thread of its own (the stream holds it for minutes; the API threads stay free for routing),
split into lines and decoded there, and handed to the event loop. The stream ends when the
server closes it (its ``timeoutSeconds``), and raises the error tree of
:mod:`helmhive.api.kubeerrors` when the request is refused or the connection drops
(``Unavailable``), so callers never see urllib3 or socket errors. Closing it shuts the
connection down, which ends the thread's blocking read.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlencode

import orjson
import urllib3

from helmhive.api.kubeerrors import KubeError, build_kube_error
from helmhive.controller.kube.door import Kube
from helmhive.kubeclient import NETWORK_ERRORS, translate_api_error

__all__ = ["WatchStream"]

_CHUNK = 65536
_END = object()


class WatchStream:
    """One watch request (see the module docstring); iterate it once with ``async for``, then :meth:`close`."""

    def __init__(
        self,
        kube: Kube,
        path: str,
        params: Mapping[str, Any],
        *,
        read_timeout: float,
        connect_timeout: float = 10.0,
    ) -> None:
        self.kube = kube
        self.url = f"{path}?{urlencode({**params, 'watch': 'true'})}"
        self.timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._response: Any = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._events()

    async def _events(self) -> AsyncIterator[dict[str, Any]]:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._pump, name="agentjob watch", daemon=True)
        self._thread.start()
        try:
            while True:
                item = await self._queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop reading: shut the connection down so the thread's blocking read returns.

        The connection never goes back to the pool (a shut-down socket must not be reused by
        another request); the pool opens a new one when it needs it.
        """
        self._closed.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    # The thread -------------------------------------------------------------------------------
    def _put(self, item: Any) -> None:
        if self._loop is not None and not self._closed.is_set():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens any more
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _pump(self) -> None:
        try:
            try:
                self._read()
            finally:
                if self._response is not None:
                    with contextlib.suppress(Exception):
                        self._response.close()  # closes its connection: see close()
        except KubeError as exc:
            self._put(exc)
        except NETWORK_ERRORS as exc:
            self._put(translate_api_error(exc))
        except Exception as exc:  # a line that is not JSON: the stream is broken, reconnect
            self._put(translate_api_error(OSError(f"unreadable watch stream: {exc}")))
        else:
            self._put(_END)

    def _read(self) -> None:
        # No urllib3 retries: the watch reconnects with its own backoff and one warning per outage.
        response = self.kube.request("GET", self.url, preload_content=False, timeout=self.timeout, retries=False)
        self._response = response
        if self._closed.is_set():
            self.close()
            return
        if not 200 <= response.status <= 299:
            data = response.read()
            raise build_kube_error(response.status, data, response.reason)
        rest = b""
        for chunk in response.stream(_CHUNK):
            if self._closed.is_set():
                return
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if line.strip():
                    self._put(orjson.loads(line))  # a few times faster than json: every job event is decoded here
        if rest.strip():
            self._put(orjson.loads(rest))

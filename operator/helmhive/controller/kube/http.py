"""The operator's JSON requests sent on its event loop: one aiohttp session per door and loop.

Owns :class:`LoopHttp`. The operator's plain JSON requests (every AgentJob read and write, the
audit records, Events; :class:`helmhive.controller.kube.jsonapi.JsonKube`) used to run one by one in
worker threads on urllib3. Measured against a real API server (2026-12-04, ten in flight, 3,000
GETs of one AgentJob, three rounds), that cost the client 0.71 to 1.05 ms of CPU per request, and
the same requests sent on the event loop through aiohttp 0.33 to 0.42 ms: the thread hand-offs and
the GIL's contention between the threads and the loop were most of it. (httpx, sent the same way,
cost 3.1 to 3.7 ms.) aiohttp is the HTTP client Kopf itself is built on.

What it takes from the kubernetes client's ``Configuration``, so both paths reach the same server
as the same identity:

- the server (``host``, with any path prefix), its CA (``ssl_ca_cert``), ``verify_ssl``,
  ``assert_hostname`` and ``tls_server_name``, and a client certificate (``cert_file``,
  ``key_file``);
- the credentials, read per request from ``auth_settings()`` as the generated client reads them. A
  read that would run the refresh hook (:func:`helmhive.kubeclient.credential_refresh_due`: at most
  once a second, and it may read a file or start a credential plugin) runs in a thread, so the loop
  never blocks on it;
- ``connection_pool_maxsize`` connections at most;
- the door's ``request_timeout`` (connect, read) when it has one; else a connection must be made
  within 30 s, and a read waits as long as the generated client's does (no limit).

A client configured with a proxy, or with ``assert_hostname`` naming another host, is not sent here
(the caller keeps the threaded path: :func:`decide_loop_capable`). No answer (a refused or reset
connection, a timeout) raises ``Unavailable``. A connection that could not be made is tried at most
twice more, for any method (nothing was sent); a reused connection the server dropped, only for a
GET (:func:`decide_resend`). Redirects are not followed: a 3xx is an answer, as on the threaded path.
Responses are asked for uncompressed, as the generated client asks for them (on loopback,
compressing a LIST page costs both ends CPU and saves nothing).

A session belongs to the loop it was made on: a call from another loop (each ``asyncio.run``)
makes a new one. :meth:`LoopHttp.close` closes the current loop's.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yarl

from helmhive.api.kubeerrors import build_unavailable
from helmhive.kubeclient import credential_refresh_due

__all__ = ["HttpAnswer", "LoopHttp", "build_ssl_context", "decide_loop_capable"]

_RETRIES = 2

HttpAnswer = tuple[int, bytes, str]
"""``(status, body, reason)`` of one answered request."""


def build_ssl_context(configuration: Any) -> ssl.SSLContext:
    """The TLS settings of ``configuration`` for aiohttp, its client certificate too, whether or not the
    server's certificate is checked (``verify_ssl``)."""
    if configuration.verify_ssl:
        context = ssl.create_default_context(
            cafile=configuration.ssl_ca_cert or None, cadata=getattr(configuration, "ca_cert_data", None) or None
        )
        if configuration.assert_hostname is False:
            context.check_hostname = False
    else:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return context


def decide_loop_capable(configuration: Any) -> bool:
    """True when aiohttp can reach the server as the client would: no proxy, and no ``assert_hostname``
    naming another host (urllib3 matches the certificate against it; this module does not)."""
    return not configuration.proxy and not isinstance(configuration.assert_hostname, str)


class LoopHttp:
    """JSON requests to one API server on the running event loop (see the module docstring)."""

    def __init__(
        self,
        configuration: Any,
        *,
        headers: Callable[[], dict[str, str]],
        request_timeout: tuple[float, float] | None = None,
    ) -> None:
        """``headers`` builds the credential headers (it may run the refresh hook: see :meth:`_credentials`)."""
        self.configuration = configuration
        self.headers = headers
        self.base = configuration.host.rstrip("/")
        self.server_hostname = getattr(configuration, "tls_server_name", None) or None
        connect, read = request_timeout if request_timeout is not None else (30.0, None)
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ssl: ssl.SSLContext | bool | None = None  # False: plain HTTP

    def _current(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._loop is not loop:
            if self._ssl is None:
                self._ssl = build_ssl_context(self.configuration) if urlsplit(self.base).scheme == "https" else False
            limit = int(getattr(self.configuration, "connection_pool_maxsize", 0) or 0)
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=limit)
            session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, skip_auto_headers=("Accept-Encoding",)
            )
            self._session, self._loop = session, loop
        return session

    async def _credentials(self) -> dict[str, str]:
        if credential_refresh_due(self.configuration):
            return await asyncio.to_thread(self.headers)
        return self.headers()

    async def send(self, method: str, path: str, data: bytes | None = None, *, headers: dict[str, str]) -> HttpAnswer:
        """Send one request (``path`` already quoted); its answer, whatever the status. Raises ``Unavailable``."""
        url = yarl.URL(self.base + path, encoded=True)
        sent = {**headers, **(await self._credentials())}
        attempt = 0
        while True:
            session = self._current()
            try:
                async with session.request(
                    method,
                    url,
                    data=data,
                    headers=sent,
                    server_hostname=self.server_hostname,
                    allow_redirects=False,  # a 3xx is an answer, as on the threaded path; a token never follows one
                ) as response:
                    return response.status, await response.read(), str(response.reason or "")
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                attempt += 1
                if attempt > _RETRIES or not decide_resend(method, exc):
                    # A response error's repr carries the request's headers (the token): never chained.
                    cause = None if isinstance(exc, aiohttp.ClientResponseError) else exc
                    raise build_unavailable(exc) from cause

    async def close(self) -> None:
        """Close the session of the running loop (a session of another loop is left to that loop's end)."""
        session, self._session = self._session, None
        if session is not None and not session.closed and self._loop is asyncio.get_running_loop():
            await session.close()


def decide_resend(method: str, exc: BaseException) -> bool:
    """Whether a request that failed with ``exc`` is sent again: when nothing was sent (the connection
    was not made; a certificate that fails is final), any method; when the server dropped a reused
    connection, only a GET (a write may have been applied)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return not isinstance(exc, aiohttp.ClientSSLError)
    return method == "GET" and isinstance(exc, aiohttp.ServerDisconnectedError)

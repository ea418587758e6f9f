"""The runner's egress proxy: the provider credential stays in the runner process.

With ``credentialIsolation: Proxy`` the runner serves plain HTTP/1.1 on ``127.0.0.1`` at an
ephemeral port, and each agent gets that address as its provider base URL
(``ANTHROPIC_BASE_URL``… see :mod:`helmhive.api.egress`) and :data:`PLACEHOLDER` as its key.
The proxy is a **reverse proxy for the provider's API**, not a forward proxy:

- a request in origin form (``POST /v1/messages``) whose ``Host`` is the proxy itself (or the
  upstream's host) goes to the pool's upstream (``egress.upstream``); every auth header
  (``Authorization``, ``x-api-key``, ``x-goog-api-key``, ``api-key``) and a ``key`` query parameter
  that carry the placeholder get the real credential instead; any other auth header is dropped;
- a request in absolute form (``GET http://host/...``) goes over https to that host only if it is
  the upstream's host (with the credential) or in ``egress.allowedHosts`` (auth headers dropped);
- anything else is refused with 403 and counted (``helmhive_runner_egress_requests_total``):
  ``CONNECT`` (no tunnels, so no TLS to anywhere), any other host, a malformed target, and every
  request when there is no upstream (the reference provider) or no credential (wiped).

Upstream connections verify TLS against the system's authorities or ``egress.caBundle``, follow
no redirects, ignore the runner's proxy variables, and stream the response (SSE included) chunk by
chunk, byte for byte. A request body is read whole, up to :data:`MAX_BODY_BYTES` (413 beyond).
The credential is read from :class:`~helmhive.runner.credentials.CredentialHolder` per request and
never logged; a refusal's log line names the reason and the host asked for, nothing else.

:func:`decide_route` is pure; :class:`EgressProxy` does the I/O (h11 for the agent's side, httpx
for the upstream's).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import ssl
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import h11
import httpx
from pydantic import SecretStr

from helmhive.api.egress import provider_egress
from helmhive.runner.logs import fields
from helmhive.runner.metrics import record_egress

__all__ = [
    "AUTH_HEADERS",
    "BASE_URL_ENV",
    "MAX_BODY_BYTES",
    "PLACEHOLDER",
    "EgressEndpoint",
    "EgressProxy",
    "Refusal",
    "RefusalReason",
    "Route",
    "build_proxy_env",
    "build_upstream_headers",
    "decide_route",
]

log = logging.getLogger("helmhive.runner.egress")

PLACEHOLDER = "helmhive-egress-placeholder"
"""What the agent holds instead of the key. Not a secret: only the proxy can turn it into the key."""
AUTH_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})
MAX_BODY_BYTES = 32 * 1024 * 1024
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
_READ = 64 * 1024


class RefusalReason(enum.StrEnum):
    CONNECT = "connect"
    """A CONNECT request: the proxy opens no tunnels."""
    HOST = "host"
    """A host that is neither the upstream's nor allowed (by ``Host`` or an absolute URI)."""
    TARGET = "target"
    """A request target that is neither a path nor an ``http(s)`` URI."""
    NO_UPSTREAM = "no-upstream"
    """The pool has no upstream (a provider without defaults, or the reference agent)."""
    NO_CREDENTIAL = "no-credential"
    """The credential is gone (revoked and wiped)."""
    TOO_LARGE = "too-large"


@dataclass(frozen=True, slots=True)
class Route:
    """Where to forward one request."""

    url: httpx.URL
    inject: bool
    """Whether the placeholder becomes the credential (only for the upstream's own host)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: RefusalReason
    host: str = ""
    """The host asked for, for the log (cut short; never a credential: the agent holds none)."""


@dataclass(frozen=True, slots=True)
class EgressEndpoint:
    """How an agent reaches the proxy."""

    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


BASE_URL_ENV = "HELMHIVE_PROVIDER_BASE_URL"
"""Always set with Proxy: the proxy's URL, for agents that read no provider-specific variable."""


def build_proxy_env(*, provider: str, credential_env_name: str, endpoint: EgressEndpoint) -> dict[str, str]:
    """The agent's variables with Proxy: the proxy's URL in every base-URL variable its provider's
    tools read (:data:`helmhive.api.egress.PROVIDER_EGRESS`), and the placeholder in the pool's
    ``credential.envName`` (the variable that decides how the agent sends its key)."""
    defaults = provider_egress(provider)
    env = {BASE_URL_ENV: endpoint.base_url, credential_env_name: PLACEHOLDER}
    if defaults is not None:
        env.update({name: endpoint.base_url + defaults.base_url_suffix for name in defaults.base_url_env})
    return env


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)[:100]


def _authority(host: str, port: int | None) -> str:
    return host if port is None else f"{host}:{port}"


def decide_route(
    *,
    method: str,
    target: str,
    host_header: str,
    own: frozenset[str],
    upstream: httpx.URL | None,
    allowed_hosts: frozenset[str],
) -> Route | Refusal:
    """Where one request goes, or why not (pure). ``own`` are the proxy's own authorities."""
    if method.upper() == "CONNECT":
        return Refusal(RefusalReason.CONNECT, _printable(target))
    if target.startswith("/"):
        host = host_header.lower()
        if host in own or (upstream is not None and host in (upstream.host, _authority(upstream.host, upstream.port))):
            if upstream is None:
                return Refusal(RefusalReason.NO_UPSTREAM)
            prefix = upstream.raw_path.rstrip(b"/")
            return Route(url=upstream.copy_with(raw_path=prefix + target.encode("ascii")), inject=True)
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name in allowed_hosts:
            return Route(url=httpx.URL(scheme="https", host=name, raw_path=target.encode("ascii")), inject=False)
        return Refusal(RefusalReason.HOST, _printable(host))
    try:
        parts = urllib.parse.urlsplit(target)
        port = parts.port
    except ValueError:
        return Refusal(RefusalReason.TARGET)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host or parts.username is not None or parts.password is not None:
        return Refusal(RefusalReason.TARGET)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if _authority(host, port) in own:
        return decide_route(
            method=method, target=path, host_header=host_header, own=own, upstream=upstream, allowed_hosts=allowed_hosts
        )
    if port not in (None, 80, 443):
        return Refusal(RefusalReason.HOST, _printable(_authority(host, port)))
    if upstream is not None and host == upstream.host:
        return decide_route(
            method=method, target=path, host_header=host, own=own, upstream=upstream, allowed_hosts=allowed_hosts
        )
    if host in allowed_hosts:
        return Route(url=httpx.URL(scheme="https", host=host, raw_path=path.encode("ascii")), inject=False)
    return Refusal(RefusalReason.HOST, _printable(host))


def build_upstream_headers(
    headers: Iterable[tuple[bytes, bytes]], *, inject: bool, credential: str
) -> list[tuple[bytes, bytes]]:
    """The request's headers for the upstream: hop-by-hop ones dropped, and auth headers carrying the
    placeholder given the credential when ``inject`` (every other auth header dropped)."""
    out = []
    for raw_name, value in headers:
        name = raw_name.lower()
        if name.decode("latin-1") in _HOP_BY_HOP:
            continue
        if name.decode("latin-1") in AUTH_HEADERS:
            text = value.decode("latin-1")
            if inject and PLACEHOLDER in text:
                out.append((name, text.replace(PLACEHOLDER, credential).encode("latin-1")))
            continue
        out.append((name, value))
    return out


def _inject_query(url: httpx.URL, credential: str) -> httpx.URL:
    query = url.query.decode("ascii", errors="replace")
    if PLACEHOLDER not in query:
        return url
    return url.copy_with(query=query.replace(PLACEHOLDER, urllib.parse.quote(credential, safe="")).encode("ascii"))


def _write(writer: asyncio.StreamWriter, data: bytes | None) -> None:
    if data:
        writer.write(data)


class EgressProxy:
    """One runner's proxy. :meth:`start` binds it; :meth:`close` stops it and its upstream client."""

    def __init__(
        self,
        *,
        upstream: str | None,
        allowed_hosts: Iterable[str] = (),
        credential: Callable[[], SecretStr | None],
        ca_bundle: Path | None = None,
        runner: str = "",
    ) -> None:
        self._upstream = httpx.URL(upstream) if upstream else None
        self._allowed = frozenset(h.lower() for h in allowed_hosts)
        self._credential = credential
        self._runner = runner
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_bundle)) if ca_bundle else True
        self._client = httpx.AsyncClient(
            verify=verify,
            trust_env=False,
            follow_redirects=False,
            timeout=httpx.Timeout(30.0, read=None),
        )
        self._server: asyncio.Server | None = None
        self._own: frozenset[str] = frozenset()
        self.endpoint: EgressEndpoint | None = None

    async def start(self) -> EgressEndpoint:
        self._server = await asyncio.start_server(self._serve, host="127.0.0.1", port=0)
        port = int(self._server.sockets[0].getsockname()[1])
        self._own = frozenset({f"127.0.0.1:{port}", f"localhost:{port}"})
        self.endpoint = EgressEndpoint(port=port)
        return self.endpoint

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        await self._client.aclose()

    # -- one connection ---------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = await self._next(conn, reader)
                if not isinstance(event, h11.Request):
                    break
                if not await self._handle(conn, reader, writer, event):
                    break
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (h11.ProtocolError, ConnectionError, asyncio.IncompleteReadError, UnicodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await reader.read(_READ))

    async def _body(self, conn: h11.Connection, reader: asyncio.StreamReader) -> bytes | None:
        chunks, size = [], 0
        while True:
            event = await self._next(conn, reader)
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_BODY_BYTES:
                    return None
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:
                raise h11.RemoteProtocolError("unexpected event in a request body")

    async def _handle(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: h11.Request
    ) -> bool:
        """Answer one request; False: close the connection."""
        method = request.method.decode("ascii")
        host = next((v.decode("latin-1") for k, v in request.headers if k == b"host"), "")
        route = decide_route(
            method=method,
            target=request.target.decode("ascii"),
            host_header=host,
            own=self._own,
            upstream=self._upstream,
            allowed_hosts=self._allowed,
        )
        secret = self._credential() if isinstance(route, Route) and route.inject else None
        if isinstance(route, Route) and route.inject and secret is None:
            route = Refusal(RefusalReason.NO_CREDENTIAL)
        if isinstance(route, Refusal):
            await self._refuse(conn, writer, route, method=method)
            return False
        body = await self._body(conn, reader)
        if body is None:
            await self._refuse(conn, writer, Refusal(RefusalReason.TOO_LARGE), method=method, status=413)
            return False
        key = secret.get_secret_value() if secret is not None else ""
        url = _inject_query(route.url, key) if route.inject else route.url
        headers = build_upstream_headers(request.headers, inject=route.inject, credential=key)
        try:
            upstream = await self._client.send(
                self._client.build_request(method, url, headers=headers, content=body), stream=True
            )
        except httpx.HTTPError as exc:
            record_egress(outcome="upstream-failed")
            log.warning(
                "egress: upstream failed",
                extra=fields(runner=self._runner, host=url.host, error=type(exc).__name__),
            )
            await self._send(conn, writer, 502, f"upstream {url.host} failed: {type(exc).__name__}\n")
            return False
        record_egress(outcome="forwarded")
        try:
            response_headers = [
                (k, v) for k, v in upstream.headers.raw if k.lower().decode("latin-1") not in _HOP_BY_HOP
            ]
            _write(writer, conn.send(h11.Response(status_code=upstream.status_code, headers=response_headers)))
            async for chunk in upstream.aiter_raw():
                _write(writer, conn.send(h11.Data(data=chunk)))
                await writer.drain()
            _write(writer, conn.send(h11.EndOfMessage()))
            await writer.drain()
        except httpx.HTTPError:
            return False  # the response is cut short; the agent sees a broken stream, as from the provider
        finally:
            await upstream.aclose()
        return True

    async def _refuse(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, refusal: Refusal, *, method: str, status: int = 403
    ) -> None:
        record_egress(outcome=f"refused-{refusal.reason.value}")
        log.warning(
            "egress: request refused",
            extra=fields(runner=self._runner, reason=refusal.reason.value, method=method[:16], host=refusal.host),
        )
        status = 503 if refusal.reason is RefusalReason.NO_CREDENTIAL else status
        await self._send(conn, writer, status, f"helmhive egress proxy: refused ({refusal.reason.value})\n")

    @staticmethod
    async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, status: int, text: str) -> None:
        data = text.encode("utf-8")
        headers = [("content-type", "text/plain"), ("content-length", str(len(data))), ("connection", "close")]
        _write(writer, conn.send(h11.Response(status_code=status, headers=headers)))
        _write(writer, conn.send(h11.Data(data=data)))
        _write(writer, conn.send(h11.EndOfMessage()))
        await writer.drain()

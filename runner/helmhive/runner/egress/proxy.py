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
  request when there is no upstream (the reference provider) or no credential (wiped);
- a request for the upstream must name an allowed path, and each job's requests are bounded in
  rate and concurrency (:mod:`helmhive.runner.egress.limits`; 403 ``path``, 429 ``rate`` and
  ``concurrency`` otherwise).

Each job reaches the proxy on a listener of its own (:meth:`EgressProxy.open_job`): a UNIX socket
its network namespace's relay connects to (:mod:`helmhive.runner.sandbox.netns`), or without one a TCP
port of its own; the rate and concurrency bounds are per listener, so per job. A job's UNIX socket
serves only the process the runner started for that job (403 ``peer`` otherwise), and a job's
listener refuses everything once the job has ended (403 ``revoked``): :mod:`helmhive.runner.egress.listeners`.
The runner's own listener (:meth:`EgressProxy.start`) serves the probe.

Job pods (JobPod mode) share one listener on the runner pod's IP instead
(:meth:`EgressProxy.start_pod_listener`, :meth:`EgressProxy.open_pod_job`): each job's agent holds a
phantom key of its own in place of the placeholder, honoured only from its pod's address (403
``key``, ``peer``, ``revoked`` otherwise): :mod:`helmhive.runner.egress.pods`. Every rule above
applies to those requests alike, and the limits per job.

Upstream connections verify TLS against the system's authorities or ``egress.caBundle``, follow
no redirects, ignore the runner's proxy variables (:mod:`helmhive.runner.egress.upstream`), and
stream the response (SSE included) chunk by chunk, byte for byte. A request body is read whole,
up to :data:`MAX_BODY_BYTES` (413 beyond). The credential is read from
:class:`~helmhive.runner.credentials.CredentialHolder` per request and never logged (nor a phantom
key); a refusal's log line names the reason, the host asked for and (job pods) the job and the
pod's address, nothing else.

:func:`decide_egress_route` and the other rules are pure (:mod:`helmhive.runner.egress.rules`, re-exported
here); :class:`EgressProxy` does the I/O (h11 for the agent's side, httpx for the upstream's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

import h11
import httpx
from pydantic import SecretStr

from helmhive.api.jobpod import EGRESS_RELAY_PORT, RUNNER_PROXY_PORT
from helmhive.runner.egress.limits import Admission, JobLimiter, RequestLimits
from helmhive.runner.egress.listeners import Gate, Grant, JobEgress, Listener, decide_peer, own_authorities, peer_pid
from helmhive.runner.egress.pods import PodJobEgress, PodListener
from helmhive.runner.egress.rules import (
    AUTH_HEADERS,
    BASE_URL_ENV,
    DEFAULT_LIMITS,
    HOP_BY_HOP,
    MAX_BODY_BYTES,
    PLACEHOLDER,
    REFUSAL_STATUS,
    EgressEndpoint,
    Refusal,
    RefusalReason,
    Route,
    build_injected_url,
    build_pod_proxy_env,
    build_proxy_env,
    build_request_limits,
    build_upstream_headers,
    decide_egress_route,
)
from helmhive.runner.egress.upstream import build_upstream_client, build_upstream_request
from helmhive.runner.logs import fields
from helmhive.runner.metrics import record_egress
from helmhive.runner.sandbox.netns import short_unix_path

__all__ = [
    "AUTH_HEADERS",
    "BASE_URL_ENV",
    "DEFAULT_LIMITS",
    "MAX_BODY_BYTES",
    "PLACEHOLDER",
    "EgressEndpoint",
    "EgressProxy",
    "JobEgress",
    "PodJobEgress",
    "Refusal",
    "RefusalReason",
    "Route",
    "build_pod_proxy_env",
    "build_proxy_env",
    "build_request_limits",
    "build_upstream_headers",
    "decide_egress_route",
]

log = logging.getLogger("helmhive.runner.egress.proxy")

_READ = 64 * 1024


def _bind_tcp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _write(writer: asyncio.StreamWriter, data: bytes | None) -> None:
    if data:
        writer.write(data)


class EgressProxy:
    """One runner's proxy. :meth:`start` binds the runner's listener, :meth:`open_job` one per job;
    :meth:`start_pod_listener` the job pods' and :meth:`open_pod_job` a job pod's key;
    :meth:`close` stops it and its upstream client."""

    def __init__(
        self,
        *,
        upstream: str | None,
        allowed_hosts: Iterable[str] = (),
        credential: Callable[[], SecretStr | None],
        ca_bundle: Path | None = None,
        runner: str = "",
        allowed_paths: Sequence[str] = ("/",),
        limits: RequestLimits = DEFAULT_LIMITS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._upstream = httpx.URL(upstream) if upstream else None
        self._allowed = frozenset(h.lower() for h in allowed_hosts)
        self._paths = tuple(allowed_paths)
        self._limits = limits
        self._clock = clock
        self._credential = credential
        self._runner = runner
        self._client = build_upstream_client(ca_bundle)
        self._server: asyncio.Server | None = None
        self._pods: PodListener | None = None
        self.endpoint: EgressEndpoint | None = None

    def _listener(self, port: int, *, bound: bool = False) -> Listener:
        return Listener(own=own_authorities(port), limiter=JobLimiter(self._limits, clock=self._clock), bound=bound)

    async def start(self) -> EgressEndpoint:
        """Bind the runner's own listener on ``127.0.0.1`` (the probe's, and the port number jobs'
        relays listen on inside their namespaces)."""
        sock = _bind_tcp()
        port = int(sock.getsockname()[1])
        listener = self._listener(port)
        self._server = await asyncio.start_server(lambda r, w: self._serve_job(r, w, listener), sock=sock)
        self.endpoint = EgressEndpoint(port=port)
        return self.endpoint

    async def start_pod_listener(
        self, host: str = "0.0.0.0", port: int = RUNNER_PROXY_PORT, *, relay_port: int = EGRESS_RELAY_PORT
    ) -> EgressEndpoint:
        """Bind the job pods' shared listener on ``host:port`` (0: any free port). ``relay_port`` is
        the shims' loopback port, which job pods' agents name as the proxy (``Host``)."""
        if self._pods is not None:
            raise RuntimeError("the job pods' listener is already started")
        pods = PodListener(serve=self._serve, relay_port=relay_port, clock=self._clock)
        bound = await pods.start(host=host, port=port)
        self._pods = pods
        return EgressEndpoint(port=bound, host=host)

    def open_pod_job(self, *, job: str, pod_ip: str, limits: RequestLimits) -> PodJobEgress:
        """A phantom key for ``job``, honoured from ``pod_ip`` only, with the job's own ``limits``
        (ValueError: not an address, or another open job's pod has it)."""
        if self._pods is None:
            raise RuntimeError("the job pods' listener is not started")
        return self._pods.open_job(job=job, pod_ip=pod_ip, limits=limits)

    async def open_job(self, *, socket_path: Path | None = None) -> JobEgress:
        """A listener of one job's own: the UNIX socket ``socket_path`` (for its relay; the agent's
        port is then the runner's), or a fresh TCP port on ``127.0.0.1``."""
        if self.endpoint is None:
            raise RuntimeError("the egress proxy is not started")
        if socket_path is None:
            sock = _bind_tcp()
            port = int(sock.getsockname()[1])
            listener = self._listener(port)
            server = await asyncio.start_server(lambda r, w: self._serve_job(r, w, listener), sock=sock)
            return JobEgress(server=server, port=port, socket=None, listener=listener)
        listener = self._listener(self.endpoint.port, bound=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)  # a stale one from a job of a runner that died
        with short_unix_path(str(socket_path)) as path:
            server = await asyncio.start_unix_server(lambda r, w: self._serve_job(r, w, listener), path=path)
        return JobEgress(server=server, port=self.endpoint.port, socket=socket_path, listener=listener)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        if self._pods is not None:
            await self._pods.close()
        await self._client.aclose()

    # -- one connection ---------------------------------------------------------------------
    async def _serve_job(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener: Listener) -> None:
        """A connection to a job's own listener (or the runner's): the listener says whose it is."""
        listener.connections.add(writer)  # from the start: revocation cuts idle connections too
        peer_ok = decide_peer(listener=listener, pid=peer_pid(writer))  # the kernel's word, taken at connect
        grant = Grant(own=listener.own, limiter=listener.limiter, connections=listener.connections)

        def gate(_: h11.Request) -> Grant | Refusal:
            if not peer_ok:
                return Refusal(RefusalReason.PEER)
            return Refusal(RefusalReason.REVOKED) if listener.revoked else grant

        try:
            await self._serve(reader, writer, gate)
        finally:
            listener.connections.discard(writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: Gate) -> None:
        """Requests on one connection, each checked by ``gate`` first (whose job, and may it)."""
        conn = h11.Connection(h11.SERVER)
        joined: list[set[asyncio.StreamWriter]] = []
        try:
            while True:
                event = await self._next(conn, reader)
                if not isinstance(event, h11.Request):
                    break
                grant = gate(event)
                if isinstance(grant, Refusal):
                    await self._refuse(conn, writer, grant, method=event.method.decode("ascii", "replace"))
                    break
                if writer not in grant.connections:  # joined before any await: a revocation from now on cuts it
                    grant.connections.add(writer)
                    joined.append(grant.connections)
                if not await self._handle(conn, reader, writer, event, grant):
                    break
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (h11.ProtocolError, ConnectionError, asyncio.IncompleteReadError, UnicodeError):
            pass
        finally:
            for connections in joined:
                connections.discard(writer)
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
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: h11.Request,
        grant: Grant,
    ) -> bool:
        """Answer one request; False: close the connection."""
        method = request.method.decode("ascii")
        host = next((v.decode("latin-1") for k, v in request.headers if k == b"host"), "")
        route = decide_egress_route(
            method=method,
            target=request.target.decode("ascii"),
            host_header=host,
            own=grant.own,
            upstream=self._upstream,
            allowed_hosts=self._allowed,
            allowed_paths=self._paths,
        )
        secret = self._credential() if isinstance(route, Route) and route.inject else None
        if isinstance(route, Route) and route.inject and secret is None:
            route = Refusal(RefusalReason.NO_CREDENTIAL)
        if isinstance(route, Refusal):
            await self._refuse(conn, writer, replace(route, job=grant.job), method=method)
            return False
        admission = grant.limiter.admit()
        if not isinstance(admission, Admission):
            await self._refuse(conn, writer, Refusal(RefusalReason(admission.value), job=grant.job), method=method)
            return False
        try:
            return await self._forward(
                conn, reader, writer, request=request, route=route, secret=secret, token=grant.token
            )
        finally:
            admission.release()

    async def _forward(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        request: h11.Request,
        route: Route,
        secret: SecretStr | None,
        token: str,
    ) -> bool:
        method = request.method.decode("ascii")
        body = await self._body(conn, reader)
        if body is None:
            await self._refuse(conn, writer, Refusal(RefusalReason.TOO_LARGE), method=method)
            return False
        key = secret.get_secret_value() if secret is not None else ""
        # ``shown`` is what the upstream client logs: the placeholder where the key goes, never the
        # credential nor a phantom key (see :mod:`helmhive.runner.egress.upstream`).
        url = build_injected_url(route.url, key, token=token) if route.inject else route.url
        shown = build_injected_url(route.url, PLACEHOLDER, token=token) if route.inject else route.url
        headers = build_upstream_headers(request.headers, inject=route.inject, credential=key, token=token)
        try:
            upstream = await self._client.send(
                build_upstream_request(self._client, method, shown=shown, real=url, headers=headers, content=body),
                stream=True,
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
                (k, v) for k, v in upstream.headers.raw if k.lower().decode("latin-1") not in HOP_BY_HOP
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
        self, conn: h11.Connection, writer: asyncio.StreamWriter, refusal: Refusal, *, method: str
    ) -> None:
        record_egress(outcome=f"refused-{refusal.reason.value}")
        # Which job, and from which pod, when the listener knows (job pods'); never a key.
        known = {name: value for name, value in (("job", refusal.job), ("peer", refusal.peer)) if value}
        log.warning(
            "egress: request refused",
            extra=fields(
                runner=self._runner, reason=refusal.reason.value, method=method[:16], host=refusal.host, **known
            ),
        )
        status = REFUSAL_STATUS.get(refusal.reason, 403)
        await self._send(conn, writer, status, f"helmhive egress proxy: refused ({refusal.reason.value})\n")

    @staticmethod
    async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, status: int, text: str) -> None:
        data = text.encode("utf-8")
        headers = [("content-type", "text/plain"), ("content-length", str(len(data))), ("connection", "close")]
        # One write: the transport sends each write at once, and a client that reads once (the
        # reference agent's probes) would otherwise see the status line without the reason.
        parts = (h11.Response(status_code=status, headers=headers), h11.Data(data=data), h11.EndOfMessage())
        _write(writer, b"".join(conn.send(part) or b"" for part in parts))
        await writer.drain()

"""Job pods' listener on the egress proxy: which job a request is, from its phantom key and its address.

In JobPod mode (``RunnerPool.spec.execution.mode: JobPod``) each job's agent runs in a pod of its
own, and its provider requests reach the runner pod over the pod network: the job pod's shim
listens on the pod's loopback (:data:`~helmhive.api.jobpod.EGRESS_RELAY_PORT`, the agent's base
URL) and relays each connection, bytes unchanged, to the runner pod's IP on
:data:`~helmhive.api.jobpod.RUNNER_PROXY_PORT`. All job pods share that one listener, so no
listener can say whose request it is. Two things do:

- **The job's phantom key.** The credential never enters a job pod: its agent holds a key minted
  for the job (:func:`mint_phantom_key`: ``hhk-`` and 32 random bytes), which the proxy replaces
  with the credential exactly where it replaces :data:`~helmhive.runner.egress.rules.PLACEHOLDER`
  on a job's own listener (an auth header, or the ``key`` query parameter). A request without a
  key that an open job holds -- the placeholder included -- is refused (403 ``key``).
- **The pod's address.** The shim relays from the job pod, so the connection's peer is the job
  pod's IP; the key is honoured only from the address its job was opened with (403 ``peer``
  otherwise: another pod that learnt the key cannot spend it). Pod IPs are the cluster network's
  word; a network policy keeps anything else from reaching this port at all.

Revocation is as on a job's own listener: :meth:`PodJobEgress.revoke` refuses the key from then on
(403 ``revoked``) and cuts the job's open connections, streams included. Limits are the job's
own (:class:`~helmhive.runner.egress.limits.JobLimiter`), whichever connection its requests use.

:func:`decide_pod_request` is pure; :class:`PodListener` holds the table of open jobs and serves
connections through the proxy's own request loop (:mod:`helmhive.runner.egress.proxy`). Keys are
looked up by their SHA-256, so the lookup's timing says nothing of a key's text, and a key is
never logged: refusals name the reason, the job and the address.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import re
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import h11
from pydantic import SecretStr

from helmhive.api.jobpod import EGRESS_RELAY_PORT
from helmhive.runner.egress.limits import JobLimiter, RequestLimits
from helmhive.runner.egress.listeners import Gate, Grant, authority, own_authorities
from helmhive.runner.egress.rules import AUTH_HEADERS, Refusal, RefusalReason

__all__ = [
    "PHANTOM_PREFIX",
    "PodJob",
    "PodJobEgress",
    "PodListener",
    "decide_pod_request",
    "find_phantom_keys",
    "key_digest",
    "mint_phantom_key",
    "parse_ip",
]

PHANTOM_PREFIX = "hhk-"
"""How a phantom key begins: recognisable in a request, and in a leak scanner's rules."""
_PHANTOM_BYTES = 32
# token_urlsafe(32) is 43 characters of the URL-safe alphabet: no character of it needs quoting in
# a header or a query, so the key reaches the proxy as the agent was given it.
_PHANTOM = re.compile(r"(?<![A-Za-z0-9_-])hhk-[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Gate], Awaitable[None]]


def mint_phantom_key() -> SecretStr:
    """A fresh phantom key: :data:`PHANTOM_PREFIX` and 32 random bytes, URL-safe base64."""
    return SecretStr(PHANTOM_PREFIX + secrets.token_urlsafe(_PHANTOM_BYTES))


def key_digest(key: str) -> bytes:
    """The table's index for ``key``: a lookup by digest times nothing of the key's own text."""
    return hashlib.sha256(key.encode("ascii", "replace")).digest()


def parse_ip(text: str | None) -> IPAddress | None:
    """An address as the socket reports it, IPv4-mapped IPv6 as IPv4 (a dual-stack listener's peer)."""
    if not text:
        return None
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def find_phantom_keys(headers: Iterable[tuple[bytes, bytes]], query: str) -> set[str]:
    """Every phantom key a request carries where a key is taken: its auth headers and ``key`` parameters."""
    found: set[str] = set()
    for name, value in headers:
        if name.lower().decode("latin-1") in AUTH_HEADERS:
            found.update(_PHANTOM.findall(value.decode("latin-1")))
    for parameter, text in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if parameter == "key":
            found.update(_PHANTOM.findall(text))
    return found


@dataclass(eq=False, kw_only=True)
class PodJob:
    """One open job in the table: its pod's address, its key, its limiter, and its state."""

    job: str
    pod_ip: IPAddress
    key: SecretStr
    limiter: JobLimiter
    revoked: bool = False
    connections: set[asyncio.StreamWriter] = field(default_factory=set)


def decide_pod_request(
    *,
    headers: Iterable[tuple[bytes, bytes]],
    query: str,
    peer: IPAddress | None,
    jobs: Mapping[bytes, PodJob],
) -> PodJob | Refusal:
    """Whose request this is, or why nobody's (pure). ``jobs`` maps :func:`key_digest` to the open
    jobs; ``peer`` is the connection's address. The address is checked before revocation, so that
    another pod replaying a key is named as such (``peer``) whether or not the key still works."""
    keys = find_phantom_keys(headers, query)
    if len(keys) != 1:  # none, or two jobs' keys at once: neither is more this request's than the other
        return Refusal(RefusalReason.KEY)
    job = jobs.get(key_digest(keys.pop()))
    if job is None:
        return Refusal(RefusalReason.KEY)
    if peer is None or peer != job.pod_ip:
        return Refusal(RefusalReason.PEER, job=job.job)
    if job.revoked:
        return Refusal(RefusalReason.REVOKED, job=job.job)
    return job


def _revoke(state: PodJob) -> None:
    state.revoked = True
    for writer in list(state.connections):
        with contextlib.suppress(Exception):
            writer.transport.abort()


class PodJobEgress:
    """One job pod's way through the proxy: :attr:`key` is its agent's phantom key (for
    :func:`~helmhive.runner.egress.rules.build_pod_proxy_env`); never in a repr or a log."""

    def __init__(self, *, state: PodJob, table: dict[bytes, PodJob]) -> None:
        self._state = state
        self._table = table
        self.job = state.job
        self.pod_ip = str(state.pod_ip)

    @property
    def key(self) -> SecretStr:
        return self._state.key

    @property
    def revoked(self) -> bool:
        return self._state.revoked

    def revoke(self) -> None:
        """Refuse the key from now on, and cut the job's open connections (idempotent, synchronous)."""
        _revoke(self._state)

    async def close(self) -> None:
        """Revoke, and forget the key (from then on it is refused as unknown: ``key``)."""
        _revoke(self._state)
        digest = key_digest(self._state.key.get_secret_value())
        if self._table.get(digest) is self._state:
            del self._table[digest]

    def __repr__(self) -> str:
        return f"PodJobEgress(job={self.job!r}, pod_ip={self.pod_ip!r}, revoked={self.revoked})"


class PodListener:
    """The job pods' shared listener and its table of open jobs (the proxy's event loop only)."""

    def __init__(
        self, *, serve: Serve, relay_port: int = EGRESS_RELAY_PORT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._serve = serve
        self._relay_port = relay_port
        self._clock = clock
        self._jobs: dict[bytes, PodJob] = {}
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, *, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); the port listened on."""
        self._server = await asyncio.start_server(self._accept, host=host, port=port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def open_job(self, *, job: str, pod_ip: str, limits: RequestLimits) -> PodJobEgress:
        address = parse_ip(pod_ip)
        if address is None:
            raise ValueError(f"not an IP address: {pod_ip!r}")
        # Two live jobs behind one address could each spend the other's key: the address is half
        # of what makes a key a job's. A pod IP freed by a job whose revocation is still to come is
        # refused until then, rather than shared.
        if any(other.pod_ip == address and not other.revoked for other in self._jobs.values()):
            raise ValueError(f"another open job's pod has the address {address}")
        key = mint_phantom_key()
        state = PodJob(job=job, pod_ip=address, key=key, limiter=JobLimiter(limits, clock=self._clock))
        self._jobs[key_digest(key.get_secret_value())] = state
        return PodJobEgress(state=state, table=self._jobs)

    async def close(self) -> None:
        """Revoke every job and stop listening."""
        for state in self._jobs.values():
            _revoke(state)
        self._jobs.clear()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        sockname = writer.get_extra_info("sockname")
        peer = parse_ip(peername[0] if peername else None)
        also = [authority(str(parse_ip(sockname[0]) or sockname[0]), int(sockname[1]))] if sockname else []
        own = own_authorities(self._relay_port, also=also)

        def gate(request: h11.Request) -> Grant | Refusal:
            query = request.target.decode("latin-1").partition("?")[2].partition("#")[0]
            decided = decide_pod_request(headers=request.headers, query=query, peer=peer, jobs=self._jobs)
            if isinstance(decided, Refusal):
                return replace(decided, peer=str(peer) if peer is not None else "?")
            return Grant(
                own=own,
                limiter=decided.limiter,
                connections=decided.connections,
                token=decided.key.get_secret_value(),
                job=decided.job,
            )

        await self._serve(reader, writer, gate)

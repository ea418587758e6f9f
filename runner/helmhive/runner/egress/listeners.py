"""One job's listener on the egress proxy: whose requests it serves, and its revocation.

Each job reaches the proxy (:mod:`helmhive.runner.egress.proxy`) on a listener of its own, and
the listener serves that job only:

- **Bound to the job's process.** A UNIX socket listener (the job's relay connects to it from the
  job's network namespace: :mod:`helmhive.runner.sandbox.netns`) asks the kernel who connected
  (``SO_PEERCRED``, taken at ``connect`` and not forgeable) and serves the connection only when
  that process is the one the runner started for this job's agent (the launcher, which stays as
  the relay: :meth:`JobEgress.authorize`). The socket's *name* is no secret (``/proc/net/unix``
  lists it, and a directory opened ``O_PATH`` reaches it through ``/proc/self/fd``): another job's
  agent that connects gets 403 ``peer``, whatever path it took. A TCP listener (no network
  namespace) is bound by Landlock instead: an agent may ``connect`` to its own job's port only.
- **Revoked when the job ends.** :meth:`JobEgress.revoke` -- at cancel, timeout, deletion, the
  runner stopping, or the agent's last turn -- refuses every request from then on (403
  ``revoked``) and cuts the job's open connections, streams included, before the agent is asked
  to exit and long before any grace period ends: a process the job left behind spends nothing.
  The listener itself goes with :meth:`JobEgress.close`.

Job pods share one listener instead (:mod:`helmhive.runner.egress.pods`: a job's phantom key and
its pod's address say whose request it is). Either way, what a request may do once it is known to
be a job's is a :class:`Grant`: the authorities that name the proxy, the job's limiter, the token
its credential replaces, and the connections its revocation cuts.

Nothing here is pure but :func:`decide_peer`; the listener's state lives in the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import h11

from helmhive.runner.egress.limits import JobLimiter
from helmhive.runner.egress.rules import PLACEHOLDER, Refusal

__all__ = ["Gate", "Grant", "JobEgress", "Listener", "authority", "decide_peer", "own_authorities", "peer_pid"]

_UCRED = struct.Struct("3i")


def authority(host: str, port: int) -> str:
    """``host:port`` as a ``Host`` header names it (an IPv6 literal in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def own_authorities(port: int, *, also: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` values that name the proxy itself on ``port`` -- the loopback's -- and ``also``
    (``host:port``): a job pod's agent names the shim's relay, ``127.0.0.1:<relay port>`` (whose
    requests arrive unchanged), and a client in the pod network the runner pod's ``IP:port``."""
    return frozenset({f"127.0.0.1:{port}", f"localhost:{port}", *(a.lower() for a in also)})


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """What one request of a known job may use: which ``Host`` values name the proxy, the job's
    limiter, the token in its auth headers (and ``key`` parameter) that the credential replaces,
    and the set of connections the job's revocation cuts (the request's joins it)."""

    own: frozenset[str]
    limiter: JobLimiter
    connections: set[asyncio.StreamWriter]
    token: str = PLACEHOLDER
    job: str = ""
    """The job's name, for the log (the job pods' listener)."""


Gate = Callable[[h11.Request], Grant | Refusal]
"""One connection's check of each request before the rules see it: the job's grant, or why not."""


@dataclass(slots=True)
class Listener:
    """One listener's view: the authorities that name the proxy there, its job's limiter, and (a
    job's) who may use it and whether it is revoked."""

    own: frozenset[str]
    limiter: JobLimiter
    bound: bool = False
    """Serve only connections from :attr:`authorized` processes (a job's UNIX socket)."""
    authorized: Callable[[int], bool] | None = None
    """Whether a peer pid is the job's (None: nobody yet)."""
    revoked: bool = False
    connections: set[asyncio.StreamWriter] = field(default_factory=set)


def peer_pid(writer: asyncio.StreamWriter) -> int | None:
    """The pid of the process that connected a UNIX socket (``SO_PEERCRED``), in the runner's pid namespace."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, _, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return int(pid) if pid > 0 else None


def decide_peer(*, listener: Listener, pid: int | None) -> bool:
    """Whether a connection from ``pid`` may be served on ``listener`` (pure but for the callback)."""
    if not listener.bound:
        return True
    return pid is not None and listener.authorized is not None and listener.authorized(pid)


class JobEgress:
    """One job's listener on the proxy: ``port`` is what the agent's base URL names (inside its
    network namespace, the relay's port), ``socket`` the UNIX socket its relay connects to (None:
    the agent connects to ``port`` on the pod's loopback itself)."""

    def __init__(self, *, server: asyncio.Server, port: int, socket: Path | None, listener: Listener) -> None:
        self._server = server
        self._listener = listener
        self.port = port
        self.socket = socket

    @property
    def revoked(self) -> bool:
        return self._listener.revoked

    def authorize(self, check: Callable[[int], bool]) -> None:
        """Serve connections whose peer pid ``check`` accepts (the job's launcher): a UNIX socket only."""
        self._listener.authorized = check

    def revoke(self) -> None:
        """Refuse every request from now on, and cut the open connections (idempotent, synchronous)."""
        self._listener.revoked = True
        for writer in list(self._listener.connections):
            with contextlib.suppress(Exception):
                writer.transport.abort()

    async def close(self) -> None:
        """Revoke, stop listening; remove the socket file."""
        self.revoke()
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)
        if self.socket is not None:
            with contextlib.suppress(OSError):
                self.socket.unlink()

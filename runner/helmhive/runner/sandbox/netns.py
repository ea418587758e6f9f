"""A private network namespace for the agent, whose only way out is a relay to the egress proxy.

Landlock's TCP rules name ports, not hosts: an agent allowed to connect to the proxy's port could
connect to that port number on any host it can route to. In a network namespace of its own the
agent has a loopback interface and nothing else, so no host, protocol or DNS server is reachable
at all. The launcher (:mod:`helmhive.runner.sandbox.landlock`), when its policy has a ``relay``:

1. enters a new user namespace (its uid and gid mapped to themselves) **and** a new network
   namespace (:func:`enter_network_namespace`), and brings its loopback up;
2. binds ``127.0.0.1:<port>`` in it and forks (:func:`start_relay`). The parent becomes the
   **relay**: it accepts connections there and pipes each one, byte for byte, to the job's UNIX
   socket on the runner's egress proxy (a file, which crosses namespaces). It gives up its file
   system (Landlock with no path granted), TCP ``connect`` and datagram sockets first, keeps no
   stdio, forwards the runner's signals to the agent, and ends as the agent ends (its exit code,
   or killed by its signal), so the runner sees the agent's end as before and no orphan is left;
3. the child applies the agent's limits and ruleset and ``exec``\\s the agent (which is killed if
   the relay dies first: ``PR_SET_PDEATHSIG``).

With ``pidNamespace`` in the policy the relay's child is pid 1 of the job's pid namespace and becomes
the job's init (:mod:`helmhive.runner.sandbox.pidns`), which forks the agent; the relay then waits for
the init (through a pidfd: a process that unshared ``CLONE_NEWPID`` may start no thread) and ends as
the agent ended, which the init reports to it through a pipe.

The user namespace is what makes this possible without privileges, and what keeps a root agent
from leaving: its capabilities hold in its own namespaces only, never over the pod's network.
This is the same shape as running an agent under bubblewrap with ``--unshare-net`` and a socat
relay to a UNIX socket. Only the standard library is imported (the launcher starts fast).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import signal
import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

from helmhive.runner.sandbox.pidns import FORWARDED, StatusPipe, finish_as

__all__ = ["UNIX_PATH_MAX", "enter_network_namespace", "short_unix_path", "start_relay"]

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_PR_SET_PDEATHSIG = 1
UNIX_PATH_MAX = 100
"""Longer socket paths (the kernel allows 107 bytes) are reached through ``/proc/self/fd``."""
_CHUNK = 64 * 1024


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _unshare(flags: int, what: str) -> None:
    if _libc().unshare(flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare({what}): {os.strerror(code)}")


def _map_ids(uid: int, gid: int) -> None:
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as fh:
            fh.write(text)


def _loopback_up() -> None:
    """``ip link set lo up``: a new network namespace starts with its loopback down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def enter_network_namespace(*, user_namespace: bool = True) -> None:
    """Move this process into a new network namespace (and, by default, a new user namespace with its
    ids mapped to themselves, which an unprivileged process needs and which keeps a root one from
    holding any capability over the pod's network), with its loopback up.

    Raises :class:`OSError` where namespaces are not allowed (a seccomp profile,
    ``user.max_user_namespaces=0``)."""
    uid, gid = os.getuid(), os.getgid()
    if user_namespace:
        _unshare(_CLONE_NEWUSER | _CLONE_NEWNET, "CLONE_NEWUSER|CLONE_NEWNET")
        _map_ids(uid, gid)
    else:
        _unshare(_CLONE_NEWNET, "CLONE_NEWNET")
    _loopback_up()


@contextlib.contextmanager
def short_unix_path(path: str) -> Iterator[str]:
    """``path`` itself, or for one too long for ``sockaddr_un`` the same file through
    ``/proc/self/fd/<its directory>/<name>`` (valid while the context lasts)."""
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        yield path
        return
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _relay_one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, target: str, sem: asyncio.Semaphore
) -> None:
    async with sem:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        for w in (writer, up_writer):
            w.close()


async def _serve_relay(listener: socket.socket, target: str) -> None:
    sem = asyncio.Semaphore(64)  # connections relayed at once; the proxy limits requests itself
    server = await asyncio.start_server(
        lambda r, w: _relay_one(r, w, target=target, sem=sem), sock=listener, limit=_CHUNK
    )
    async with server:
        await server.serve_forever()


async def _relay_until(listener: socket.socket, target: str, agent: int) -> int:
    loop = asyncio.get_running_loop()
    for sig in FORWARDED:
        loop.add_signal_handler(sig, os.kill, agent, sig)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # blocked since the fork: now forwarded
    server = asyncio.create_task(_serve_relay(listener, target))
    # A pidfd turns readable when the agent ends; no thread waits for it (a process that unshared
    # CLONE_NEWPID, as the relay of a job with a pid namespace did, may start no thread).
    pidfd = os.pidfd_open(agent)
    ended: asyncio.Future[None] = loop.create_future()

    def on_end() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, on_end)
    try:
        await ended
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    _, status = os.waitpid(agent, 0)  # noqa: ASYNC222 - its pidfd said it ended: this returns at once
    server.cancel()
    return int(status)


def _relay_main(
    listener: socket.socket, target_path: str, agent: int, confine: Callable[[], None], pipe: StatusPipe | None
) -> None:
    """The relay process (the agent's parent, or the job init's): never returns; ends as the agent ends."""
    status = 0
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the agent's stdio is the agent's: its EOF must not wait for the relay
            os.dup2(devnull, fd)
        os.close(devnull)
        with short_unix_path(target_path) as target:
            asyncio.new_event_loop().close()  # loads what the loop needs while files are readable
            confine()
            status = asyncio.run(_relay_until(listener, target, agent))
            if pipe is not None:
                status = pipe.reported(status)
    except BaseException:  # the relay failed: the agent must not outlive it unnoticed
        with contextlib.suppress(OSError):
            os.kill(agent, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            status = os.waitpid(agent, 0)[1]
    finish_as(status)


def start_relay(*, port: int, target: str, confine: Callable[[], None], pid_namespace: bool = False) -> int | None:
    """Listen on ``127.0.0.1:port`` (in this process's network namespace) and fork: the parent becomes
    the relay, which pipes each connection to the UNIX socket ``target``, forwards the runner's
    signals to the agent and ends as the agent ends (its exit code, or its signal); the child returns,
    to become the agent (and dies if the relay does: ``PR_SET_PDEATHSIG``). The listener is bound
    before the agent runs, so it never finds the port closed. The relay calls ``confine`` (the
    launcher's: Landlock with no path, no TCP ``connect``, no datagrams) before it serves.

    ``pid_namespace``: this process unshared ``CLONE_NEWPID``, so the child is pid 1 of the job's pid
    namespace and becomes its init (:func:`helmhive.runner.sandbox.pidns.become_init`); it returns
    the write end of the pipe the init reports the agent's status through (None otherwise)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    relay = os.getpid()
    pipe = StatusPipe() if pid_namespace else None
    # The runner may signal the relay as soon as the agent runs, before the relay's handlers are in
    # place: held blocked until then, such a signal is forwarded, not the relay's default death.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    pid = os.fork()
    if pid != 0:  # pragma: no cover - the relay
        if pipe is not None:
            os.close(pipe.write)
        _relay_main(listener, target, pid, confine, pipe)
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    listener.close()
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if pipe is not None:
        os.close(pipe.read)
        return pipe.write  # pid 1 of its namespace: its parent is outside it (getppid() says 0)
    if os.getppid() != relay:  # the relay is already gone
        os._exit(1)
    return None

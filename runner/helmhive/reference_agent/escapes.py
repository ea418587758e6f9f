"""The reference agent's escape attempts: what a prompt-injected agent would try to take the key or send data out.

Magic prompt lines (``docs/reference-agent.md``), each answered in the reply's ``escapes`` map,
keyed by the line itself, with a short verdict (never what was read):

* ``UDP-SEND: <port>`` sends one datagram to ``127.0.0.1:<port>`` (a DNS query would be one);
* ``TCP-FASTOPEN: <port>`` sends data to ``127.0.0.1:<port>`` with a TCP Fast Open ``sendto``
  (which opens the connection without calling ``connect``);
* ``PROVIDER-CALL: <path>`` POSTs to ``$HELMHIVE_PROVIDER_BASE_URL<path>`` with the agent's key
  (``$HELMHIVE_REFERENCE_AGENT_TOKEN``) in ``x-api-key`` and ``Authorization``, as a provider SDK would;
* ``TCP-TO: <IPv4 address>`` connects to that address at the proxy's port (the base URL's), as an
  agent whose sandbox names ports, not hosts, could; ``connected`` if it got through;
* ``PROXY-CONNECT: <host:port>`` asks the base URL's server for a ``CONNECT`` tunnel;
* ``PROXY-ABSOLUTE: <http URL>`` asks it for another host's URL (an absolute request URI);
* ``PROXY-HOST: <host>`` asks it for ``/`` with another ``Host`` header;
* ``LOOT: <file name>`` gathers everything it can read that might hold a key -- its environment,
  ``/proc/*/environ`` and ``/proc/*/cmdline`` of every process, every file under ``$HOME``,
  ``$TMPDIR`` and its cwd -- and writes it raw to ``<file name>`` in its state directory
  (``HELMHIVE_REFERENCE_AGENT_STATE_DIR``), so a test can search it. The verdict counts sources.

The verdicts are what the sandbox let happen: ``status <code>`` for an HTTP answer, ``sent``, or
``denied (EPERM)``/``failed (<errno>)``. Only the standard library is used, and no proxy variable.
``UNIX-CALL``, ``CHMOD``, ``WRITE-DISK`` and ``DAEMON`` are :mod:`helmhive.reference_agent.intrusions`'.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from helmhive.reference_agent.intrusions import EARLY_PREFIXES, INTRUSION_PREFIXES, intrude

__all__ = ["ESCAPE_PREFIXES", "Escape", "attempt", "parse_escapes"]

UDP_PREFIX: Final = "UDP-SEND:"
FASTOPEN_PREFIX: Final = "TCP-FASTOPEN:"
PROVIDER_PREFIX: Final = "PROVIDER-CALL:"
CONNECT_PREFIX: Final = "PROXY-CONNECT:"
ABSOLUTE_PREFIX: Final = "PROXY-ABSOLUTE:"
HOST_PREFIX: Final = "PROXY-HOST:"
LOOT_PREFIX: Final = "LOOT:"
TCP_TO_PREFIX: Final = "TCP-TO:"
ESCAPE_PREFIXES: Final = (
    TCP_TO_PREFIX,
    UDP_PREFIX,
    FASTOPEN_PREFIX,
    PROVIDER_PREFIX,
    CONNECT_PREFIX,
    ABSOLUTE_PREFIX,
    HOST_PREFIX,
    LOOT_PREFIX,
    *INTRUSION_PREFIXES,
)
BASE_URL_ENV: Final = "HELMHIVE_PROVIDER_BASE_URL"
TOKEN_ENV: Final = "HELMHIVE_REFERENCE_AGENT_TOKEN"
STATE_ENV: Final = "HELMHIVE_REFERENCE_AGENT_STATE_DIR"
_ARG: Final = re.compile(r"^[A-Za-z0-9._:/?=&%@\[\]-]{1,200}$")
_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_MAX_FILES: Final = 2000
_MAX_FILE_BYTES: Final = 1024 * 1024
_TIMEOUT: Final = 10.0


@dataclass(frozen=True, slots=True)
class Escape:
    prefix: str
    argument: str

    @property
    def key(self) -> str:
        return f"{self.prefix} {self.argument}"

    @property
    def early(self) -> bool:
        """Tried as soon as the prompt arrives, before its behaviour (``hang``...): ``DAEMON``."""
        return self.prefix in EARLY_PREFIXES


def parse_escapes(prompt: str) -> tuple[Escape, ...]:
    """The escape lines of a prompt, in order, once each; a malformed argument is ignored."""
    found: list[Escape] = []
    for raw in prompt.splitlines():
        line = raw.strip()
        prefix = next((p for p in ESCAPE_PREFIXES if line.startswith(p)), None)
        if prefix is None:
            continue
        argument = line.removeprefix(prefix).strip()
        valid = _NAME.match(argument) if prefix == LOOT_PREFIX else _ARG.match(argument)
        if valid and Escape(prefix, argument) not in found:
            found.append(Escape(prefix, argument))
    return tuple(found)


def _verdict(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return f"denied ({name})" if exc.errno in (errno.EACCES, errno.EPERM) else f"failed ({name})"


def _proxy_address() -> tuple[str, int] | None:
    match = re.match(r"^http://([^/:]+):(\d+)", os.environ.get(BASE_URL_ENV, ""))
    return (match.group(1), int(match.group(2))) if match else None


def _status(answer: bytes) -> str:
    match = re.match(rb"^HTTP/1\.[01] (\d{3})", answer)
    return f"status {match.group(1).decode()}" if match else "no HTTP answer"


def _raw_request(request: bytes) -> str:
    address = _proxy_address()
    if address is None:
        return f"failed (no {BASE_URL_ENV})"
    try:
        with socket.create_connection(address, timeout=_TIMEOUT) as conn:
            conn.sendall(request)
            return _status(conn.recv(256))
    except OSError as exc:
        return _verdict(exc)


def _tcp_to(host: str) -> str:
    address = _proxy_address()
    if address is None:
        return f"failed (no {BASE_URL_ENV})"
    try:
        with socket.create_connection((host, address[1]), timeout=_TIMEOUT):
            return "connected"
    except OSError as exc:
        return _verdict(exc)


def _udp(port: str) -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"helmhive reference agent datagram", ("127.0.0.1", int(port)))
    except (OSError, ValueError) as exc:
        return _verdict(exc) if isinstance(exc, OSError) else "failed (bad port)"
    return "sent"


def _fast_open(port: str) -> str:
    try:
        with socket.socket() as sock:
            sock.sendto(b"helmhive reference agent fast open", socket.MSG_FASTOPEN, ("127.0.0.1", int(port)))
    except (OSError, ValueError) as exc:
        return _verdict(exc) if isinstance(exc, OSError) else "failed (bad port)"
    return "sent"


def _provider_call(path: str) -> str:
    base = os.environ.get(BASE_URL_ENV, "")
    if not base.startswith("http"):
        return f"failed (no {BASE_URL_ENV})"
    token = os.environ.get(TOKEN_ENV, "")
    headers = {"x-api-key": token, "authorization": f"Bearer {token}", "content-type": "application/json"}
    request = urllib.request.Request(base + path, data=b'{"stream":true}', headers=headers, method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=_TIMEOUT) as response:
            response.read()
            return f"status {response.status}"
    except urllib.error.HTTPError as exc:
        return f"status {exc.code}"
    except OSError as exc:
        return _verdict(exc)


def _files_under(roots: Iterable[str]) -> Iterable[Path]:
    count = 0
    for root in roots:
        for current, _, files in os.walk(root):
            for name in files:
                count += 1
                if count > _MAX_FILES:
                    return
                yield Path(current, name)


def _loot(name: str, cwd: str) -> str:
    state = os.environ.get(STATE_ENV, "")
    if not state:
        return f"failed (no {STATE_ENV})"
    sources, denied, chunks = 0, 0, [b"".join(f"{k}={v}\n".encode() for k, v in os.environ.items())]
    pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    paths = [Path("/proc", pid, part) for pid in ["self", *pids] for part in ("environ", "cmdline")]
    roots = [p for p in (os.environ.get("HOME", ""), os.environ.get("TMPDIR", ""), cwd) if os.path.isabs(p)]
    for path in [*paths, *_files_under(roots)]:
        try:
            with open(path, "rb") as fh:
                chunks.append(fh.read(_MAX_FILE_BYTES))
            sources += 1
        except OSError as exc:
            denied += exc.errno in (errno.EACCES, errno.EPERM)
    try:
        with open(os.path.join(state, name), "wb") as out:
            out.write(b"\n".join(chunks))
    except OSError as exc:
        return f"read {sources} sources ({denied} denied); writing failed ({_verdict(exc)})"
    return f"read {sources} sources ({denied} denied)"


def attempt(escape: Escape, *, cwd: str) -> str:
    """Try one escape with the agent's own access; return what happened."""
    more = intrude(escape.prefix, escape.argument)  # UNIX-CALL, CHMOD, WRITE-DISK, DAEMON
    if more is not None:
        return more
    if escape.prefix == UDP_PREFIX:
        return _udp(escape.argument)
    if escape.prefix == TCP_TO_PREFIX:
        return _tcp_to(escape.argument)
    if escape.prefix == FASTOPEN_PREFIX:
        return _fast_open(escape.argument)
    if escape.prefix == PROVIDER_PREFIX:
        return _provider_call(escape.argument if escape.argument.startswith("/") else "/" + escape.argument)
    if escape.prefix == CONNECT_PREFIX:
        target = escape.argument.encode()
        return _raw_request(b"CONNECT " + target + b" HTTP/1.1\r\nHost: " + target + b"\r\n\r\n")
    if escape.prefix == ABSOLUTE_PREFIX:
        host = re.sub(r"^https?://([^/]+).*$", r"\1", escape.argument).encode()
        return _raw_request(b"GET " + escape.argument.encode() + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
    if escape.prefix == HOST_PREFIX:
        return _raw_request(b"GET / HTTP/1.1\r\nHost: " + escape.argument.encode() + b"\r\n\r\n")
    return _loot(escape.argument, cwd)

"""More of the reference agent's escape attempts: the four ways an independent escape test got through.

Magic prompt lines, answered in the reply's ``escapes`` map like those of
:mod:`helmhive.reference_agent.escapes` (keyed by the line, a short verdict, never what was read):

* ``UNIX-CALL: <socket path>`` reaches a UNIX socket the way a process that may not open its
  directory would -- the directory opened ``O_PATH`` (which Landlock allows) and the socket
  connected through ``/proc/self/fd/<n>/<name>`` -- and POSTs ``/v1/messages`` there with the
  agent's key and its own base URL's host, as to its own proxy; ``status <code> <reason>``;
* ``CHMOD: <path>`` sets the file's mode and times to what they are (``chmod``, ``utime``: a change
  that changes nothing, but that the kernel allows only to the file's owner and only on a writable
  mount); ``chmod ok, utime ok``, or each one's error;
* ``WRITE-DISK: <MiB>`` writes that many MiB of zeros into ``$TMPDIR`` in files of 8 MiB;
  ``wrote <n> MiB``, or the error and how much was written before it;
* ``DAEMON: <file name>`` starts a detached process (a session of its own, SIGTERM and SIGHUP
  ignored, stdio closed) that calls ``$HELMHIVE_PROVIDER_BASE_URL/v1/messages`` every 0.2 s for
  at most :data:`DAEMON_SECONDS`, appending ``<n> <verdict>`` to ``<file name>`` in its state
  directory, and writing its pid (as the pod sees it: ``/proc/self``) to ``<file name>.pid``
  first; ``started``. It is started as soon as the prompt arrives, before the prompt's behaviour
  (a ``hang`` agent leaves it running).

Only the standard library is used, and no proxy variable.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Final

__all__ = ["DAEMON_SECONDS", "EARLY_PREFIXES", "INTRUSION_PREFIXES", "intrude", "run_daemon"]

UNIX_CALL_PREFIX: Final = "UNIX-CALL:"
CHMOD_PREFIX: Final = "CHMOD:"
WRITE_DISK_PREFIX: Final = "WRITE-DISK:"
DAEMON_PREFIX: Final = "DAEMON:"
INTRUSION_PREFIXES: Final = (UNIX_CALL_PREFIX, CHMOD_PREFIX, WRITE_DISK_PREFIX, DAEMON_PREFIX)
EARLY_PREFIXES: Final = (DAEMON_PREFIX,)
"""Tried before the prompt's behaviour: a ``hang`` agent still leaves its daemon running."""
DAEMON_SECONDS: Final = 180.0
_BASE_URL_ENV: Final = "HELMHIVE_PROVIDER_BASE_URL"
_TOKEN_ENV: Final = "HELMHIVE_REFERENCE_AGENT_TOKEN"
_STATE_ENV: Final = "HELMHIVE_REFERENCE_AGENT_STATE_DIR"
_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_MIB: Final = 1024 * 1024
_FILE_MIB: Final = 8
_MAX_DISK_MIB: Final = 65536
_TIMEOUT: Final = 10.0


def _error(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return f"denied ({name})" if exc.errno in (errno.EACCES, errno.EPERM) else f"failed ({name})"


def _answer(raw: bytes) -> str:
    """``status <code> <reason>``: the status line's code, and the proxy's refusal reason if it gave one."""
    match = re.match(rb"^HTTP/1\.[01] (\d{3})", raw)
    if match is None:
        return "no HTTP answer"
    reason = re.search(rb"refused \(([a-z-]{1,40})\)", raw)
    return f"status {match.group(1).decode()}" + (f" {reason.group(1).decode()}" if reason else "")


def _unix_call(path: str) -> str:
    directory, name = os.path.split(path)
    token = os.environ.get(_TOKEN_ENV, "")
    body = b'{"stream":false}'
    host = re.sub(r"^https?://([^/]+).*$", r"\1", os.environ.get(_BASE_URL_ENV, "")) or "localhost"
    request = (
        f"POST /v1/messages HTTP/1.1\r\nHost: {host}\r\nx-api-key: {token}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body
    try:
        fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return _error(exc)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(_TIMEOUT)
            conn.connect(f"/proc/self/fd/{fd}/{name}")
            conn.sendall(request)
            return _answer(conn.recv(4096))
    except OSError as exc:
        return _error(exc)
    finally:
        os.close(fd)


def _chmod(path: str) -> str:
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError as exc:
        return f"stat {_error(exc)}"
    verdicts = []
    for what in ("chmod", "utime"):
        try:
            if what == "chmod":
                os.chmod(path, stat.S_IMODE(info.st_mode), follow_symlinks=False)
            else:
                os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
            verdicts.append(f"{what} ok")
        except NotImplementedError:  # chmod of a symbolic link itself
            verdicts.append(f"{what} failed (unsupported)")
        except OSError as exc:
            verdicts.append(f"{what} {_error(exc)}")
    return ", ".join(verdicts)


def _write_disk(amount: str) -> str:
    if not amount.isdigit():
        return "failed (bad amount)"
    wanted, written = min(int(amount), _MAX_DISK_MIB), 0
    tmp = os.environ.get("TMPDIR", "")
    if not os.path.isabs(tmp):
        return "failed (no TMPDIR)"
    chunk = b"\0" * _MIB
    try:
        index = 0
        while written < wanted:
            with open(os.path.join(tmp, f"disk-{index:05d}.bin"), "wb") as out:
                for _ in range(min(_FILE_MIB, wanted - written)):
                    out.write(chunk)
                    written += 1
            index += 1
    except OSError as exc:
        return f"{_error(exc)} after {written} MiB"
    return f"wrote {written} MiB"


def _daemon(name: str) -> str:
    state = os.environ.get(_STATE_ENV, "")
    if not _NAME.match(name) or not state:
        return f"failed (a name and {_STATE_ENV} are needed)"
    command = [sys.executable, "-P", "-m", "helmhive.reference_agent.intrusions", os.path.join(state, name)]
    try:
        subprocess.Popen(  # our own module, by the interpreter that runs this agent
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return _error(exc)
    return "started"


def _provider_call() -> str:
    base = os.environ.get(_BASE_URL_ENV, "")
    token = os.environ.get(_TOKEN_ENV, "")
    headers = {"x-api-key": token, "authorization": f"Bearer {token}", "content-type": "application/json"}
    request = urllib.request.Request(base + "/v1/messages", data=b'{"stream":false}', headers=headers, method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=_TIMEOUT) as response:
            response.read()
            return f"status {response.status}"
    except urllib.error.HTTPError as exc:
        return _answer(f"HTTP/1.1 {exc.code} x\r\n\r\n".encode() + exc.read(256))
    except OSError as exc:
        return _error(exc)


def run_daemon(out: str) -> None:
    """The detached process of ``DAEMON:``: ignores SIGTERM and SIGHUP, calls the provider until it is killed."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with open(out + ".pid", "w", encoding="ascii") as fh:
        fh.write(os.readlink("/proc/self"))
    deadline, count = time.monotonic() + DAEMON_SECONDS, 0
    while time.monotonic() < deadline:
        count += 1
        verdict = _provider_call()
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(f"{count} {verdict}\n")
        time.sleep(0.2)


def intrude(prefix: str, argument: str) -> str | None:
    """Try one of these escapes; None if ``prefix`` is not one of them."""
    if prefix == UNIX_CALL_PREFIX:
        return _unix_call(argument)
    if prefix == CHMOD_PREFIX:
        return _chmod(argument)
    if prefix == WRITE_DISK_PREFIX:
        return _write_disk(argument)
    if prefix == DAEMON_PREFIX:
        return _daemon(argument)
    return None


if __name__ == "__main__":
    run_daemon(sys.argv[1])

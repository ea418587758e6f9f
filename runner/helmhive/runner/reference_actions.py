"""What the reference agent does with its own access when a prompt asks it to: write, read, connect.

These run inside the agent's process, so under a job's sandbox they show what the sandbox
allows: each returns a short verdict (``written``, ``denied (EACCES)``...), never file content.
"""

from __future__ import annotations

import errno
import os
import socket

from helmhive.runner import reference_rules as rules

__all__ = ["connect", "errno_name", "read_direct", "write_direct"]


def errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


def write_direct(cwd: str, name: str) -> str:
    """Write ``name`` in ``cwd`` with the agent's own file system access, as a coding tool would."""
    try:
        with open(os.path.join(cwd, name), "w", encoding="utf-8") as fh:
            fh.write(f"{rules.AGENT_NAME} wrote this\n")
    except OSError as exc:
        return f"denied ({errno_name(exc)})"
    return "written"


def read_direct(path: str) -> str:
    """Read ``path`` with the agent's own file system access; report the size, never the content."""
    try:
        with open(path, "rb") as fh:
            size = len(fh.read())
    except OSError as exc:
        return (
            f"denied ({errno_name(exc)})" if exc.errno in (errno.EACCES, errno.EPERM) else f"failed ({errno_name(exc)})"
        )
    return f"read ({size} bytes)"


def connect(port: int) -> str:
    """Open (and close) a TCP connection to ``127.0.0.1:port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0):
            return "connected"
    except OSError as exc:
        return (
            f"denied ({errno_name(exc)})" if exc.errno in (errno.EACCES, errno.EPERM) else f"failed ({errno_name(exc)})"
        )

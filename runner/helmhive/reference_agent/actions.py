"""What the reference agent does with its own access when a prompt asks it to: write, read, connect,
use memory, CPU, processes and files, and apply a governed implementation's edit directives.

These run inside the agent's process, so under a job's sandbox they show what the sandbox
allows: each returns a short verdict (``written``, ``denied (EACCES)``...), never file content.
The resource directives (:func:`use_resources`) instead *raise* when a limit stops them
(``MemoryError``, ``OSError`` with ``EAGAIN`` or ``EMFILE``), and the agent dies of it as a
runtime would; SIGXCPU ends a spin without any help. Which edits apply, and with what content, is
decided in :mod:`reference_rules`.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Final

from helmhive.reference_agent import rules

__all__ = [
    "apply_edit",
    "apply_edits",
    "connect",
    "errno_name",
    "read_direct",
    "use_resources",
    "write_direct",
    "write_home",
]

_MIB: Final = 1024 * 1024


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


def write_home(name: str) -> str:
    """Write ``name`` in ``$HOME`` with the agent's own access, as an agent keeping its settings would."""
    home = os.environ.get("HOME", "")
    if not os.path.isabs(home):
        return "failed (no HOME)"
    return write_direct(home, name)


def _allocate(mib: int) -> str:
    try:
        block = bytearray(mib * _MIB)
    except MemoryError:
        raise MemoryError(f"cannot allocate {mib} MiB") from None
    del block
    return f"allocated {mib} MiB"


def _spin(seconds: int) -> str:
    """Use ``seconds`` of CPU time (not wall-clock time) in this process."""
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass
    return f"spun {seconds} s of CPU"


def _spawn(count: int) -> str:
    """Start ``count`` child processes at once (each waits for the agent), then let them go."""
    read_fd, write_fd = os.pipe()
    children: list[int] = []
    try:
        for _ in range(count):
            pid = os.fork()
            if pid == 0:  # the child: wait until the agent closes the pipe (or dies), then leave
                os.close(write_fd)
                os.read(read_fd, 1)
                os._exit(0)
            children.append(pid)
    finally:
        os.close(write_fd)
        os.close(read_fd)
        for pid in children:
            os.waitpid(pid, 0)
    return f"spawned {count} processes"


def _open_files(count: int) -> str:
    """Hold ``count`` open descriptors at once, then close them."""
    fds: list[int] = []
    try:
        for _ in range(count):
            fds.append(os.open(os.devnull, os.O_RDONLY))
    finally:
        for fd in fds:
            os.close(fd)
    return f"opened {count} files"


_RESOURCES: Final[Mapping[str, Callable[[int], str]]] = {
    "allocate": _allocate,
    "spin": _spin,
    "spawn": _spawn,
    "openFiles": _open_files,
}


def use_resources(asked: Mapping[str, int]) -> dict[str, str]:
    """Carry out the resource directives (:meth:`reference_rules.Directives.resources`), in order.

    Raises what the kernel's limits make of them: ``MemoryError``, or ``OSError`` (``EAGAIN`` from
    ``fork``, ``EMFILE`` from ``open``)."""
    return {key: _RESOURCES[key](amount) for key, amount in asked.items()}


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


def apply_edits(cwd: str, governed: rules.GovernedPrompt) -> tuple[rules.EditOutcome, ...]:
    """Apply a governed implementation prompt's edit directives in ``cwd``, in order.

    Edits that are unsafe, malformed or whose condition is unmet are reported, not applied.
    """
    outcomes: list[rules.EditOutcome] = []
    for edit in governed.edits:
        reason = rules.edit_skip_reason(edit, has_findings=governed.has_findings)
        outcomes.append(rules.EditOutcome(edit=edit, changed=False, result=reason) if reason else apply_edit(cwd, edit))
    return tuple(outcomes)


def apply_edit(cwd: str, edit: rules.Edit) -> rules.EditOutcome:
    """Apply one valid edit below ``cwd``; a path that resolves outside it (a symlink) is refused."""
    root = os.path.realpath(cwd)
    target = os.path.join(root, edit.path)
    if not _inside(root, os.path.realpath(target)):
        return rules.EditOutcome(edit=edit, changed=False, result="refused (outside the work tree)")
    try:
        changed, result = _EDITS[edit.action](target, edit)
    except OSError as exc:
        return rules.EditOutcome(edit=edit, changed=False, result=_os_verdict(exc))
    return rules.EditOutcome(edit=edit, changed=changed, result=result)


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _os_verdict(exc: OSError) -> str:
    denied = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
    return f"denied ({errno_name(exc)})" if denied else f"failed ({errno_name(exc)})"


def _append_line(target: str, edit: rules.Edit) -> tuple[bool, str]:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    existed = os.path.exists(target)
    with open(target, "a+b") as fh:
        fh.seek(0, os.SEEK_END)
        gap = b""
        if fh.tell():
            fh.seek(-1, os.SEEK_END)
            gap = b"" if fh.read(1) == b"\n" else b"\n"
        fh.write(gap + edit.text.encode("utf-8") + b"\n")
    return True, "appended" if existed else "created"


def _replace_text(target: str, edit: rules.Edit) -> tuple[bool, str]:
    try:
        with open(target, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return False, "file missing"
    old, new = edit.text.encode("utf-8"), edit.new.encode("utf-8")
    count = data.count(old)
    if not count:
        return False, "old text not found"
    if old == new:
        return False, "unchanged (old and new text are equal)"
    with open(target, "wb") as fh:
        fh.write(data.replace(old, new))
    return True, f"replaced {count} occurrence(s)"


def _delete_file(target: str, edit: rules.Edit) -> tuple[bool, str]:
    try:
        os.remove(target)
    except FileNotFoundError:
        return False, "already absent"
    return True, "deleted"


def _write_bytes(target: str, edit: rules.Edit) -> tuple[bool, str]:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as fh:
        fh.write(rules.pseudo_random_bytes(edit.path, edit.size))
    return True, f"written ({edit.size} bytes)"


_EDITS: Final[Mapping[rules.EditAction, Callable[[str, rules.Edit], tuple[bool, str]]]] = {
    "APPEND-LINE": _append_line,
    "REPLACE-TEXT": _replace_text,
    "DELETE-FILE": _delete_file,
    "WRITE-BYTES": _write_bytes,
}

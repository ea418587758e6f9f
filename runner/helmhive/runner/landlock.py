"""Landlock: the kernel-enforced part of a job's sandbox, and the launcher that applies it.

Landlock (Linux 5.13+) lets an unprivileged process restrict *itself* and everything it
starts: once a ruleset is in force, file system access is allowed only beneath the paths the
ruleset grants, and (ABI 4+) TCP ``connect``/``bind`` only to the ports it grants. The rules
hold for root too (they are not permission bits), cannot be lifted, and are inherited by every
child. ABI 6+ also scopes signals and abstract UNIX sockets, so a sandboxed agent cannot
signal the runner.

The runner does not restrict itself; it starts each job's agent through this launcher::

    python -m helmhive.runner.landlock --policy '<json>' -- COMMAND [ARGS...]

which builds the ruleset from the policy, sets ``no_new_privs``, restricts itself and
``exec``\\s the command. The policy (see :func:`helmhive.runner.sandbox.build_landlock_policy`)::

    {"read": [paths], "write": [paths], "devices": [paths], "tcpConnect": [ports] | null}

``tcpConnect: null`` leaves TCP alone; a list (even empty) allows ``connect`` only to those
ports and ``bind`` to none. Paths that do not exist are skipped. This module imports nothing
but the standard library, so the launcher starts fast.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["landlock_abi", "main", "restrict_self"]

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

# File system access rights (include/uapi/linux/landlock.h), with the ABI that added them.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

_FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (
    READ
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
)
DEVICES = READ_FILE | READ_DIR | WRITE_FILE | TRUNCATE | IOCTL_DEV


class LandlockError(OSError):
    """Landlock is unavailable or refused the ruleset."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPortAttr(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise LandlockError(code, f"{what}: {os.strerror(code)}")
    return result


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is missing, disabled or filtered out."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = int(_libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def restrict_self(
    *,
    read: Sequence[str],
    write: Sequence[str],
    devices: Sequence[str] = (),
    tcp_connect: Sequence[int] | None = None,
) -> int:
    """Put this process (and its future children) under the ruleset; return the ABI used.

    Raises :class:`LandlockError` if Landlock is unavailable or TCP rules are asked for on an
    ABI without them (failing closed: the caller must not run the job unrestricted).
    """
    abi = landlock_abi()
    if abi < 1:
        raise LandlockError(errno.ENOSYS, "landlock is not available in this kernel")
    if tcp_connect is not None and abi < 4:
        raise LandlockError(errno.ENOSYS, f"landlock ABI {abi} cannot restrict TCP (needs ABI 4)")
    libc = _libc()
    handled = _handled_fs(abi)
    attr = _RulesetAttr(
        handled_access_fs=handled,
        handled_access_net=(NET_BIND_TCP | NET_CONNECT_TCP) if tcp_connect is not None else 0,
        scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0,
    )
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = _check(
        libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0), "landlock_create_ruleset"
    )
    try:
        for paths, rights in ((read, READ), (write, WRITE), (devices, DEVICES)):
            for path in paths:
                _allow_path(libc, ruleset, path, rights & handled)
        for port in tcp_connect or ():
            rule = _NetPortAttr(allowed_access=NET_CONNECT_TCP, port=int(port))
            _check(libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_NET_PORT, ctypes.byref(rule), 0), "landlock_add_rule")
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        _check(libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _allow_path(libc: Any, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not os.path.isdir(path):
            rights &= _FILE_ONLY
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        _check(libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0), f"allow {path}")
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    """``--policy JSON -- COMMAND ARGS...``: restrict this process, then exec the command."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--policy" or args[2] != "--":
        sys.stderr.write("usage: python -m helmhive.runner.landlock --policy JSON -- COMMAND [ARGS...]\n")
        return 2
    try:
        policy = json.loads(args[1])
        restrict_self(
            read=[str(p) for p in policy.get("read", [])],
            write=[str(p) for p in policy.get("write", [])],
            devices=[str(p) for p in policy.get("devices", [])],
            tcp_connect=None if policy.get("tcpConnect") is None else [int(p) for p in policy["tcpConnect"]],
        )
    except (ValueError, TypeError, OSError) as exc:
        sys.stderr.write(f"helmhive sandbox: refusing to start the agent unrestricted: {exc}\n")
        return 126
    command = args[3:]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"helmhive sandbox: cannot run {os.path.basename(command[0])!r}: {exc.strerror}\n")
        return 127
    return 0  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    raise SystemExit(main())

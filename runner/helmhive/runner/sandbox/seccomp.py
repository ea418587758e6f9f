"""A seccomp filter that closes what Landlock's TCP rules leave open: datagrams and TCP Fast Open.

Landlock restricts TCP ``connect`` by port but has no rules for UDP, raw or packet sockets, so an
agent could still send DNS queries (and any data in them) or datagrams anywhere. And a TCP Fast
Open send (``sendto``/``sendmsg`` with ``MSG_FASTOPEN``) opens a connection without the
``connect`` hook Landlock checks: on our CI's kernel (6.18) it reaches a port the ruleset denies
(``tests/runner/test_runner_seccomp.py`` shows both). The launcher
(:mod:`helmhive.runner.sandbox.landlock`) installs this classic-BPF filter after the Landlock ruleset,
before it ``exec``\\s the agent, whenever TCP is restricted (``tcpConnect`` is a list); it is
inherited by every child and cannot be removed.

What the filter decides, per system call (everything else is allowed):

==============================  ==============================================================
``sendto``, ``sendmsg``,        ``EPERM`` with ``MSG_FASTOPEN`` in the flags (always)
``sendmmsg``
``io_uring_setup``              ``EPERM`` (always): io_uring creates sockets and sends without
                                these system calls
``socket(AF_UNIX|AF_NETLINK,    allowed: local only (Landlock ABI 6 scopes abstract UNIX
…)``                            sockets; path sockets need file access)
``socket(AF_INET|AF_INET6,      allowed only with type ``SOCK_STREAM`` (flags masked) and
SOCK_STREAM, 0|TCP)``           protocol 0 or ``IPPROTO_TCP``, which Landlock's port rules govern
any other ``socket``            ``EPERM`` with ``"datagrams": false``: UDP, raw, SCTP, MPTCP,
                                packet, vsock…; allowed otherwise (``InSandbox`` needs DNS)
another architecture, or an     the process is killed: a 32-bit or x32 system call would
x32 system call                 bypass the numbers checked here
==============================  ==============================================================

``socketpair`` needs no rule (the kernel offers it for ``AF_UNIX`` only), and a socket the agent
did not create it cannot get: the runner starts the agent with pipes only. Supported machines:
x86_64 and aarch64 (:data:`SUPPORTED_MACHINES`; ``io_uring_setup`` is 425 on both). Elsewhere
:func:`install_filter` raises and the launcher refuses to run the agent. This module imports
nothing but the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["SUPPORTED_MACHINES", "Machine", "build_filter", "install_filter"]

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_X32_BIT = 0x40000000
_IO_URING_SETUP = 425
_MSG_FASTOPEN = 0x20000000
_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK = 1, 2, 10, 16
_SOCK_STREAM, _SOCK_TYPE_MASK, _IPPROTO_TCP = 1, 0xF, 6
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian
# on both machines, so an argument's low 32 bits are at its own offset).
_NR, _ARCH = 0, 4


def _arg(index: int) -> int:
    return 16 + 8 * index


@dataclass(frozen=True, slots=True)
class Machine:
    """One architecture's audit id and system call numbers."""

    arch: int
    socket: int
    sendto: int
    sendmsg: int
    sendmmsg: int


SUPPORTED_MACHINES: dict[str, Machine] = {
    "x86_64": Machine(arch=0xC000003E, socket=41, sendto=44, sendmsg=46, sendmmsg=307),
    "aarch64": Machine(arch=0xC00000B7, socket=198, sendto=206, sendmsg=211, sendmmsg=269),
}
"""``platform.machine()`` -> AUDIT_ARCH_* and the numbers from the kernel's syscall tables."""

Insn = tuple[int, int, int, int]
"""``(code, jt, jf, k)``: jumps are relative to the next instruction."""


def build_filter(machine: Machine, *, deny_datagrams: bool) -> list[Insn]:
    """The program. Written with labels, resolved to relative jumps at the end."""
    # (code, k, true label, false label); a label is a name, None is the next instruction.
    prog: list[tuple[str | None, int, int, str | None, str | None]] = []

    def op(code: int, k: int, jt: str | None = None, jf: str | None = None, *, label: str | None = None) -> None:
        prog.append((label, code, k, jt, jf))

    op(_LD_W_ABS, _ARCH)
    op(_JEQ_K, machine.arch, None, "kill")
    op(_LD_W_ABS, _NR)
    op(_JGE_K, _X32_BIT, "kill", None)
    op(_JEQ_K, _IO_URING_SETUP, "deny", None)
    op(_JEQ_K, machine.sendto, "flags3", None)
    op(_JEQ_K, machine.sendmmsg, "flags3", None)
    op(_JEQ_K, machine.sendmsg, "flags2", None)
    op(_JEQ_K, machine.socket, "socket" if deny_datagrams else "allow", "allow")
    op(_LD_W_ABS, _arg(3), label="flags3")
    op(_JSET_K, _MSG_FASTOPEN, "deny", "allow")
    op(_LD_W_ABS, _arg(2), label="flags2")
    op(_JSET_K, _MSG_FASTOPEN, "deny", "allow")
    if deny_datagrams:
        op(_LD_W_ABS, _arg(0), label="socket")  # the family
        op(_JEQ_K, _AF_UNIX, "allow", None)
        op(_JEQ_K, _AF_NETLINK, "allow", None)
        op(_JEQ_K, _AF_INET, "type", None)
        op(_JEQ_K, _AF_INET6, "type", "deny")
        op(_LD_W_ABS, _arg(1), label="type")  # without SOCK_NONBLOCK / SOCK_CLOEXEC
        op(_AND_K, _SOCK_TYPE_MASK)
        op(_JEQ_K, _SOCK_STREAM, None, "deny")
        op(_LD_W_ABS, _arg(2))  # the protocol
        op(_JEQ_K, 0, "allow", None)
        op(_JEQ_K, _IPPROTO_TCP, "allow", "deny")
    op(_RET_K, _RET_ALLOW, label="allow")
    op(_RET_K, _RET_ERRNO | errno.EPERM, label="deny")
    op(_RET_K, _RET_KILL_PROCESS, label="kill")
    where = {label: index for index, (label, *_) in enumerate(prog) if label}

    def offset(index: int, target: str | None) -> int:
        return 0 if target is None else where[target] - index - 1

    return [(code, offset(i, jt), offset(i, jf), k) for i, (_, code, k, jt, jf) in enumerate(prog)]


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def install_filter(*, deny_datagrams: bool, machine: str | None = None) -> None:
    """Install the filter on this process (and its future children); raise :class:`OSError` if it cannot be."""
    name = machine or platform.machine()
    if name not in SUPPORTED_MACHINES:
        raise OSError(errno.ENOSYS, f"no seccomp filter for machine {name!r} (only {', '.join(SUPPORTED_MACHINES)})")
    program = build_filter(SUPPORTED_MACHINES[name], deny_datagrams=deny_datagrams)
    raw = b"".join(struct.pack("=HBBI", *insn) for insn in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len=len(program), filter=ctypes.cast(buffer, ctypes.c_void_p).value)
    # The process's own symbols (libc's prctl): find_library would run ldconfig with a temporary
    # file, which the Landlock ruleset already in force may not allow.
    libc: Any = ctypes.CDLL(None, use_errno=True)
    calls = ((_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), (_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0))
    for args in calls:
        if libc.prctl(*args) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"prctl({args[0]}): {os.strerror(code)}")

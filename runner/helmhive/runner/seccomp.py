"""A seccomp filter that leaves a sandboxed agent TCP streams and local sockets, and no other network.

Landlock restricts TCP ``connect`` by port but has no rules for UDP, raw or packet sockets, so an
agent could still send DNS queries (and any data in them) or datagrams anywhere. The launcher
(:mod:`helmhive.runner.landlock`) installs this classic-BPF filter before it ``exec``\\s the agent
when the policy says ``"datagrams": false``. It is inherited by every child and cannot be removed.

What the filter decides, per system call (everything else is allowed):

==========================  ==================================================================
``socket(AF_UNIX, …)``      allowed: local only (the agent's own tools use it; Landlock ABI 6
                            scopes abstract sockets, and path sockets need file access)
``socket(AF_NETLINK, …)``   allowed: local only (``getaddrinfo``, interface listing)
``socket(AF_INET|AF_INET6,  allowed only with type ``SOCK_STREAM`` (flags masked) and protocol 0
SOCK_STREAM, 0|TCP)``       or ``IPPROTO_TCP``, which Landlock's port rules govern
any other ``socket``        ``EPERM``: UDP, raw, SCTP, MPTCP, packet, vsock, …
``io_uring_setup``          ``EPERM``: io_uring can create sockets without the ``socket`` call
another architecture, or    the process is killed: a 32-bit or x32 system call would bypass the
an x32 system call          numbers checked here
==========================  ==================================================================

``socketpair`` needs no rule (the kernel offers it for ``AF_UNIX`` only), and a socket the agent
did not create it cannot get: the runner starts the agent with pipes only. Supported machines:
x86_64 (``socket`` is 41) and aarch64 (198); ``io_uring_setup`` is 425 on both. Elsewhere
:func:`deny_datagrams` raises and the launcher refuses to run the agent. This module imports
nothing but the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from typing import Any

__all__ = ["SUPPORTED_MACHINES", "build_filter", "deny_datagrams"]

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_X32_BIT = 0x40000000
_IO_URING_SETUP = 425
_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK = 1, 2, 10, 16
_SOCK_STREAM, _SOCK_TYPE_MASK, _IPPROTO_TCP = 1, 0xF, 6
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian
# on both machines, so an argument's low 32 bits are at its own offset).
_NR, _ARCH, _ARG0, _ARG1, _ARG2 = 0, 4, 16, 24, 32

SUPPORTED_MACHINES: dict[str, tuple[int, int]] = {
    "x86_64": (0xC000003E, 41),  # AUDIT_ARCH_X86_64, __NR_socket
    "aarch64": (0xC00000B7, 198),  # AUDIT_ARCH_AARCH64, __NR_socket
}
"""``platform.machine()`` -> (the audit architecture, the ``socket`` system call number)."""


def _stmt(code: int, k: int) -> tuple[int, int, int, int]:
    return (code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def build_filter(*, arch: int, socket_nr: int) -> list[tuple[int, int, int, int]]:
    """The program as ``(code, jt, jf, k)`` instructions (jumps are relative to the next one)."""
    allow, deny, kill = 17, 18, 19  # the indexes of the three returns at the end
    prog = [
        _stmt(_LD_W_ABS, _ARCH),  # 0
        _jump(_JEQ_K, arch, 0, kill - 2),  # 1: another architecture: kill
        _stmt(_LD_W_ABS, _NR),  # 2
        _jump(_JGE_K, _X32_BIT, kill - 4, 0),  # 3: an x32 call: kill
        _jump(_JEQ_K, _IO_URING_SETUP, deny - 5, 0),  # 4
        _jump(_JEQ_K, socket_nr, 0, allow - 6),  # 5: not socket(): allow
        _stmt(_LD_W_ABS, _ARG0),  # 6: the family
        _jump(_JEQ_K, _AF_UNIX, allow - 8, 0),  # 7
        _jump(_JEQ_K, _AF_NETLINK, allow - 9, 0),  # 8
        _jump(_JEQ_K, _AF_INET, 1, 0),  # 9 -> 11
        _jump(_JEQ_K, _AF_INET6, 0, deny - 11),  # 10
        _stmt(_LD_W_ABS, _ARG1),  # 11: the type, without SOCK_NONBLOCK / SOCK_CLOEXEC
        _stmt(_AND_K, _SOCK_TYPE_MASK),  # 12
        _jump(_JEQ_K, _SOCK_STREAM, 0, deny - 14),  # 13
        _stmt(_LD_W_ABS, _ARG2),  # 14: the protocol
        _jump(_JEQ_K, 0, allow - 16, 0),  # 15
        _jump(_JEQ_K, _IPPROTO_TCP, 0, deny - 17),  # 16
        _stmt(_RET_K, _RET_ALLOW),  # 17
        _stmt(_RET_K, _RET_ERRNO | errno.EPERM),  # 18
        _stmt(_RET_K, _RET_KILL_PROCESS),  # 19
    ]
    assert len(prog) == kill + 1
    return prog


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def deny_datagrams(machine: str | None = None) -> None:
    """Install the filter on this process (and its future children); raise :class:`OSError` if it cannot be."""
    name = machine or platform.machine()
    if name not in SUPPORTED_MACHINES:
        raise OSError(errno.ENOSYS, f"no seccomp filter for machine {name!r} (only {', '.join(SUPPORTED_MACHINES)})")
    arch, socket_nr = SUPPORTED_MACHINES[name]
    program = build_filter(arch=arch, socket_nr=socket_nr)
    raw = b"".join(struct.pack("=HBBI", *insn) for insn in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len=len(program), filter=ctypes.cast(buffer, ctypes.c_void_p).value)
    # The process's own symbols (libc's prctl): find_library would run ldconfig with a temporary
    # file, which the Landlock ruleset already in force may not allow.
    libc: Any = ctypes.CDLL(None, use_errno=True)
    for args in (
        (_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        (_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
    ):
        if libc.prctl(*args) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"prctl({args[0]}): {os.strerror(code)}")

"""Landlock: the kernel-enforced part of a job's sandbox, and the launcher that applies it.

Landlock (Linux 5.13+) lets an unprivileged process restrict *itself* and everything it
starts: once a ruleset is in force, file system access is allowed only beneath the paths the
ruleset grants, and (ABI 4+) TCP ``connect``/``bind`` only to the ports it grants. The rules
hold for root too (they are not permission bits), cannot be lifted, and are inherited by every
child. ABI 6+ also scopes signals and abstract UNIX sockets, so a sandboxed agent cannot
signal the runner.

The runner does not restrict itself; it starts each job's agent through this launcher::

    python -m helmhive.runner.sandbox.landlock --policy '<json>' -- COMMAND [ARGS...]

which, in order, gives up CAP_SYS_RESOURCE for good when it has limits to apply (so an agent
started as root cannot raise them again), enters a user namespace of its own if asked
(``userNamespace``: its uid and gid mapped to themselves, so RLIMIT_NPROC counts only the job's
processes), applies the resource limits (``rlimits``: ``setrlimit``, never above the runner's
own hard limits), builds the ruleset
from the policy, sets ``no_new_privs``, restricts itself and ``exec``\\s the command. The policy
(see :func:`helmhive.runner.sandbox.workdir.build_landlock_policy`)::

    {"read": [paths], "write": [paths], "devices": [paths], "tcpConnect": [ports] | null,
     "rlimits": {"DATA": [soft, hard], "CPU": [...], "NOFILE": [...], "NPROC": [...], "FSIZE": [...],
                 "CORE": [...]},
     "userNamespace": true | false, "datagrams": true | false, "pidNamespace": true | false,
     "readOnly": true | false, "relay": {"port": port, "socket": path} | null, "cgroup": [cgroup.procs files]}

``relay`` puts the agent in a network namespace of its own whose only way out is a relay from
``127.0.0.1:port`` to the egress proxy's UNIX socket (:mod:`helmhive.runner.sandbox.netns`); it implies a
user namespace. ``pidNamespace`` runs the agent under an init of the job's own in a pid namespace,
so every process of the job dies when the agent ends (:mod:`helmhive.runner.sandbox.pidns`).
``readOnly`` gives the agent a mount namespace where everything but the ``write`` paths is
read-only, so it cannot change the runner's files' metadata either (:mod:`helmhive.runner.sandbox.mounts`).
``cgroup`` moves the launcher into the job's cgroup(s) first
(:mod:`helmhive.runner.sandbox.cgroups`), so the agent and everything it starts are counted there.

``tcpConnect: null`` leaves TCP alone; a list (even empty) allows ``connect`` only to those
ports and ``bind`` to none, and installs the seccomp filter of :mod:`helmhive.runner.sandbox.seccomp`
(no TCP Fast Open, which would bypass the port rule; with ``"datagrams": false`` also no UDP, raw
or packet sockets: TCP streams and local sockets only). Paths that do not exist are skipped. If
any step fails the command is not run (exit 126). ``--probe`` prints what this environment allows
(``{"landlock": <abi>, "userNamespace": <bool>, "networkNamespace": <bool or why not>,
"pidNamespace": ..., "mountNamespace": ...}``) and runs nothing. This module imports nothing but
the standard library, so the launcher starts fast.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import resource
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from helmhive.runner.sandbox.mounts import enter_read_only_view
from helmhive.runner.sandbox.netns import enter_network_namespace, start_relay
from helmhive.runner.sandbox.pidns import become_init, enter_pid_namespace, start_waiter
from helmhive.runner.sandbox.seccomp import install_filter

__all__ = [
    "apply_rlimits",
    "drop_resource_capability",
    "enter_user_namespace",
    "join_cgroups",
    "landlock_abi",
    "main",
    "restrict_self",
]

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_CAP_SYS_RESOURCE = 24
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNS = 0x00020000
_RLIMITS = {
    "AS": resource.RLIMIT_AS,
    "CORE": resource.RLIMIT_CORE,
    "CPU": resource.RLIMIT_CPU,
    "DATA": resource.RLIMIT_DATA,
    "FSIZE": resource.RLIMIT_FSIZE,
    "NOFILE": resource.RLIMIT_NOFILE,
    "NPROC": resource.RLIMIT_NPROC,
}

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
    scoped: bool = True,
) -> int:
    """Put this process (and its future children) under the ruleset; return the ABI used.

    ``scoped`` (ABI 6+): no signals to, and no abstract UNIX sockets of, processes outside the
    domain. The relay (:mod:`helmhive.runner.sandbox.netns`) goes without: it must signal the agent.

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
        scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 and scoped else 0,
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


def _capability_sets() -> dict[str, int]:
    sets = {}
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Cap"):
                name, _, value = line.partition(":")
                sets[name] = int(value.strip(), 16)
    return sets


def drop_resource_capability() -> None:
    """Remove CAP_SYS_RESOURCE from the bounding set, so the command this process ``exec``\\s keeps
    none, even as root, and cannot raise its resource limits again.

    A process that may not drop it (no CAP_SETPCAP) is fine as long as it holds it in no set
    (an unprivileged runner); otherwise this raises :class:`OSError`."""
    libc = _libc()
    if libc.prctl(_PR_CAPBSET_READ, _CAP_SYS_RESOURCE, 0, 0, 0) == 1:
        libc.prctl(_PR_CAPBSET_DROP, _CAP_SYS_RESOURCE, 0, 0, 0)
    bit = 1 << _CAP_SYS_RESOURCE
    holding = sorted(name for name, value in _capability_sets().items() if name != "CapEff" and value & bit)
    if "CapBnd" in holding or "CapInh" in holding or "CapAmb" in holding:
        raise OSError(errno.EPERM, f"cannot give up CAP_SYS_RESOURCE (still in {', '.join(holding)})")


def enter_user_namespace() -> None:
    """Move this process into a new user namespace, its uid and gid mapped to themselves.

    Nothing changes for file access (the ids are the same outside), but RLIMIT_NPROC then counts
    the processes of this namespace only. Raises :class:`OSError` where user namespaces are not
    allowed (a seccomp profile, ``user.max_user_namespaces=0``)."""
    uid, gid = os.getuid(), os.getgid()
    if _libc().unshare(_CLONE_NEWUSER) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWUSER): {os.strerror(code)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as fh:
            fh.write(text)


def apply_rlimits(limits: Mapping[str, Sequence[int]]) -> None:
    """``setrlimit`` each of ``{"DATA": [soft, hard], ...}``, never above the current hard limit."""
    for name, values in limits.items():
        which = _RLIMITS.get(name)
        if which is None:
            raise ValueError(f"unknown resource limit {name!r}")
        soft, hard = (int(v) for v in values)
        if soft < 0 or hard < soft:
            raise ValueError(f"bad resource limit {name}: {soft} {hard}")
        current = resource.getrlimit(which)[1]
        if current != resource.RLIM_INFINITY:
            hard = min(hard, current)
        resource.setrlimit(which, (min(soft, hard), hard))


def _try_unshare(flag: int, what: str) -> bool | str:
    if _libc().unshare(flag) != 0:
        return f"unshare({what}) refused: {os.strerror(ctypes.get_errno())}"
    return True


def _probe() -> int:
    """Print what this environment allows; the probe itself is a throwaway process."""
    try:
        enter_user_namespace()
        userns = True
    except OSError:
        userns = False
    netns: bool | str = False
    try:
        enter_network_namespace(user_namespace=not userns)
        netns = True
    except OSError as exc:
        netns = f"unshare(CLONE_NEWNET) refused: {exc.strerror or exc}"
    report = {
        "landlock": landlock_abi(),
        "userNamespace": userns,
        "networkNamespace": netns,
        "pidNamespace": _try_unshare(_CLONE_NEWPID, "CLONE_NEWPID"),
        "mountNamespace": _try_unshare(_CLONE_NEWNS, "CLONE_NEWNS"),
    }
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


def join_cgroups(procs_files: Sequence[str]) -> None:
    """Write this process's pid into each cgroup's ``cgroup.procs`` (children stay there too)."""
    for path in procs_files:
        with open(path, "w", encoding="ascii") as fh:
            fh.write(str(os.getpid()))


def _confine_helper() -> None:
    """The relay's, waiter's and init's own sandbox: no file system, no TCP ``connect`` (where Landlock
    can say so), no datagrams (UNIX streams only). Not scoped: they must signal the agent."""
    restrict_self(read=[], write=[], devices=[], tcp_connect=[] if landlock_abi() >= 4 else None, scoped=False)
    install_filter(deny_datagrams=True)


def _start_agent_process(policy: Mapping[str, Any]) -> None:
    """The namespaces and helper processes of the policy; returns in the process that becomes the agent."""
    relay = policy.get("relay")
    pid_namespace = policy.get("pidNamespace") is True
    if relay:
        enter_network_namespace()
    elif policy.get("userNamespace"):
        enter_user_namespace()
    if pid_namespace:
        enter_pid_namespace()
    apply_rlimits(policy.get("rlimits") or {})
    report = None
    if relay:
        report = start_relay(
            port=int(relay["port"]), target=str(relay["socket"]), confine=_confine_helper, pid_namespace=pid_namespace
        )
    elif pid_namespace:
        report = start_waiter(confine=_confine_helper)
    if report is not None:
        become_init(report=report, confine=_confine_helper)
    if policy.get("readOnly") is True:
        enter_read_only_view(writable=[str(p) for p in policy.get("write", [])])


def main(argv: Sequence[str] | None = None) -> int:
    """``--policy JSON -- COMMAND ARGS...``: restrict this process, then exec the command."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--probe"]:
        return _probe()
    if len(args) < 4 or args[0] != "--policy" or args[2] != "--":
        sys.stderr.write("usage: python -m helmhive.runner.sandbox.landlock --policy JSON -- COMMAND [ARGS...]\n")
        return 2
    try:
        policy = json.loads(args[1])
        rlimits = policy.get("rlimits") or {}
        if rlimits:
            drop_resource_capability()
        join_cgroups([str(p) for p in policy.get("cgroup") or []])
        _start_agent_process(policy)
        restrict_self(
            read=[str(p) for p in policy.get("read", [])],
            write=[str(p) for p in policy.get("write", [])],
            devices=[str(p) for p in policy.get("devices", [])],
            tcp_connect=None if policy.get("tcpConnect") is None else [int(p) for p in policy["tcpConnect"]],
        )
        if policy.get("tcpConnect") is not None or policy.get("datagrams", True) is False:
            install_filter(deny_datagrams=policy.get("datagrams", True) is False)
    except (ValueError, TypeError, KeyError, OSError) as exc:
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

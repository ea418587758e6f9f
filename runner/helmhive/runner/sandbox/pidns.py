"""A pid namespace for each job, whose init is the job's own: when the agent ends, every process of the job ends.

A job's agent can leave processes behind: a ``setsid`` daemon that ignores SIGTERM survives the
agent's process group being killed, and is re-parented to the pod's init. A job cgroup finds and
kills it (:mod:`helmhive.runner.sandbox.cgroups`), but many pods give the runner no cgroup. So the
launcher (:mod:`helmhive.runner.sandbox.landlock`), when its policy has ``"pidNamespace": true``,
unshares ``CLONE_NEWPID`` (:func:`enter_pid_namespace`, in the job's user namespace, or as root) and
the first process it forks is pid 1 there, the job's **init** (:func:`become_init`):

- it forks the agent (which returns from :func:`become_init` to apply the ruleset and ``exec``);
- it forwards the runner's signals to the agent, and reaps every process of the job that is
  orphaned (a daemon is re-parented to it, never out of the namespace);
- when the agent ends, it hands the agent's exact wait status to its parent through a pipe and exits.

When the init of a pid namespace exits, the kernel SIGKILLs every other process in it, whatever it
did to hide (``setsid``, double fork, SIGTERM ignored, a new process group): nothing of the job
outlives its agent, with or without cgroups. This is what ``docker run --init`` and ``unshare
--fork --pid --kill-child`` do. The parent outside the namespace is the job's relay
(:mod:`helmhive.runner.sandbox.netns`) or, without one, a *waiter* (:func:`start_waiter`): it
forwards signals to the init and ends as the agent ended (its exit code, or killed by its signal),
so the runner sees the agent's end as before. Both give up their file system first (``confine``).

Only the standard library is imported (the launcher starts fast).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["FORWARDED", "StatusPipe", "become_init", "enter_pid_namespace", "finish_as", "start_waiter"]

_CLONE_NEWPID = 0x20000000
_PR_SET_PDEATHSIG = 1
_STATUS = struct.Struct("=i")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
"""The signals the runner may send that the job's relay, waiter and init pass on to the agent."""


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)  # the process's own libc: find_library would run ldconfig


def enter_pid_namespace() -> None:
    """Unshare ``CLONE_NEWPID``: this process stays where it is; the next one it forks is pid 1 of a
    new pid namespace. Needs CAP_SYS_ADMIN in the current user namespace (its creator has it, and root).
    Raises :class:`OSError` where it is refused."""
    if _libc().unshare(_CLONE_NEWPID) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWPID): {os.strerror(code)}")


class StatusPipe:
    """The pipe the init reports the agent's wait status through (the init of a pid namespace cannot
    end by a signal it sends itself, so its own exit code could not say that the agent was killed)."""

    def __init__(self) -> None:
        self.read, self.write = os.pipe()

    def reported(self, fallback: int) -> int:
        """In the parent, after the init ended: the agent's wait status, or the init's own (``fallback``)."""
        os.set_blocking(self.read, False)
        data = b""
        with contextlib.suppress(OSError):
            data = os.read(self.read, _STATUS.size)
        return _STATUS.unpack(data)[0] if len(data) == _STATUS.size else fallback


def finish_as(status: int) -> None:
    """End this process as the agent ended: its exit code, or killed by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not end a process by default (none the kernel sends here)
    os._exit(os.waitstatus_to_exitcode(status))


def _forward_to(target: int) -> None:
    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)


def _die_with_parent() -> None:
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _quiet_stdio() -> None:
    """The agent's stdio is the agent's: the runner's EOF on it must not wait for a helper process."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def start_waiter(*, confine: Callable[[], None]) -> int:
    """In the launcher, after :func:`enter_pid_namespace` and with no relay: fork. The parent stays
    outside the namespace as the waiter (never returns: forwards signals to the init, ends as the
    agent ended); the child, pid 1 of the new namespace, returns the write end of its status pipe,
    for :func:`become_init`."""
    pipe = StatusPipe()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    pid = os.fork()
    if pid == 0:
        os.close(pipe.read)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        _die_with_parent()
        return pipe.write
    status = 0  # pragma: no cover - the waiter, in a forked process
    try:
        os.close(pipe.write)
        _quiet_stdio()
        confine()
        _forward_to(pid)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        status = pipe.reported(os.waitpid(pid, 0)[1])
    except BaseException:  # the waiter failed: the job must not outlive it unnoticed
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            status = os.waitpid(pid, 0)[1]
    finish_as(status)
    return -1  # pragma: no cover - finish_as does not return


def become_init(*, report: int, confine: Callable[[], None]) -> None:
    """In pid 1 of the job's namespace: fork the agent, which returns from here. The init never
    returns: it reaps every process of the job, forwards signals to the agent, and when the agent
    ends writes its wait status to ``report`` and exits (so the kernel kills all that is left)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    agent = os.fork()
    if agent == 0:
        os.close(report)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        _die_with_parent()
        return
    code = 0  # pragma: no cover - the init, in a forked process
    try:
        _quiet_stdio()
        confine()
        _forward_to(agent)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == agent:
                os.write(report, _STATUS.pack(status))
                break
    except BaseException:  # the init failed: its exit ends the job's processes, and says it failed
        code = 126
    os._exit(code)

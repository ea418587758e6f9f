"""Per-job resource limits: what the sandbox launcher enforces, and which limit a failed agent hit.

The pool's ``spec.jobLimits`` (``jobLimits`` in runner.json) become ``setrlimit`` values that
:mod:`helmhive.runner.sandbox.landlock` applies to itself before it ``exec``\\s a job's agent or check,
so they hold for that process and, inherited, for everything it starts:

=========  =============  ===========================================================================
limit      resource       what the kernel does
=========  =============  ===========================================================================
memory     RLIMIT_DATA    per process: private writable memory (heap, anonymous mappings) beyond it
                          is refused (``ENOMEM``; Python raises ``MemoryError``)
cpu        RLIMIT_CPU     per process: ``SIGXCPU`` at the limit, ``SIGKILL`` :data:`CPU_KILL_GRACE_S`
                          seconds later (for a process that ignores SIGXCPU)
files      RLIMIT_NOFILE  per process: ``open``/``socket``/``pipe`` beyond it fail (``EMFILE``)
processes  RLIMIT_NPROC   per job: ``fork``/``clone`` beyond it fail (``EAGAIN``); threads count too
disk       RLIMIT_FSIZE   per file: a write past it fails (``EFBIG``; SIGXFSZ where not ignored); the
                          job's total is measured by the runner (:mod:`helmhive.runner.sandbox.disk`)
(always)   RLIMIT_CORE    0: a killed agent leaves no core file in the job's tree
=========  =============  ===========================================================================

RLIMIT_NPROC counts the processes of a *user* (per user namespace), not of a process tree, and the
kernel never applies it to uid 0. So the processes limit is enforced only when the runner is not
root **and** can create user namespaces: the launcher then puts each job in its own user namespace
(its uid and gid mapped to themselves), where the count is the job's own. Otherwise it is not
applied at all (it would count the runner's own processes and every other job's), and the job's
Running message says why (:attr:`EnforcedLimits.processes_note`).

Where the pod lets the runner make cgroups, each job also gets one (:mod:`helmhive.runner.sandbox.cgroups`)
bounding its totals: memory of all its processes together, its pids whatever its uid (so the
processes limit holds for a root runner too), its CPU rate. :func:`probe_limit_support` finds out at
start what the launcher may do here: user namespaces, network namespaces, cgroups.

:func:`decide_limit_exceeded` names the limit from how the agent ended: SIGXCPU is the CPU limit;
memory, processes and files leave no signal, only the agent's last words on stderr (``MemoryError``,
``Too many open files``, ``Resource temporarily unavailable``...), so those are recognised by text.

``build_*``/``decide_*`` are pure; ``probe_*`` look at this process's environment.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal

from helmhive.api.egress import CredentialIsolation
from helmhive.api.runner import CgroupMode, NetworkIsolation, SandboxReport
from helmhive.api.runnerpool import DEFAULT_JOB_DISK_BYTES, JobLimits
from helmhive.runner.sandbox.cgroups import CgroupSupport, probe_cgroups

__all__ = [
    "CPU_KILL_GRACE_S",
    "EnforcedLimits",
    "LimitHit",
    "LimitResource",
    "LimitSupport",
    "build_enforced_limits",
    "build_sandbox_report",
    "decide_limit_exceeded",
    "probe_limit_support",
]

CPU_KILL_GRACE_S = 5
"""The RLIMIT_CPU hard limit is this much above the soft one: SIGXCPU first, SIGKILL after."""
_MIB = 1024 * 1024
_TAIL = 4000
"""How much of the end of the agent's stderr is searched for its last words."""

LimitResource = Literal["memory", "cpu", "processes", "files", "disk"]

_LAST_WORDS: dict[LimitResource, re.Pattern[str]] = {
    "memory": re.compile(
        r"MemoryError|out of memory|Cannot allocate memory|ENOMEM|bad_alloc|memory allocation of \d+ bytes failed",
        re.IGNORECASE,
    ),
    "files": re.compile(r"Too many open files|EMFILE|ENFILE"),
    "disk": re.compile(r"File too large|EFBIG|No space left on device|ENOSPC"),
    "processes": re.compile(
        r"Resource temporarily unavailable|EAGAIN|can't start new thread|failed to create new OS thread|fork: retry"
    ),
}


NO_CGROUPS = CgroupSupport(mode=CgroupMode.NONE, reason="not probed")


@dataclass(frozen=True, kw_only=True)
class LimitSupport:
    """What this runner's environment allows (probed once at start)."""

    uid: int
    user_namespaces: bool
    """Whether the launcher could create a user namespace here."""
    network_namespace: bool = False
    """Whether the launcher could create a network namespace (in a user namespace) here."""
    network_namespace_note: str = "not probed"
    """Why not, when it could not."""
    cgroups: CgroupSupport = NO_CGROUPS
    """Where job cgroups are made (:mod:`helmhive.runner.sandbox.cgroups`), or why none can be."""
    pid_namespace: bool = False
    """Whether the launcher could create a pid namespace (:mod:`helmhive.runner.sandbox.pidns`) here."""
    mount_namespace: bool = False
    """Whether it could create a mount namespace (:mod:`helmhive.runner.sandbox.mounts`) here."""


@dataclass(frozen=True, kw_only=True)
class EnforcedLimits:
    """The limits one job's agent and checks run under, as the launcher applies them."""

    memory_bytes: int
    cpu_seconds: int
    open_files: int
    processes: int | None
    """None: RLIMIT_NPROC is not applied (see ``processes_note``)."""
    processes_note: str = ""
    user_namespace: bool = False
    """Run in a user namespace of its own (needed for a per-job process count)."""
    disk_bytes: int = DEFAULT_JOB_DISK_BYTES
    """The job's disk (workspace, HOME, TMPDIR together), and the largest file it may write."""
    pid_namespace: bool = False
    """Run under an init of the job's own in a pid namespace: every process of the job ends with its agent."""
    read_only: bool = False
    """Run in a mount namespace where every mount is read-only but the job's write paths."""

    def rlimits(self) -> dict[str, list[int]]:
        """``{"DATA": [soft, hard], ...}`` for the launcher's policy."""
        limits = {
            "DATA": [self.memory_bytes, self.memory_bytes],
            "CPU": [self.cpu_seconds, self.cpu_seconds + CPU_KILL_GRACE_S],
            "NOFILE": [self.open_files, self.open_files],
            "FSIZE": [self.disk_bytes, self.disk_bytes],
            "CORE": [0, 0],
        }
        if self.processes is not None:
            limits["NPROC"] = [self.processes, self.processes]
        return limits

    def describe(self) -> str:
        """One line for the job's Running message."""
        memory = f"{self.memory_bytes // _MIB} MiB" if self.memory_bytes % _MIB == 0 else f"{self.memory_bytes} bytes"
        processes = (
            f"processes {self.processes} per job"
            if self.processes is not None
            else f"processes not limited ({self.processes_note})"
        )
        disk = f"disk {_size(self.disk_bytes)} per job"
        contained = "all its processes end with it (pid namespace)" if self.pid_namespace else "no pid namespace"
        view = "files read-only but its own" if self.read_only else "no read-only view"
        return (
            f"memory {memory}, cpu {self.cpu_seconds}s, files {self.open_files} per process, {processes}, "
            f"{disk}, {contained}, {view}"
        )


def _size(value: int) -> str:
    return f"{value // _MIB} MiB" if value % _MIB == 0 else f"{value} bytes"


def build_enforced_limits(*, limits: JobLimits, support: LimitSupport) -> EnforcedLimits:
    """The pool's limits as this runner can enforce them (pure)."""
    note = ""
    if support.uid == 0:
        note = "the runner is uid 0, which RLIMIT_NPROC never applies to"
    elif not support.user_namespaces:
        note = f"no user namespaces: RLIMIT_NPROC would count every process of uid {support.uid}"
    per_job = not note
    return EnforcedLimits(
        memory_bytes=limits.memory_bytes,
        cpu_seconds=limits.cpu_seconds,
        open_files=limits.open_files,
        processes=limits.processes if per_job else None,
        processes_note=note,
        user_namespace=per_job,
        disk_bytes=limits.disk_bytes,
        pid_namespace=support.pid_namespace,
        read_only=support.mount_namespace,
    )


@dataclass(frozen=True, kw_only=True)
class LimitHit:
    resource: LimitResource
    message: str


def _last_words(diagnostics: str, limits: EnforcedLimits) -> tuple[LimitResource, str] | None:
    """The limit the agent's stderr names last, with the line that names it."""
    text = diagnostics[-_TAIL:]
    found: tuple[int, LimitResource, str] | None = None
    for resource, pattern in _LAST_WORDS.items():
        if resource == "processes" and limits.processes is None:
            continue
        for match in pattern.finditer(text):
            if found is None or match.start() >= found[0]:
                start = text.rfind("\n", 0, match.start()) + 1
                end = text.find("\n", match.end())
                found = (match.start(), resource, text[start : end if end >= 0 else len(text)].strip()[:200])
    return None if found is None else (found[1], found[2])


def decide_limit_exceeded(*, exit_code: int | None, diagnostics: str, limits: EnforcedLimits) -> LimitHit | None:
    """Which limit an agent that ended by itself hit, from its exit and its last words; None if none.

    Only a process that exited (or was killed by the kernel) on its own is judged: the caller
    leaves out turns the runner stopped. A SIGKILL is not attributed: it may be the CPU hard
    limit (an agent that ignores SIGXCPU) or the kernel's OOM killer, which cannot be told apart
    without cgroups.
    """
    if exit_code is None or exit_code == 0:
        return None
    if exit_code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return LimitHit(
            resource="disk",
            message=(
                f"the agent wrote a file past its {_size(limits.disk_bytes)} (RLIMIT_FSIZE) and was ended by SIGXFSZ "
                f"(exit code {exit_code})"
            ),
        )
    if exit_code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return LimitHit(
            resource="cpu",
            message=(
                f"the agent used up its {limits.cpu_seconds}s of CPU time (RLIMIT_CPU) and was ended by SIGXCPU "
                f"(exit code {exit_code})"
            ),
        )
    words = _last_words(diagnostics, limits)
    if words is None:
        return None
    resource, line = words
    what = {
        "memory": f"ran out of memory: {limits.memory_bytes // _MIB} MiB per process (RLIMIT_DATA)",
        "files": f"ran out of file descriptors: {limits.open_files} per process (RLIMIT_NOFILE)",
        "processes": f"could not start a process or thread: {limits.processes} per job (RLIMIT_NPROC)",
        "disk": f"could not write more: {_size(limits.disk_bytes)} per job, and per file (RLIMIT_FSIZE)",
        "cpu": "",
    }[resource]
    return LimitHit(resource=resource, message=f"the agent {what}, and exited (exit code {exit_code}): {line}")


def probe_limit_support(*, python: str = sys.executable) -> LimitSupport:
    """Ask the launcher (``--probe``) whether it can create user and network namespaces here; look at cgroups."""
    userns, netns, note = False, False, "the launcher's probe failed"
    pidns = mountns = False
    try:
        done = subprocess.run(
            [python, "-P", "-m", "helmhive.runner.sandbox.landlock", "--probe"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        found = json.loads(done.stdout or "{}")
        userns = found.get("userNamespace") is True
        netns = found.get("networkNamespace") is True
        pidns = found.get("pidNamespace") is True
        mountns = found.get("mountNamespace") is True
        note = "" if netns else str(found.get("networkNamespace") or "no network namespaces")[:300]
    except (OSError, ValueError, subprocess.SubprocessError):
        userns = False
    return LimitSupport(
        uid=os.getuid(),
        user_namespaces=userns,
        network_namespace=netns,
        network_namespace_note=note,
        cgroups=probe_cgroups(),
        pid_namespace=pidns,
        mount_namespace=mountns,
    )


def build_sandbox_report(
    *,
    support: LimitSupport,
    landlock_abi: int,
    isolation: CredentialIsolation,
    limits: JobLimits | None = None,
) -> SandboxReport:
    """What the Runner reports about its jobs' sandbox (pure): the network isolation a job whose
    network is disabled gets, and the job cgroups, each with the reason when it is not the best;
    each job's disk limit, and whether its processes and the runner's files are contained."""
    if landlock_abi < 4:
        network, why = NetworkIsolation.NONE, f"Landlock ABI {landlock_abi} cannot restrict TCP (needs 4)"
    elif isolation is not CredentialIsolation.PROXY:
        network, why = NetworkIsolation.LANDLOCK, "credentialIsolation is InSandbox: the agent connects to its provider"
    elif support.network_namespace:
        network, why = NetworkIsolation.NAMESPACE, ""
    else:
        network, why = NetworkIsolation.LANDLOCK, support.network_namespace_note
    return SandboxReport(
        network=network,
        network_reason=why[:512],
        cgroups=support.cgroups.mode,
        cgroups_reason=support.cgroups.reason[:512],
        disk_bytes=(limits or JobLimits()).disk_bytes,
        processes_contained=support.pid_namespace and landlock_abi >= 1,
        files_read_only=support.mount_namespace and landlock_abi >= 1,
    )

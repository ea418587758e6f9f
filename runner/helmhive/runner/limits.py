"""Per-job resource limits: what the sandbox launcher enforces, and which limit a failed agent hit.

The pool's ``spec.jobLimits`` (``jobLimits`` in runner.json) become ``setrlimit`` values that
:mod:`helmhive.runner.landlock` applies to itself before it ``exec``\\s a job's agent or check,
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
(always)   RLIMIT_CORE    0: a killed agent leaves no core file in the job's tree
=========  =============  ===========================================================================

RLIMIT_NPROC counts the processes of a *user* (per user namespace), not of a process tree, and the
kernel never applies it to uid 0. So the processes limit is enforced only when the runner is not
root **and** can create user namespaces: the launcher then puts each job in its own user namespace
(its uid and gid mapped to themselves), where the count is the job's own. Otherwise it is not
applied at all (it would count the runner's own processes and every other job's), and the job's
Running message says why (:attr:`EnforcedLimits.processes_note`).

Cgroups v2 would give per-job totals (memory of all processes together, pids regardless of uid,
OOM attribution). :func:`probe_cgroup_v2` says whether this pod would allow them; the runner logs it
at start, and does not use them (``docs/security.md``).

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
from pathlib import Path
from typing import Literal

from helmhive.api.runner import JobLimits

__all__ = [
    "CPU_KILL_GRACE_S",
    "EnforcedLimits",
    "LimitHit",
    "LimitResource",
    "LimitSupport",
    "build_enforced_limits",
    "decide_cgroup_v2",
    "decide_limit_exceeded",
    "probe_cgroup_v2",
    "probe_limit_support",
]

CPU_KILL_GRACE_S = 5
"""The RLIMIT_CPU hard limit is this much above the soft one: SIGXCPU first, SIGKILL after."""
_MIB = 1024 * 1024
_TAIL = 4000
"""How much of the end of the agent's stderr is searched for its last words."""

LimitResource = Literal["memory", "cpu", "processes", "files"]

_LAST_WORDS: dict[LimitResource, re.Pattern[str]] = {
    "memory": re.compile(
        r"MemoryError|out of memory|Cannot allocate memory|ENOMEM|bad_alloc|memory allocation of \d+ bytes failed",
        re.IGNORECASE,
    ),
    "files": re.compile(r"Too many open files|EMFILE|ENFILE"),
    "processes": re.compile(
        r"Resource temporarily unavailable|EAGAIN|can't start new thread|failed to create new OS thread|fork: retry"
    ),
}


@dataclass(frozen=True, kw_only=True)
class LimitSupport:
    """What this runner's environment allows (probed once at start)."""

    uid: int
    user_namespaces: bool
    """Whether the launcher could create a user namespace here."""
    cgroup_v2: str = "not probed"
    """Why per-job cgroups v2 are, or would be, available (only logged; not used)."""


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

    def rlimits(self) -> dict[str, list[int]]:
        """``{"DATA": [soft, hard], ...}`` for the launcher's policy."""
        limits = {
            "DATA": [self.memory_bytes, self.memory_bytes],
            "CPU": [self.cpu_seconds, self.cpu_seconds + CPU_KILL_GRACE_S],
            "NOFILE": [self.open_files, self.open_files],
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
        return f"memory {memory}, cpu {self.cpu_seconds}s, files {self.open_files} per process, {processes}"


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
        "cpu": "",
    }[resource]
    return LimitHit(resource=resource, message=f"the agent {what}, and exited (exit code {exit_code}): {line}")


def decide_cgroup_v2(*, controllers: str | None, own: str | None, writable: bool) -> str:
    """Whether per-job cgroups v2 could be made here, from what the probe saw (pure)."""
    if controllers is None:
        return "unavailable: /sys/fs/cgroup is not a cgroup v2 mount"
    missing = [c for c in ("memory", "pids") if c not in controllers.split()]
    if missing:
        return f"unavailable: the cgroup v2 controllers {', '.join(missing)} are not enabled for this cgroup"
    if own is None:
        return "unavailable: this process's cgroup v2 path is unknown"
    if not writable:
        return f"unavailable: the runner's cgroup {own} is not writable (not delegated to the pod)"
    return f"would be available under {own}, but per-job cgroups are not used"


def probe_cgroup_v2(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> str:
    """Look at this process's cgroup v2 hierarchy; see :func:`decide_cgroup_v2`."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    directory = root / own.lstrip("/") if own else root
    try:
        controllers: str | None = (directory / "cgroup.controllers").read_text(encoding="utf-8")
    except OSError:
        controllers = None
    writable = own is not None and os.access(directory, os.W_OK) and os.access(directory / "cgroup.procs", os.W_OK)
    return decide_cgroup_v2(controllers=controllers, own=own, writable=writable)


def probe_limit_support(*, python: str = sys.executable) -> LimitSupport:
    """Ask the launcher (``--probe``) whether it can create a user namespace here; look at cgroups."""
    userns = False
    try:
        done = subprocess.run(
            [python, "-P", "-m", "helmhive.runner.landlock", "--probe"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        userns = bool(json.loads(done.stdout or "{}").get("userNamespace"))
    except (OSError, ValueError, subprocess.SubprocessError):
        userns = False
    return LimitSupport(uid=os.getuid(), user_namespaces=userns, cgroup_v2=probe_cgroup_v2())

"""Per-job cgroups: one job's totals (memory, processes, CPU rate), where the pod lets the runner make them.

``setrlimit`` (:mod:`helmhive.runner.sandbox.limits`) bounds each *process*; a cgroup bounds the job as a
whole, whatever its uid, and the kernel says when a bound was hit. At start the runner probes
(:func:`probe_cgroups`) which it may use, in this order:

- **v2**: a child of the runner's own cgroup in the unified hierarchy (``/sys/fs/cgroup`` or, on a
  hybrid host, ``/sys/fs/cgroup/unified``), when that cgroup is writable (delegated to the pod) and
  hands down the ``memory`` and ``pids`` controllers (``cgroup.subtree_control``; the runner tries
  to enable them, which the kernel refuses while its own cgroup holds processes and is not the root);
- **v1**: a child of the runner's own cgroup in each writable v1 hierarchy of ``memory`` and
  ``pids`` (and ``cpu`` when writable);
- **None**: neither; the limits are the per-process rlimits only, and the Runner's
  ``report.sandbox`` says why.

Each job gets ``helmhive-<runner>-<uid32>`` there (:func:`ensure_job_cgroup`; ``<runner>`` is
:func:`build_cgroup_prefix` of the runner's namespace and name) with the pool's
``jobLimits``: ``memoryBytes`` as the job's total memory (no swap), ``processes`` as its pids
(threads included), ``cpuMillicores`` as its CPU rate. The launcher writes itself into the
cgroup before anything else (its ``cgroup`` policy), so the agent and all it starts are counted.
After the agent ends the runner reads the cgroup's events (:func:`read_events`: an OOM kill, a
refused fork) to name the limit a job hit, kills what is left in it and removes it
(:func:`remove_job_cgroup`). A runner that was killed could not; when it starts again (the same
runner: no two hold its Lease) it removes every cgroup of its own it finds
(:func:`remove_stale_job_cgroups`), never another runner's.

``decide_*`` are pure; ``probe_*``, ``ensure_*``, ``read_*`` and ``remove_*`` touch ``/sys/fs/cgroup``.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from helmhive.api.runner import CgroupMode
from helmhive.api.runnerpool import JobLimits

__all__ = [
    "CgroupEvents",
    "CgroupSupport",
    "JobCgroup",
    "build_cgroup_prefix",
    "decide_cgroup_hit",
    "ensure_job_cgroup",
    "probe_cgroups",
    "read_events",
    "remove_job_cgroup",
    "remove_stale_job_cgroups",
]

_ROOT = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000
_MIB = 1024 * 1024


class _V1(enum.StrEnum):
    MEMORY = "memory"
    PIDS = "pids"
    CPU = "cpu"


@dataclass(frozen=True, kw_only=True)
class CgroupSupport:
    """What the probe found: where job cgroups go (the runner's own cgroup(s)), or why none."""

    mode: CgroupMode
    reason: str
    parents: Mapping[str, Path] = field(default_factory=dict)
    """v2: ``{"unified": dir}``; v1: ``{"memory": dir, "pids": dir, "cpu": dir?}``."""


@dataclass(frozen=True, kw_only=True)
class JobCgroup:
    """One job's cgroup(s), as made."""

    mode: CgroupMode
    dirs: tuple[Path, ...]
    limits: JobLimits
    cpu: bool = False
    """Whether the CPU rate is bounded (v1 needs a writable ``cpu`` hierarchy; v2 the ``cpu`` controller)."""

    @property
    def procs_files(self) -> tuple[str, ...]:
        """What the launcher writes its pid into."""
        return tuple(str(d / "cgroup.procs") for d in self.dirs)

    def describe(self) -> str:
        """One line for the job's Running message."""
        cpu = f", cpu {self.limits.cpu_millicores}m" if self.cpu else ", cpu rate not limited"
        memory = self.limits.memory_bytes // _MIB
        return f"cgroup {self.mode.value}: memory {memory} MiB, processes {self.limits.processes} per job{cpu}"


@dataclass(frozen=True, kw_only=True)
class CgroupEvents:
    """What the kernel counted in a job's cgroup."""

    oom_kills: int = 0
    pids_refused: int = 0


def _own_paths(proc_cgroup: Path) -> dict[str, str]:
    """``/proc/self/cgroup`` as ``{controller or "unified": path}``."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in proc_cgroup.read_text(encoding="utf-8").splitlines():
            number, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if number == "0" and controllers == "":
                paths["unified"] = path
            for name in controllers.split(","):
                if name:
                    paths[name] = path
    return paths


def _try_child(parent: Path) -> str | None:
    """Make and remove a probe child cgroup; None if that works, else why not."""
    probe = parent / f"helmhive-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"cannot create a cgroup in {parent}: {exc.strerror or exc}"
    with contextlib.suppress(OSError):
        probe.rmdir()
    return None


def _probe_v2(root: Path, own: str | None) -> CgroupSupport | str:
    if own is None:
        return "no cgroup v2 path in /proc/self/cgroup"
    mounts = [m for m in (root, root / "unified") if (m / "cgroup.controllers").exists()]
    if not mounts:
        return "no cgroup v2 hierarchy is mounted"
    parent = mounts[0] / own.lstrip("/")
    try:
        available = (parent / "cgroup.controllers").read_text(encoding="ascii").split()
    except OSError as exc:
        return f"cannot read {parent}/cgroup.controllers: {exc.strerror or exc}"
    missing = [c for c in ("memory", "pids") if c not in available]
    if missing:
        return f"the cgroup v2 controllers {', '.join(missing)} are not available in {parent}"
    if not os.access(parent, os.W_OK):
        return f"the runner's cgroup v2 {parent} is not writable (not delegated to the pod)"
    control = parent / "cgroup.subtree_control"
    try:
        enabled = control.read_text(encoding="ascii").split()
        wanted = [c for c in ("memory", "pids", "cpu") if c in available and c not in enabled]
        if wanted:
            control.write_text(" ".join(f"+{c}" for c in wanted), encoding="ascii")
    except OSError as exc:
        return f"cannot enable the memory and pids controllers for children of {parent}: {exc.strerror or exc}"
    problem = _try_child(parent)
    if problem is not None:
        return problem
    return CgroupSupport(mode=CgroupMode.V2, reason=f"job cgroups under {parent}", parents={"unified": parent})


def _probe_v1(root: Path, own: Mapping[str, str]) -> CgroupSupport | str:
    parents: dict[str, Path] = {}
    for controller in _V1:
        path = own.get(controller.value)
        base = root / controller.value
        if path is None or not (base / "cgroup.procs").exists():
            if controller is _V1.CPU:
                continue
            return f"no cgroup v1 {controller.value} hierarchy"
        parent = base / path.lstrip("/")
        problem = _try_child(parent)
        if problem is not None:
            if controller is _V1.CPU:
                continue
            return problem
        parents[controller.value] = parent
    where = ", ".join(str(p) for p in parents.values())
    return CgroupSupport(mode=CgroupMode.V1, reason=f"job cgroups under {where}", parents=parents)


def probe_cgroups(root: Path = _ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> CgroupSupport:
    """Which per-job cgroups this runner can make (v2 preferred, then v1), or why none."""
    own = _own_paths(proc_cgroup)
    v2 = _probe_v2(root, own.get("unified"))
    if isinstance(v2, CgroupSupport):
        return v2
    v1 = _probe_v1(root, own)
    if isinstance(v1, CgroupSupport):
        return v1
    return CgroupSupport(mode=CgroupMode.NONE, reason=f"v2: {v2}; v1: {v1}"[:500])


def _write(path: Path, value: str) -> None:
    path.write_text(value, encoding="ascii")


def _settings(mode: CgroupMode, controller: str, limits: JobLimits) -> list[tuple[str, str, bool]]:
    """(file, value, required) for one cgroup directory."""
    quota = str(limits.cpu_millicores * _PERIOD_US // 1000)
    memory = str(limits.memory_bytes)
    if mode is CgroupMode.V2:
        return [
            ("memory.max", memory, True),
            ("memory.swap.max", "0", False),
            ("pids.max", str(limits.processes), True),
            ("cpu.max", f"{quota} {_PERIOD_US}", False),
        ]
    return {
        "memory": [("memory.limit_in_bytes", memory, True), ("memory.memsw.limit_in_bytes", memory, False)],
        "pids": [("pids.max", str(limits.processes), True)],
        "cpu": [("cpu.cfs_period_us", str(_PERIOD_US), True), ("cpu.cfs_quota_us", quota, True)],
    }[controller]


def build_cgroup_prefix(*, namespace: str, runner: str) -> str:
    """``helmhive-<12 hex>-``: the start of every job cgroup of one runner (pure; a digest, as
    namespace and name together may be longer than a cgroup name should be)."""
    return "helmhive-" + hashlib.sha256(f"{namespace}/{runner}".encode()).hexdigest()[:12] + "-"


def ensure_job_cgroup(*, support: CgroupSupport, prefix: str, uid: str, limits: JobLimits) -> JobCgroup | None:
    """Make the job's cgroup(s) with its limits (a stale one of the same job is replaced); None
    without cgroups. Raises :class:`OSError` if a required limit cannot be set (the job fails closed)."""
    if support.mode is CgroupMode.NONE:
        return None
    name = prefix + uid.replace("-", "")[:32]
    dirs: list[Path] = []
    cpu = False
    try:
        for controller, parent in support.parents.items():
            directory = parent / name
            if directory.exists():
                _remove(directory)
            directory.mkdir()
            dirs.append(directory)
            for filename, value, required in _settings(support.mode, controller, limits):
                try:
                    _write(directory / filename, value)
                    cpu = cpu or filename.startswith("cpu.")
                except OSError:
                    if required:
                        raise
    except OSError:
        for directory in dirs:
            _remove(directory)
        raise
    return JobCgroup(mode=support.mode, dirs=tuple(dirs), limits=limits, cpu=cpu)


def _counter(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def read_events(cgroup: JobCgroup) -> CgroupEvents:
    """The OOM kills and refused forks counted in the job's cgroup so far."""
    oom = pids = 0
    for directory in cgroup.dirs:
        if cgroup.mode is CgroupMode.V2:
            oom += _counter(directory / "memory.events", "oom_kill")
        else:
            oom += _counter(directory / "memory.oom_control", "oom_kill")
        pids += _counter(directory / "pids.events", "max")
    return CgroupEvents(oom_kills=oom, pids_refused=pids)


def decide_cgroup_hit(*, events: CgroupEvents, cgroup: JobCgroup) -> tuple[str, str] | None:
    """``(resource, message)`` for the job total the kernel enforced, or None (pure)."""
    if events.oom_kills:
        memory = cgroup.limits.memory_bytes // _MIB
        return "memory", (
            f"the job used up its {memory} MiB of memory (cgroup {cgroup.mode.value}, all its processes together); "
            f"the kernel killed {events.oom_kills} of its processes"
        )
    if events.pids_refused:
        return "processes", (
            f"the job reached its {cgroup.limits.processes} processes and threads (cgroup {cgroup.mode.value}); "
            f"the kernel refused {events.pids_refused} fork(s)"
        )
    return None


def _kill_all(directory: Path) -> None:
    kill = directory / "cgroup.kill"
    if kill.exists():
        with contextlib.suppress(OSError):
            _write(kill, "1")
            return
    with contextlib.suppress(OSError, ValueError):
        for pid in (directory / "cgroup.procs").read_text(encoding="ascii").split():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)


REMOVE_SECONDS = 30.0
"""How long removing a job cgroup keeps trying: killed processes leave it only once the kernel
has reaped them, which on a loaded node took more than the 2.5 s this waited before."""


def _remove(directory: Path, *, within: float = REMOVE_SECONDS) -> bool:
    deadline = time.monotonic() + within
    pause = 0.05
    while True:
        _kill_all(directory)
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)  # killed processes leave the cgroup when the kernel has reaped them
            pause = min(pause * 2, 0.5)


def remove_job_cgroup(cgroup: JobCgroup) -> bool:
    """Kill what is left in the job's cgroup(s) and remove them; False if one would not go."""
    return all([_remove(directory) for directory in cgroup.dirs])


def remove_stale_job_cgroups(*, support: CgroupSupport, prefix: str) -> int:
    """Empty and remove every job cgroup of this runner (``prefix``) left by an earlier run of it;
    return how many directories went. Call it before the runner runs a job."""
    removed = 0
    for parent in support.parents.values():
        with contextlib.suppress(OSError):
            for directory in parent.glob(prefix + "*"):
                if directory.is_dir() and _remove(directory):
                    removed += 1
    return removed

"""The per-job sandbox plan, pure: :class:`SandboxPlan` and :func:`build_sandbox_plan`, the paths
every agent may read, the job's tools, and :func:`sandbox_refusal` (what fails a job closed).

What the sandbox is and enforces: :mod:`helmhive.runner.sandbox.workdir`, which re-exports this module
and turns a plan into the launcher and the job's directory.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.runner import NetworkIsolation
from helmhive.api.runnerpool import AdapterType
from helmhive.runner.config import LandlockMode, SandboxSettings
from helmhive.runner.sandbox.limits import EnforcedLimits
from helmhive.runner.sandbox.seccomp import SUPPORTED_MACHINES

__all__ = [
    "DEVICE_PATHS",
    "HOMES_DIR",
    "SOURCE_CACHE_DIR",
    "SYSTEM_READ_PATHS",
    "SandboxPlan",
    "build_allowed_tools",
    "build_sandbox_plan",
    "homes_dir",
    "job_dir_name",
    "runtime_read_paths",
    "sandbox_refusal",
    "source_cache_dir",
]

SYSTEM_READ_PATHS = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
    "/nix/store",
)
"""What every agent may read: programs, libraries, configuration. Not ``/var``, ``/run``, ``/home``,
``/root`` or ``/tmp`` (ServiceAccount tokens and other processes' files live there)."""

DEVICE_PATHS = ("/dev",)
SOURCE_CACHE_DIR = "source-cache"
"""Below the runner's state dir: the git objects fetched for exact sources, shared by its jobs."""
HOMES_DIR = "homes"
"""Below the runner's state dir: one directory per session binding, its ``home/`` the binding's jobs' HOME."""

# The Claude CLI names its tools instead of using ACP's tool kinds.
_CLAUDE_TOOLS: dict[ToolKind, tuple[str, ...]] = {
    ToolKind.READ: ("Read",),
    ToolKind.SEARCH: ("Glob", "Grep"),
    ToolKind.THINK: ("TodoWrite",),
    ToolKind.EDIT: ("Edit", "MultiEdit", "Write", "NotebookEdit"),
    ToolKind.EXECUTE: ("Bash",),
    ToolKind.FETCH: ("WebFetch", "WebSearch"),
}


@dataclass(frozen=True, kw_only=True)
class SandboxPlan:
    """Everything that bounds one job's agent."""

    root: Path
    workdir: Path
    tmpdir: Path
    home: Path
    filesystem: FilesystemAccess
    network: NetworkAccess
    allowed_tools: frozenset[str]
    read_paths: tuple[str, ...]
    write_paths: tuple[str, ...]
    device_paths: tuple[str, ...]
    tcp_connect: tuple[int, ...] | None
    """None: TCP not restricted; a tuple: ``connect`` only to these ports, no ``bind``."""
    landlock: bool
    """Whether the agent runs under Landlock (False only with ``landlock: optional`` and no kernel support)."""
    exposed: tuple[str, ...] = ()
    """Protected paths (the runner's credential copy, its kubeconfig) that a granted path would expose."""
    binding: str | None = None
    """The session binding whose HOME the job uses; None: a HOME of its own, removed with the job."""
    limits: EnforcedLimits | None = None
    """The resource limits the launcher applies to the agent and the checks (None: none)."""
    datagrams: bool = True
    """False: the launcher's seccomp filter leaves the agent TCP streams and local sockets only."""
    egress_port: int | None = None
    """The port the agent's provider base URL names (the job's own listener, or its relay's)."""
    relay_socket: str | None = None
    """The job's UNIX socket on the egress proxy: the agent runs in a network namespace of its own and a
    relay on ``127.0.0.1:<egress_port>`` there is its only way out. None: no namespace."""
    cgroup_procs: tuple[str, ...] = ()
    """The job cgroup(s) the launcher joins (:mod:`helmhive.runner.sandbox.cgroups`); empty: none."""

    @property
    def network_isolation(self) -> NetworkIsolation:
        """What confines the agent's network (Namespace, Landlock's port rule, or None)."""
        if self.tcp_connect is None:
            return NetworkIsolation.NONE
        return NetworkIsolation.NAMESPACE if self.relay_socket is not None else NetworkIsolation.LANDLOCK

    @property
    def fs_access(self) -> str:
        return self.filesystem.value

    @property
    def git_dir(self) -> Path:
        """The git dir of the job's checkout in ``workdir`` (outside it, never granted)."""
        return self.root / "source.git"

    @property
    def scratch(self) -> Path:
        """The runner's own files for this job (a private index, a patch file), never granted."""
        return self.root / "runner"


def source_cache_dir(state_dir: Path) -> Path:
    return state_dir / SOURCE_CACHE_DIR


def homes_dir(state_dir: Path) -> Path:
    """``<state>/homes``: each session binding's directory, ``<binding>/home`` being its HOME."""
    return state_dir / HOMES_DIR


def job_dir_name(*, namespace: str, name: str, uid: str) -> str:
    """A per-job directory name that two jobs never share (the uid tells re-created jobs apart)."""
    return f"{namespace}.{name}"[:200] + "." + uid.replace("-", "")[:8]


def build_allowed_tools(
    *, tools: Iterable[ToolKind], network: NetworkAccess, adapter_type: AdapterType
) -> frozenset[str]:
    """The allow-list of one turn: the profile's tool kinds, never ``fetch`` without network."""
    kinds = [t for t in tools if not (t is ToolKind.FETCH and network is NetworkAccess.DISABLED)]
    allowed = {f"kind:{kind.value}" for kind in kinds}
    if adapter_type is AdapterType.CLAUDE_CLI:
        allowed |= {name for kind in kinds for name in _CLAUDE_TOOLS.get(kind, ())}
    return frozenset(allowed)


def runtime_read_paths() -> tuple[str, ...]:
    """This interpreter's own install (prefixes and import path), which the launcher and Python agents need.

    Not the working directory (``python -m`` puts it on the import path), which is the runner's, not the runtime's.
    """
    cwd = os.getcwd()
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path]
    return tuple(dict.fromkeys(p for p in candidates if p and os.path.isabs(p) and p != cwd))


def _contains(parent: str, child: str) -> bool:
    parent, child = os.path.normpath(parent), os.path.normpath(child)
    return parent in ("/", child) or child.startswith(parent + os.sep)


def build_sandbox_plan(
    *,
    state_dir: Path,
    job_dir: str,
    filesystem: FilesystemAccess,
    network: NetworkAccess,
    tools: Sequence[ToolKind],
    adapter_type: AdapterType,
    settings: SandboxSettings,
    runtime_paths: Sequence[str],
    credential_dir: Path | None,
    landlock_abi: int,
    protected: Sequence[Path] = (),
    binding: str | None = None,
    limits: EnforcedLimits | None = None,
    egress_port: int | None = None,
    relay_socket: Path | None = None,
    cgroup_procs: Sequence[str] = (),
) -> SandboxPlan:
    """The sandbox of one job (pure). Raises nothing: whether it may run is :func:`sandbox_refusal`'s call.

    ``protected`` are the runner's own secrets on disk (its credential copy and file, its
    kubeconfig): runtime paths that hold one are left out, and any other granted path that
    holds one is reported in ``exposed`` (the job then fails closed). ``binding`` names the
    session binding whose HOME the job shares (None: a HOME of its own in the job's directory).
    ``egress_port`` is the job's port on the egress proxy (``credentialIsolation: Proxy``): with the
    network disabled it is the only port the agent may connect to, and it gets no datagram sockets;
    with ``relay_socket`` too (the job's UNIX socket on the proxy) the agent also runs in a network
    namespace of its own whose only way out is a relay to that socket. ``cgroup_procs``: the job's
    cgroup(s), which the launcher joins.
    """
    root = state_dir / "jobs" / job_dir
    home = homes_dir(state_dir) / binding / "home" if binding else root / "home"
    workdir, tmpdir = root / "work", root / "tmp"
    # The runner's git state is not a secret, but the agent must not reach it: it could
    # rewrite what the patch is computed against.
    private = (root / "source.git", root / "runner", source_cache_dir(state_dir))
    secrets = [str(p) for p in (*protected, *private)]
    runtime = [p for p in runtime_paths if not any(_contains(p, secret) for secret in secrets)]
    read = [*SYSTEM_READ_PATHS, *runtime, *settings.read_paths]
    write = [str(home), str(tmpdir), *settings.write_paths]
    if credential_dir is not None:
        write.append(str(credential_dir))  # a subscription login refreshes its tokens
    if filesystem is FilesystemAccess.WRITE:
        write.append(str(workdir))
    elif filesystem is FilesystemAccess.READ:
        read.append(str(workdir))
    disabled = network is NetworkAccess.DISABLED
    tcp = _tcp_ports(settings, egress_port) if disabled and landlock_abi >= 4 else None
    relay = str(relay_socket) if tcp is not None and egress_port is not None and relay_socket is not None else None
    exposed = sorted({secret for secret in secrets for path in [*read, *write] if _contains(path, secret)})
    return SandboxPlan(
        root=root,
        workdir=workdir,
        tmpdir=tmpdir,
        home=home,
        filesystem=filesystem,
        network=network,
        allowed_tools=build_allowed_tools(tools=tools, network=network, adapter_type=adapter_type),
        read_paths=tuple(dict.fromkeys(read)),
        write_paths=tuple(dict.fromkeys(write)),
        device_paths=DEVICE_PATHS,
        tcp_connect=tcp,
        landlock=landlock_abi >= 1,
        exposed=tuple(exposed),
        binding=binding,
        limits=limits,
        datagrams=not (disabled and egress_port is not None),
        egress_port=egress_port,
        relay_socket=relay,
        cgroup_procs=tuple(cgroup_procs),
    )


def _tcp_ports(settings: SandboxSettings, egress_port: int | None) -> tuple[int, ...]:
    return (egress_port,) if egress_port is not None else tuple(settings.provider_ports)


def sandbox_refusal(
    *,
    plan: SandboxPlan,
    settings: SandboxSettings,
    landlock_abi: int,
    machine: str | None = None,
    require_namespace: bool = False,
    namespace_note: str = "",
) -> str | None:
    """Why the job must not run in this sandbox (None: it may). Fails closed by default.

    ``require_namespace`` (the pool's ``egress.networkNamespace: Required``): a job whose network is
    disabled must get a network namespace; ``namespace_note`` says why this runner cannot make one."""
    machine = machine or platform.machine()
    if require_namespace and plan.network is NetworkAccess.DISABLED and plan.relay_socket is None:
        why = namespace_note or "the job's agent would not run in one"
        return f"egress.networkNamespace is Required, but no network namespace is possible here: {why}"
    if plan.landlock and machine not in SUPPORTED_MACHINES:  # the launcher's filter; checks always need it
        return f"no seccomp filter for machine {machine} (only {', '.join(SUPPORTED_MACHINES)})"
    if plan.landlock and plan.exposed:
        return f"the agent could read the runner's own secrets at {', '.join(plan.exposed)}; move them out of its paths"
    if settings.landlock is LandlockMode.OPTIONAL:
        return None
    if landlock_abi < 1:
        return "Landlock is not available in this kernel, and runner.json requires it (sandbox.landlock)"
    if plan.network is NetworkAccess.DISABLED and landlock_abi < 4:
        return f"the network is disabled but Landlock ABI {landlock_abi} cannot restrict TCP (needs ABI 4)"
    return None

"""The job sandbox: a per-job working directory and HOME, the tools offered, the agent's Landlock policy and limits.

Each job gets ``<state>/jobs/<namespace>.<name>.<uid8>/`` with ``work/`` (the agent's cwd and
the only place its ``fs/*`` client methods reach) and ``tmp/`` (its ``TMPDIR``). Its ``HOME`` is
its session binding's, ``<state>/homes/<binding>/home/``, kept while the binding lives (a resumed
agent finds its settings and session files there; :mod:`helmhive.runner.sessions.bindings` removes it when
the binding is reset or deleted), or for a job without a binding its own ``home/`` in the job's
directory, removed with it. A job is granted its own HOME and no other. A job with an
exact source also has ``source.git/`` (the git dir of the checkout in ``work/``, which holds no
``.git``) and ``runner/`` (the runner's scratch: a private index, the patch file); neither, nor
the runner's ``<state>/source-cache/``, is ever granted to the agent or a check. What the agent
may do follows the job's *effective profile* (the snapshot bound at queue time):

============  ===========================================================================
filesystem    ``write``: ``work/`` writable. ``read``: ``work/`` made read-only (mode bits) and
              only readable under Landlock. ``none``: ``work/`` is empty and not even readable.
tools         only the profile's tool kinds are offered (``kind:<kind>`` for ACP agents, the
              matching tool names for the Claude CLI); every other permission request is denied;
              ``fetch`` is never offered when the network is disabled.
network       ``disabled``: with ``credentialIsolation: Proxy``, where the pod allows it, a network
              namespace of its own whose only way out is a relay to the job's socket on the
              egress proxy (:mod:`helmhive.runner.sandbox.netns`); in any case under Landlock (ABI 4+)
              TCP ``connect`` only to the proxy's port (and no UDP, raw or packet sockets:
              :mod:`helmhive.runner.sandbox.seccomp`), or with ``InSandbox`` to the provider ports
              (default 443); no ``bind``. Without the namespace, hosts are the pod's
              NetworkPolicy's business.
============  ===========================================================================

The agent process is started per job under :mod:`helmhive.runner.sandbox.landlock`, which may read
only the system directories, the runtime's own install, its HOME and the granted paths -- not
the runner's state (the credential copy), not the ServiceAccount token, not other jobs or their
homes -- and runs under the pool's per-job limits (:mod:`helmhive.runner.sandbox.limits`).
See ``docs/security.md`` for exactly what is and is not enforced.

The launcher runs as ``python -P -m helmhive.runner.sandbox.landlock``: ``-P`` keeps the working
directory (the job's checkout, which the repository's authors control) off the import path, so a
planted ``helmhive`` package there cannot run before the ruleset is in force.

The plan is :mod:`helmhive.runner.sandbox.plan`'s (re-exported here); this module turns it
into the launcher and the job's directory. ``build_*`` functions are pure; :func:`create_sandbox`,
:func:`seal_sandbox`, :func:`prepare_sandbox` and :func:`remove_sandbox` touch disk.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

from helmhive.api.common import FilesystemAccess
from helmhive.runner.sandbox.plan import (
    HOMES_DIR,
    SOURCE_CACHE_DIR,
    SYSTEM_READ_PATHS,
    SandboxPlan,
    build_allowed_tools,
    build_sandbox_plan,
    homes_dir,
    job_dir_name,
    runtime_read_paths,
    sandbox_refusal,
    source_cache_dir,
)

__all__ = [
    "HOMES_DIR",
    "SOURCE_CACHE_DIR",
    "SYSTEM_READ_PATHS",
    "SandboxPlan",
    "build_allowed_tools",
    "build_check_policy",
    "build_landlock_policy",
    "build_launcher",
    "build_sandbox_plan",
    "build_wrapper",
    "create_sandbox",
    "homes_dir",
    "job_dir_name",
    "prepare_sandbox",
    "remove_sandbox",
    "runtime_read_paths",
    "sandbox_refusal",
    "seal_sandbox",
    "source_cache_dir",
]


def _limits_policy(plan: SandboxPlan) -> dict[str, Any]:
    cgroup = {"cgroup": list(plan.cgroup_procs)} if plan.cgroup_procs else {}
    if plan.limits is None:
        return cgroup
    return {
        "rlimits": plan.limits.rlimits(),
        "userNamespace": plan.limits.user_namespace,
        "pidNamespace": plan.limits.pid_namespace,
        "readOnly": plan.limits.read_only,
        **cgroup,
    }


def build_landlock_policy(plan: SandboxPlan) -> dict[str, Any]:
    """The policy :mod:`helmhive.runner.sandbox.landlock` applies to the agent process."""
    return {
        "read": list(plan.read_paths),
        "write": list(plan.write_paths),
        "devices": list(plan.device_paths),
        "tcpConnect": None if plan.tcp_connect is None else list(plan.tcp_connect),
        "datagrams": plan.datagrams,
        **_limits_policy(plan),
        **({"relay": {"port": plan.egress_port, "socket": plan.relay_socket}} if plan.relay_socket else {}),
    }


def build_check_policy(plan: SandboxPlan) -> dict[str, Any]:
    """The policy a check runs under: the agent's reads, writes only in the tree and the job's tmp,
    no TCP ``connect`` at all and no ``bind`` (no provider port either: a check needs none), and
    the agent's resource limits."""
    return {
        "read": list(plan.read_paths),
        "write": [str(plan.workdir), str(plan.tmpdir)],
        "devices": list(plan.device_paths),
        "tcpConnect": [],
        "datagrams": plan.datagrams,
        **_limits_policy(plan),
    }


def build_launcher(policy: dict[str, Any], *, python: str = sys.executable) -> tuple[str, ...]:
    """``python -P -m helmhive.runner.sandbox.landlock --policy JSON --``: the prefix of a sandboxed command.

    ``-P``: the command's working directory is the job's checkout; it must not be on the
    launcher's import path."""
    encoded = json.dumps(policy, separators=(",", ":"))
    return (python, "-P", "-m", "helmhive.runner.sandbox.landlock", "--policy", encoded, "--")


def build_wrapper(plan: SandboxPlan, *, python: str = sys.executable) -> tuple[str, ...]:
    """The launcher prefix for the agent's command line (empty when running without Landlock)."""
    if not plan.landlock:
        return ()
    return build_launcher(build_landlock_policy(plan), python=python)


def _chmod_tree(path: Path, *, writable: bool) -> None:
    for current, dirs, files in os.walk(path):
        for name in files:
            target = Path(current, name)
            if not target.is_symlink():
                mode = target.stat().st_mode
                target.chmod((mode | stat.S_IWUSR) if writable else (mode & ~0o222))
        for name in dirs:
            target = Path(current, name)
            if not target.is_symlink():
                target.chmod(0o755 if writable else 0o555)
    path.chmod(0o755 if writable else 0o555)


def create_sandbox(plan: SandboxPlan) -> None:
    """Create the job's directories afresh (an empty, writable ``workdir`` for the checkout).

    A binding's HOME is kept as it is (it was checked against the binding before: see
    :func:`helmhive.runner.sessions.bindings.ensure_session_home`); a job's own HOME starts empty."""
    remove_sandbox(plan)
    plan.workdir.mkdir(parents=True, exist_ok=True)
    plan.tmpdir.mkdir(parents=True, exist_ok=True)
    plan.scratch.mkdir(parents=True, exist_ok=True)
    plan.home.mkdir(parents=True, exist_ok=True)
    plan.tmpdir.chmod(0o700)
    plan.scratch.chmod(0o700)
    plan.home.chmod(0o700)


def seal_sandbox(plan: SandboxPlan) -> None:
    """Apply the filesystem mode to ``workdir`` and all it holds: read-only unless ``write``."""
    _chmod_tree(plan.workdir, writable=plan.filesystem is FilesystemAccess.WRITE)


def prepare_sandbox(plan: SandboxPlan) -> None:
    """Create the job's directories; a read or none workspace is made read-only (mode bits too)."""
    create_sandbox(plan)
    seal_sandbox(plan)


def remove_sandbox(plan: SandboxPlan) -> None:
    """Delete the job's directories (read-only ones included)."""
    if plan.root.exists():
        _chmod_tree(plan.root, writable=True)
        shutil.rmtree(plan.root, ignore_errors=True)

"""A Docker engine to build images and run kind's nodes: the user's own, or one started here.

:func:`ensure_engine` returns a working engine, in this order:

1. ``docker info`` answers: the user's engine is used as it is.
2. Otherwise ``dockerd`` is started (installed first from Debian's ``docker.io`` when missing and
   we are root), logging to ``<state>/dockerd.log``.

kind's nodes are ``--privileged`` containers. Docker asks the kernel for every capability it
knows, so where ``CAP_SYS_RESOURCE`` is missing from this process's bounding set (some VMs and
sandboxes), runc fails with ``unable to apply caps``. Only then is dockerd started with a small
OCI runtime wrapper as its default runtime (:data:`WRAPPER`): it removes that one capability from
the container's spec and execs runc. A user's engine that fails a privileged container is
reported, not reconfigured.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from helmhive.devcluster.progress import step

__all__ = ["WRAPPER", "Engine", "EngineError", "decide_needs_cap_wrapper", "ensure_engine", "ensure_host_packages"]

CAP_SYS_RESOURCE = 24
RUNTIME_NAME = "helmhive-runc"

WRAPPER = '''#!/usr/bin/python3 -S
"""OCI runtime wrapper (written by helmhive): drop CAP_SYS_RESOURCE, which this host cannot grant, then exec runc."""
import json, os, sys

args = sys.argv[1:]


def value(flags):
    for i, arg in enumerate(args):
        for flag in flags:
            if arg == flag and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def strip(process):
    caps = process.get("capabilities") or {}
    for key, names in list(caps.items()):
        if isinstance(names, list):
            caps[key] = [n for n in names if n != "CAP_SYS_RESOURCE"]


command = next((a for a in args if a in ("create", "run", "exec")), None)
path = None
if command in ("create", "run"):
    path = os.path.join(value(("--bundle", "-b")) or os.getcwd(), "config.json")
elif command == "exec":
    path = value(("--process", "-p"))
if path and os.path.isfile(path):
    with open(path) as f:
        spec = json.load(f)
    strip(spec.get("process", spec) if command != "exec" else spec)
    with open(path, "w") as f:
        json.dump(spec, f)
os.execv(RUNC, [RUNC] + args)
'''


class EngineError(RuntimeError):
    """No Docker engine could be found or started; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class Engine:
    """A Docker engine that answers ``docker info``."""

    docker: str
    started_here: bool
    cap_wrapper: bool
    server_version: str


def decide_needs_cap_wrapper(proc_status: str) -> bool:
    """True when ``CapBnd`` in a ``/proc/<pid>/status`` text lacks CAP_SYS_RESOURCE."""
    for line in proc_status.splitlines():
        if line.startswith("CapBnd:"):
            return not (int(line.split()[1], 16) >> CAP_SYS_RESOURCE) & 1
    return False


def _docker() -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise EngineError("no `docker` client on PATH; install Docker (on Debian: apt-get install docker.io)")
    return docker


def _server_version(docker: str) -> str | None:
    out = subprocess.run(
        [docker, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _apt_install(packages: list[str], log: TextIO) -> None:
    if shutil.which("apt-get") is None:
        raise EngineError(f"missing {', '.join(packages)}, and there is no apt-get to install them; install them first")
    if os.geteuid() != 0:
        raise EngineError(
            f"missing {', '.join(packages)}; install them (apt-get install {' '.join(packages)}) or run as root"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "-o", "Dpkg::Options::=--force-confold", *packages],
    ):
        with step(log, f"apt-get: {' '.join(cmd[1:3])} {' '.join(packages)}"):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise EngineError(f"{' '.join(cmd)} failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")


def ensure_host_packages(commands: dict[str, str], log: TextIO) -> None:
    """Install from Debian the package of each command (``{command: package}``) that is not on PATH."""
    missing = sorted({pkg for cmd, pkg in commands.items() if shutil.which(cmd) is None and not Path(cmd).exists()})
    if missing:
        _apt_install(missing, log)


def _write_wrapper(state_dir: Path) -> Path:
    runc = shutil.which("runc") or "/usr/sbin/runc"
    wrapper = state_dir / "runc-wrapper"
    wrapper.write_text(WRAPPER.replace("RUNC, [RUNC]", f"{runc!r}, [{runc!r}]"), encoding="utf-8")
    wrapper.chmod(0o755)
    return wrapper


def _start_dockerd(state_dir: Path, log: TextIO, *, cap_wrapper: bool) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    cmd = [shutil.which("dockerd") or "/usr/sbin/dockerd", "--pidfile", str(state_dir / "dockerd.pid")]
    if cap_wrapper:
        cmd += ["--add-runtime", f"{RUNTIME_NAME}={_write_wrapper(state_dir)}", "--default-runtime", RUNTIME_NAME]
    logfile = (state_dir / "dockerd.log").open("ab")
    log.write(
        f"starting dockerd ({'with' if cap_wrapper else 'without'} the CAP_SYS_RESOURCE runtime wrapper); "
        f"log: {state_dir / 'dockerd.log'}\n"
    )
    log.flush()
    subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def ensure_engine(state_dir: Path, log: TextIO, *, timeout: float = 90.0) -> Engine:
    """Return a working engine, starting (and if need be installing) dockerd when none answers."""
    docker = shutil.which("docker")
    if docker is not None and (version := _server_version(docker)) is not None:
        return Engine(docker=docker, started_here=False, cap_wrapper=False, server_version=version)
    if shutil.which("dockerd") is None:
        _apt_install(["docker.io"], log)
    docker = _docker()
    cap_wrapper = decide_needs_cap_wrapper(Path("/proc/self/status").read_text(encoding="utf-8"))
    _start_dockerd(state_dir, log, cap_wrapper=cap_wrapper)
    deadline = time.monotonic() + timeout
    with step(log, "waiting for dockerd to answer"):
        while time.monotonic() < deadline:
            if (version := _server_version(docker)) is not None:
                return Engine(docker=docker, started_here=True, cap_wrapper=cap_wrapper, server_version=version)
            time.sleep(0.5)
    tail = (state_dir / "dockerd.log").read_text(encoding="utf-8", errors="replace")[-2000:]
    raise EngineError(f"dockerd did not answer within {timeout:.0f} s; {state_dir / 'dockerd.log'}:\n{tail}")

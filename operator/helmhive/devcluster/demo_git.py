"""The demo's git server: a small repository made on the spot and served by ``git daemon`` on loopback.

The governed change in the demo needs an exact source. This module builds a tiny repository
(``<state>/demo-git/shop.git``, one commit with fixed author and dates, so its commit id is
the same on every machine), and serves it read-only with ``git daemon`` on a free port on
127.0.0.1, recorded in ``<state>/pids`` like the other demo processes so ``helmhive demo --stop``
stops it. Nothing leaves the machine.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from helmhive.devcluster.procs import free_ports, is_alive, read_record, spawn, terminate

__all__ = ["DEMO_FILES", "GIT_DAEMON_PROCESS", "ensure_demo_repository", "ensure_git_daemon", "stop_git_daemon"]

GIT_DAEMON_PROCESS = "helmhive-demo-git-daemon"
DEMO_FILES: dict[str, str] = {
    "refunds.py": (
        '"""Refunds for the demo shop."""\n\n\n'
        "def refund(order_id: str, amount: int) -> dict[str, object]:\n"
        '    return {"order": order_id, "amount": amount}\n'
    ),
    "README.md": "# shop\n\nA tiny repository made by `helmhive demo`.\n",
}
_FIXED = {
    "GIT_AUTHOR_NAME": "Helmhive demo",
    "GIT_AUTHOR_EMAIL": "demo@helmhive.invalid",
    "GIT_COMMITTER_NAME": "Helmhive demo",
    "GIT_COMMITTER_EMAIL": "demo@helmhive.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


def _git(*args: str, cwd: Path) -> str:
    env = {**os.environ, **_FIXED, "HOME": str(cwd)}
    out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


def ensure_demo_repository(state_dir: Path) -> tuple[Path, str]:
    """The bare repository and its one commit id (made once; the same id on every machine)."""
    root = state_dir / "demo-git"
    bare = root / "shop.git"
    if (bare / "HEAD").exists():
        return bare, _git("rev-parse", "HEAD", cwd=bare)
    work = root / "work"
    work.mkdir(parents=True, exist_ok=True)
    _git("init", "--quiet", "--initial-branch=main", cwd=work)
    for name, text in DEMO_FILES.items():
        (work / name).write_text(text, encoding="utf-8")
    _git("add", "-A", cwd=work)
    _git("commit", "--quiet", "-m", "The demo shop", cwd=work)
    _git("clone", "--quiet", "--bare", str(work), str(bare), cwd=root)
    _git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=bare)
    (bare / "git-daemon-export-ok").touch()
    return bare, _git("rev-parse", "HEAD", cwd=bare)


def ensure_git_daemon(state_dir: Path, repository: Path) -> str:
    """Serve ``repository``'s folder with ``git daemon`` on loopback (reused when running); its URL."""
    pid_dir, port_file = state_dir / "pids", state_dir / "demo-git" / "port"
    record = read_record(pid_dir, GIT_DAEMON_PROCESS)
    if record is not None and is_alive(record.pid, record.start_ticks) and port_file.exists():
        return f"git://127.0.0.1:{port_file.read_text().strip()}/{repository.name}"
    (port,) = free_ports(1)
    argv = [
        "git",
        "daemon",
        "--reuseaddr",
        "--listen=127.0.0.1",
        f"--port={port}",
        f"--base-path={repository.parent}",
        "--export-all",
        str(repository.parent),
    ]
    record = spawn(GIT_DAEMON_PROCESS, argv, log_path=state_dir / "logs" / "git-daemon.log", pid_dir=pid_dir)
    port_file.write_text(str(port))
    url = f"git://127.0.0.1:{port}/{repository.name}"
    for _ in range(100):
        probe = subprocess.run(["git", "ls-remote", url], capture_output=True, timeout=30, check=False)
        if probe.returncode == 0:
            return url
        time.sleep(0.1)
    raise RuntimeError(f"git daemon did not answer on port {port}; see {state_dir / 'logs' / 'git-daemon.log'}")


def stop_git_daemon(state_dir: Path) -> bool:
    record = read_record(state_dir / "pids", GIT_DAEMON_PROCESS)
    return terminate(record) if record is not None else False

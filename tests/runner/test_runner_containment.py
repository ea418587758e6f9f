"""The pieces that contain a job, each on its own: the launcher's pid namespace and read-only view,
its per-file size limit, the disk measurement, and the egress listener's peer check and revocation.

The whole runner is driven through them in ``test_security_escape_findings.py``; here each one is
shown directly, with real processes, mounts and sockets.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import wait_for
from helmhive.runner.egress.proxy import EgressProxy
from helmhive.runner.sandbox.disk import decide_disk_hit, measure_usage
from helmhive.runner.sandbox.mounts import mount_points
from helmhive.runner.sandbox.workdir import SYSTEM_READ_PATHS, runtime_read_paths

MIB = 1024 * 1024


def _launch(policy: dict[str, Any], *command: str) -> subprocess.CompletedProcess[str]:
    launcher = [sys.executable, "-P", "-m", "helmhive.runner.sandbox.landlock", "--policy", json.dumps(policy), "--"]
    return subprocess.run([*launcher, *command], capture_output=True, text=True, timeout=120, check=False)


def _policy(tmp: Path, **extra: Any) -> dict[str, Any]:
    reads = [*SYSTEM_READ_PATHS, *runtime_read_paths()]
    return {"read": reads, "write": [str(tmp)], "devices": ["/dev"], "userNamespace": os.getuid() != 0, **extra}


DAEMON = """
import os, signal, sys, time
if os.fork():
    time.sleep(0.2)
    sys.exit(7)
os.setsid()
if os.fork():
    os._exit(0)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1], "w") as fh:
    fh.write(os.readlink("/proc/self"))
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_in_a_pid_namespace_nothing_of_the_job_outlives_its_agent(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    done = _launch(_policy(tmp_path, pidNamespace=True), sys.executable, "-c", DAEMON, str(pid_file))
    assert done.returncode == 7, done.stderr  # the agent's own exit code, through the init and the waiter
    pid = int(wait_for(pid_file.read_text, timeout=30, describe="the daemon's pid"))
    wait_for(lambda: not _alive(pid), timeout=30, describe="the daemon to be gone")


def test_without_a_pid_namespace_the_daemon_would_stay(tmp_path: Path) -> None:
    """What the pid namespace closes: the same daemon, launched without one, outlives its agent."""
    pid_file = tmp_path / "daemon.pid"
    done = _launch(_policy(tmp_path, pidNamespace=False), sys.executable, "-c", DAEMON, str(pid_file))
    assert done.returncode == 7, done.stderr
    pid = int(wait_for(pid_file.read_text, timeout=30, describe="the daemon's pid"))
    try:
        time.sleep(1)  # not a timing assertion: it is alive well after its agent, and would be forever
        assert _alive(pid)
    finally:
        os.kill(pid, 9)


def test_the_read_only_view_refuses_metadata_changes_outside_the_jobs_own_paths(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.write_text("the runner's\n", encoding="utf-8")
    script = "import os, sys\nfor p in sys.argv[1:]:\n    try:\n        os.chmod(p, 0o600); print('ok')\n"
    script += "    except OSError as e:\n        print(e.errno)\n"
    policy = _policy(tmp_path, readOnly=True) | {"write": [str(mine)], "read": [*_policy(tmp_path)["read"], "/tmp"]}
    done = _launch(policy, sys.executable, "-c", script, str(mine), str(theirs))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "30"]  # EROFS for the file the job may not write


def test_no_file_of_the_job_grows_past_its_disk_limit(tmp_path: Path) -> None:
    script = f"open({str(tmp_path / 'big')!r}, 'wb').write(bytes(3 * {MIB}))"
    done = _launch(_policy(tmp_path, rlimits={"FSIZE": [2 * MIB, 2 * MIB]}), sys.executable, "-c", script)
    assert done.returncode != 0 and "File too large" in done.stderr


def test_the_disk_measure_counts_blocks_once(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(bytes(2 * MIB))
    os.link(tmp_path / "a", tmp_path / "hard")  # the same blocks: counted once
    with (tmp_path / "sparse").open("wb") as fh:  # a hole takes nothing
        fh.seek(64 * MIB)
        fh.write(b"x")
    used = measure_usage([tmp_path, tmp_path])
    assert 2 * MIB <= used < 3 * MIB
    assert decide_disk_hit(used=used, limit=4 * MIB) is None
    assert "over its 1 MiB" in str(decide_disk_hit(used=used, limit=1 * MIB))


def test_mountinfo_is_read_with_the_flags_a_remount_keeps() -> None:
    text = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n28 27 0:25 / /a\\040b ro,nosuid,nodev,noexec - tmpfs t ro\n"
    assert list(mount_points(text)) == [("/", 1 << 21), ("/a b", 2 | 4 | 8)]


async def _ask(path: Path, port: int) -> str:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\ncontent-length: 0\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read(4096)
    writer.close()
    text = answer.decode("latin-1")
    return text.split(" ", 2)[1] + " " + text.rsplit("(", 1)[-1].strip().rstrip(")")


async def test_a_jobs_socket_serves_its_process_only_until_it_is_revoked(tmp_path: Path) -> None:
    proxy = EgressProxy(upstream=None, credential=lambda: None)
    await proxy.start()
    job = await proxy.open_job(socket_path=tmp_path / "job.sock")
    try:
        assert await _ask(tmp_path / "job.sock", job.port) == "403 peer"  # nobody is the job's yet
        job.authorize(lambda pid: pid == os.getpid() + 1)
        assert await _ask(tmp_path / "job.sock", job.port) == "403 peer"  # another process
        job.authorize(lambda pid: pid == os.getpid())
        assert await _ask(tmp_path / "job.sock", job.port) == "403 no-upstream"  # served (there is no upstream here)
        job.revoke()
        assert await _ask(tmp_path / "job.sock", job.port) == "403 revoked"
    finally:
        await job.close()
        await proxy.close()

"""The job pod link end to end: ``helmhive-jobpod shim`` and ``helmhive-jobpod agent`` as real local
processes (temp directories for /job, the link directory and the shim's directory; a random key;
free ports), driven through :class:`JobPodLink`.

This module also holds the rig the other ``test_jobpod_*`` modules use.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helmhive.runner.jobpod.frames import HEADER, FrameType, LinkError
from helmhive.runner.jobpod.link import Connecting, JobPodLink

JOBPOD = Path(sys.executable).with_name("helmhive-jobpod")
WAIT_S = 60.0  # generous: a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def eventually(condition: Callable[[], bool], *, seconds: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether any process (not a zombie) is in process group ``pgid``."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@dataclass
class JobPod:
    root: Path
    key: bytes
    port: int
    egress_port: int
    pod: str = "job-pod-test"
    shim: subprocess.Popen[bytes] | None = None
    launcher: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def job_root(self) -> Path:
        return self.root / "job"

    @property
    def workspace(self) -> Path:
        return self.job_root / "workspace"

    @property
    def shim_dir(self) -> Path:
        return self.root / "shim"

    @property
    def key_file(self) -> Path:
        return self.root / "key" / "key"

    @property
    def socket_path(self) -> Path:
        return self.root / "link" / "agent.sock"

    @property
    def shim_log(self) -> Path:
        return self.root / "shim.log"

    @property
    def launcher_log(self) -> Path:
        return self.root / "launcher.log"

    def start(self) -> None:
        for path in (self.key_file.parent, self.socket_path.parent, self.job_root, self.shim_dir):
            path.mkdir(parents=True)
        self.key_file.write_bytes(self.key)
        shim_env = {**os.environ, "HELMHIVE_POD_NAME": self.pod, **self.extra_env}
        shim_argv = [
            *(str(JOBPOD), "shim", "--host", "127.0.0.1", "--port", str(self.port)),
            *("--egress-port", str(self.egress_port), "--key-file", str(self.key_file)),
            *("--socket", str(self.socket_path), "--job-root", str(self.job_root)),
            *("--shim-dir", str(self.shim_dir)),
        ]
        launcher_argv = [str(JOBPOD), "agent", "--socket", str(self.socket_path)]
        with self.shim_log.open("wb") as shim_log, self.launcher_log.open("wb") as launcher_log:
            quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL}
            self.shim = subprocess.Popen(shim_argv, env=shim_env, stderr=shim_log, **quiet)
            self.launcher = subprocess.Popen(launcher_argv, stderr=launcher_log, **quiet)
        deadline = time.monotonic() + WAIT_S
        while True:  # the shim listens once it is ready
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.shim.poll() is None, f"the shim exited: {self.shim_log.read_text()}"
                if time.monotonic() > deadline:
                    raise AssertionError("the shim did not start listening") from None
                time.sleep(0.05)

    def stop(self) -> None:
        for proc in (self.shim, self.launcher):
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in (self.shim, self.launcher):
            if proc is None:
                continue
            try:
                proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def connect(self, job_uid: str = "job-uid-1", *, key: bytes | None = None, pod: str | None = None) -> Connecting:
        return JobPodLink.connect(
            "127.0.0.1", self.port, key=self.key if key is None else key, pod=pod or self.pod, job_uid=job_uid
        )

    def attach_argv(self, *, job_uid: str = "job-uid-1", egress_target: str | None = None) -> list[str]:
        argv = [str(JOBPOD), "attach", "--address", f"127.0.0.1:{self.port}", "--pod", self.pod]
        argv += ["--key-file", str(self.key_file), "--job-uid", job_uid, "--cwd", str(self.workspace)]
        if egress_target:
            argv += ["--egress-target", egress_target]
        return [*argv, "--"]

    def logs(self) -> bytes:
        return self.shim_log.read_bytes() + self.launcher_log.read_bytes()


def make_job_pod(tmp_path: Path, **extra_env: str) -> Iterator[JobPod]:
    pod = JobPod(
        root=tmp_path / "pod",
        key=secrets.token_bytes(32),
        port=free_port(),
        egress_port=free_port(),
        extra_env=extra_env,
    )
    pod.start()
    try:
        yield pod
    finally:
        pod.stop()


@pytest.fixture
def job_pod(tmp_path: Path) -> Iterator[JobPod]:
    yield from make_job_pod(tmp_path)


async def test_wrong_key_is_refused_and_nothing_starts(job_pod: JobPod) -> None:
    with pytest.raises(LinkError) as refused:
        async with job_pod.connect(key=secrets.token_bytes(32)):
            pass
    assert refused.value.reason == "auth"
    # A raw peer that sends a made-up AUTH gets ERROR and the connection closes.
    reader, writer = await asyncio.open_connection("127.0.0.1", job_pod.port)
    kind, length = HEADER.unpack(await reader.readexactly(HEADER.size))
    assert kind == FrameType.HELLO
    await reader.readexactly(length)
    forged = b'{"nonce":"' + b"ab" * 16 + b'","mac":"' + b"0" * 64 + b'","jobUid":"x"}'
    writer.write(HEADER.pack(FrameType.AUTH, len(forged)) + forged)
    await writer.drain()
    kind, length = HEADER.unpack(await reader.readexactly(HEADER.size))
    assert kind == FrameType.ERROR and b'"auth"' in await reader.readexactly(length)
    assert await reader.read() == b""
    writer.close()
    # Nothing was claimed and nothing started.
    async with job_pod.connect() as link:
        assert link.pod_state == "idle"
    assert job_pod.launcher is not None and job_pod.launcher.poll() is None
    assert children(job_pod.launcher.pid) == []


async def test_the_first_job_uid_claims_the_pod(job_pod: JobPod) -> None:
    async with job_pod.connect("job-a") as link:
        assert link.pod_state == "idle"
    with pytest.raises(LinkError) as refused:
        await job_pod.connect("job-b")
    assert refused.value.reason == "claimed"
    with pytest.raises(LinkError) as wrong_pod:
        await job_pod.connect("job-a", pod="another-pod")
    assert wrong_pod.value.reason == "pod-mismatch"
    async with job_pod.connect("job-a") as link:
        assert link.pod_state == "claimed"


async def test_one_start_per_pod_and_no_tree_before_exit(job_pod: JobPod) -> None:
    async with job_pod.connect() as link:
        with pytest.raises(LinkError) as never_started:
            await link.get_tree("workspace", job_pod.root / "early")
        assert never_started.value.reason == "running"
    async with job_pod.connect() as first:
        agent = await first.start(["/bin/cat"], env={}, cwd=str(job_pod.workspace))
        assert agent.pid is not None
        async with job_pod.connect() as second:
            assert second.pod_state == "running"
            with pytest.raises(LinkError) as again:
                await second.start(["/bin/true"], env={}, cwd="/")
            assert again.value.reason == "started"
            with pytest.raises(LinkError) as running:
                await second.get_tree("workspace", job_pod.root / "during")
            assert running.value.reason == "running"
            with pytest.raises(LinkError) as stdio_only:
                await first.get_tree("workspace", job_pod.root / "same-connection")
            assert stdio_only.value.reason == "state"
        await agent.write(b"echo\n")
        await agent.close_stdin()
        ended, out, _ = await agent.wait()
    assert (ended.code, out) == (0, b"echo\n")


async def test_a_dropped_link_kills_the_agent_group(job_pod: JobPod) -> None:
    pidfile = job_pod.root / "agent.pid"
    script = f"echo $$ > {pidfile}; sleep 300 & sleep 300 & wait"
    link = await job_pod.connect()
    agent = await link.start(["/bin/sh", "-c", script], env={}, cwd=str(job_pod.workspace))
    await eventually(lambda: pidfile.exists() and pidfile.read_text().strip() != "", what="the agent's pid file")
    pgid = int(pidfile.read_text())
    assert agent.pid == pgid  # its own process group
    await eventually(lambda: len(children(pgid)) == 2, what="the agent's children")
    await link.close()
    await eventually(lambda: not group_alive(pgid), what="the agent's group to die")
    launcher = job_pod.launcher
    assert launcher is not None
    await eventually(lambda: launcher.poll() is not None, what="the launcher to exit")
    async with job_pod.connect() as again:
        assert again.pod_state == "done"


async def test_what_the_agent_leaves_in_its_group_dies_with_it(job_pod: JobPod) -> None:
    pidfile = job_pod.root / "leftover.pid"
    # The leftover holds the agent's stdout open: the EXIT must not wait for it.
    script = f"sleep 300 & echo $! > {pidfile}; echo bye"
    async with job_pod.connect() as link:
        agent = await link.start(["/bin/sh", "-c", script], env={}, cwd=str(job_pod.workspace))
        ended, out, _ = await asyncio.wait_for(agent.wait(), WAIT_S)
    assert (ended.code, out) == (0, b"bye\n")
    leftover = int(pidfile.read_text())
    await eventually(
        lambda: not Path(f"/proc/{leftover}").exists() or "Z" in _state(leftover), what="the leftover to die"
    )


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2]


async def test_the_egress_relay_reaches_the_runner_proxy_while_the_agent_runs(job_pod: JobPod) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"echo:" + await reader.read(100))
        await writer.drain()
        writer.close()

    proxy = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy_port = proxy.sockets[0].getsockname()[1]
    client = (
        f"import socket; s = socket.create_connection(('127.0.0.1', {job_pod.egress_port})); s.sendall(b'ping'); "
        "s.shutdown(socket.SHUT_WR); print(s.recv(100).decode())"
    )
    try:
        async with job_pod.connect() as link:
            agent = await link.start(
                [sys.executable, "-c", client],
                env={},
                cwd=str(job_pod.workspace),
                egress_target=f"127.0.0.1:{proxy_port}",
            )
            ended, out, err = await agent.wait()
    finally:
        proxy.close()
    assert ended.code == 0, err
    assert out == b"echo:ping\n"

    # Closed with the agent's exit (the shim closes it as it reaps the agent, a moment after the
    # link reported the exit): nothing left running gets out through it.
    def refused() -> bool:
        try:
            socket.create_connection(("127.0.0.1", job_pod.egress_port), timeout=5).close()
        except OSError:
            return True
        return False

    await eventually(refused, what="the egress relay to close with the agent")


async def test_finish_ends_the_pod_and_logs_hold_no_secrets(job_pod: JobPod) -> None:
    canary_env, canary_out = "env-canary-" + secrets.token_hex(8), "stdout-canary-" + secrets.token_hex(8)
    async with job_pod.connect() as link:
        agent = await link.start(
            ["/bin/sh", "-c", f'echo "$SECRETISH"; echo {canary_out} >&2; cat'],
            env={"SECRETISH": canary_env},
            cwd=str(job_pod.workspace),
        )
        await agent.write(b"stdin-canary\n")
        await agent.close_stdin()
        ended, out, err = await agent.wait()
    assert (ended.code, out, err) == (0, f"{canary_env}\nstdin-canary\n".encode(), f"{canary_out}\n".encode())
    async with job_pod.connect() as link:
        await link.finish()
    shim, launcher = job_pod.shim, job_pod.launcher
    assert shim is not None and launcher is not None
    await eventually(lambda: shim.poll() is not None, what="the shim to exit")
    await eventually(lambda: launcher.poll() is not None, what="the launcher to exit")
    assert (shim.returncode, launcher.returncode) == (0, 0)
    logs = job_pod.logs()
    assert b"the agent exited" in logs  # the logs are there...
    for secret in (canary_env.encode(), canary_out.encode(), b"stdin-canary", job_pod.key.hex().encode()):
        assert secret not in logs  # ... and hold none of it

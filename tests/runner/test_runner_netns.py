"""The agent's network namespace: only the relay to the proxy's socket, on any host and any protocol.

The real launcher runs a small agent twice under the same Landlock policy (TCP ``connect`` only to
port P). Without the namespace the agent reaches a listener on P at *another* address (the gap:
Landlock names ports, not hosts); in it, that listener, the host's own address and any datagram
are out of reach, P on its loopback is the relay to the proxy's UNIX socket, and the relay ends
as the agent ends. Then the pure decisions: which jobs get a namespace, what the launcher is told,
what a pool that requires one refuses, and what the Runner reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.egress import CredentialIsolation
from helmhive.api.runner import CgroupMode, NetworkIsolation
from helmhive.api.runnerpool import AdapterType
from helmhive.runner.config import SandboxSettings
from helmhive.runner.sandbox.cgroups import CgroupSupport
from helmhive.runner.sandbox.limits import LimitSupport, build_sandbox_report
from helmhive.runner.sandbox.netns import short_unix_path
from helmhive.runner.sandbox.workdir import (
    SYSTEM_READ_PATHS,
    SandboxPlan,
    build_check_policy,
    build_landlock_policy,
    build_sandbox_plan,
    runtime_read_paths,
    sandbox_refusal,
)

AGENT = r"""
import json, os, socket, sys
port, host = int(sys.argv[1]), sys.argv[2]
out = {}
def attempt(name, fn):
    try:
        out[name] = fn()
    except OSError as exc:
        import errno
        out[name] = errno.errorcode.get(exc.errno, str(exc))
def relay():
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"ping")
        return conn.recv(100).decode()
def other(address):
    def go():
        with socket.create_connection((address, port), timeout=10):
            return "connected"
    return go
def datagram():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"x", (host, 53))
        return "sent"
def dns():
    return str(socket.getaddrinfo("example.com", 443)[0][4])
attempt("relay", relay)
attempt("127.0.0.2", other("127.0.0.2"))
attempt("host", other(host))
attempt("udp", datagram)
attempt("dns", dns)
out["interfaces"] = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:])
out["parent"] = os.getppid()
print(json.dumps(out), flush=True)
sys.exit(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
"""


def _host_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # no packet: this only picks the route's source address
        return str(probe.getsockname()[0])


@contextlib.contextmanager
def _listeners(port: int, hosts: tuple[str, ...]) -> Iterator[list[socket.socket]]:
    with contextlib.ExitStack() as stack:
        servers = []
        for host in hosts:
            server = stack.enter_context(socket.socket())
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((host, port))
            server.listen(8)
            server.setblocking(False)
            servers.append(server)
        yield servers


@pytest.fixture
async def proxy_socket(tmp_path: Path) -> AsyncIterator[Path]:
    """A stand-in for the proxy's job socket: answers ``proxy:<what it got>``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"proxy:" + await reader.read(100))
        await writer.drain()
        writer.close()

    path = tmp_path / ("a-directory-name-long-enough-" * 3) / "job.sock"  # longer than sockaddr_un allows
    path.parent.mkdir(parents=True)
    with short_unix_path(str(path)) as short:
        server = await asyncio.start_unix_server(answer, path=short)
    async with server:
        yield path


async def _launch(policy: dict[str, Any], port: int, host: str, *extra: str) -> tuple[dict[str, Any], int, int]:
    """Run the agent under the launcher: (what it found, the launcher's pid, its exit code)."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-P", "-m", "helmhive.runner.sandbox.landlock", "--policy", json.dumps(policy), "--"),
        *(sys.executable, "-c", AGENT, str(port), host, *extra),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert out, err.decode()[-2000:]
    return dict(json.loads(out)), proc.pid, int(proc.returncode or 0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_in_its_namespace_the_agent_reaches_the_proxy_socket_and_nothing_else(proxy_socket: Path) -> None:
    port, host = _free_port(), _host_address()
    base = {
        "read": [*SYSTEM_READ_PATHS, *runtime_read_paths()],
        "write": [],
        "devices": ["/dev"],
        "tcpConnect": [port],
        "datagrams": True,  # even with UDP allowed by seccomp, the namespace has nowhere to send it
    }
    with _listeners(port, ("127.0.0.2", host)) as servers:
        plain, _, _ = await _launch(base, port, host)
        # The gap the namespace closes: Landlock let the agent reach port P at other addresses.
        assert (plain["127.0.0.2"], plain["host"]) == ("connected", "connected")
        for server in servers:
            server.accept()[0].close()

        policy = {**base, "relay": {"port": port, "socket": str(proxy_socket)}}
        confined, launcher, code = await _launch(policy, port, host, "3")
        for server in servers:
            with pytest.raises(BlockingIOError):
                server.accept()  # nothing reached either listener from the namespace
    assert confined["relay"] == "proxy:ping"  # 127.0.0.1:P is the relay to the proxy's socket
    assert confined["127.0.0.2"] == "ECONNREFUSED"  # loopback is the namespace's own
    assert confined["host"] == "ENETUNREACH"
    assert confined["udp"] == "ENETUNREACH"
    assert confined["dns"] != "" and not confined["dns"].startswith("(")  # no resolver is reachable
    assert confined["interfaces"] == ["lo"]
    # The relay is the agent's parent, the process the runner started, and it ends as the agent ends.
    assert confined["parent"] == launcher and code == 3


async def test_the_relay_ends_as_the_agent_ends_and_passes_on_the_runners_signals(proxy_socket: Path) -> None:
    policy = {"read": [*SYSTEM_READ_PATHS, *runtime_read_paths()], "write": [], "tcpConnect": [1]}
    policy["relay"] = {"port": 1, "socket": str(proxy_socket)}
    launcher = (sys.executable, "-P", "-m", "helmhive.runner.sandbox.landlock", "--policy", json.dumps(policy), "--")
    killed = await asyncio.create_subprocess_exec(*launcher, sys.executable, "-c", "import os; os.abort()")
    assert await asyncio.wait_for(killed.wait(), 60) == -signal.SIGABRT  # a signal, as the runner would see it
    sleeper = await asyncio.create_subprocess_exec(
        *launcher,
        sys.executable,
        "-c",
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); print('up', flush=True); "
        "time.sleep(60)",
        stdout=asyncio.subprocess.PIPE,
    )
    assert sleeper.stdout is not None
    assert await asyncio.wait_for(sleeper.stdout.readline(), 60) == b"up\n"
    sleeper.send_signal(signal.SIGTERM)  # to the relay, the pid the runner knows: it reaches the agent
    assert await asyncio.wait_for(sleeper.wait(), 60) == 7


def test_the_launcher_probe_says_whether_namespaces_are_possible() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-P", "-m", "helmhive.runner.sandbox.landlock", "--probe"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    probe = json.loads(done.stdout)
    # Either it can, or it says why not (a string): never silently false.
    assert probe["networkNamespace"] is True or isinstance(probe["networkNamespace"], str)
    if os.getuid() == 0:
        assert probe["networkNamespace"] is True  # this CI machine allows them, and the tests above need them


# -- the decisions ---------------------------------------------------------------------------------


def _plan(tmp_path: Path, *, network: NetworkAccess, relay: Path | None, port: int | None = 4000) -> SandboxPlan:
    return build_sandbox_plan(
        state_dir=tmp_path,
        job_dir="team-a.job.0001",
        filesystem=FilesystemAccess.READ,
        network=network,
        tools=[ToolKind.READ],
        adapter_type=AdapterType.ACP,
        settings=SandboxSettings(),
        runtime_paths=(),
        credential_dir=None,
        landlock_abi=6,
        egress_port=port,
        relay_socket=relay,
        cgroup_procs=("/sys/fs/cgroup/pids/helmhive-x/cgroup.procs",),
    )


def test_which_jobs_get_a_namespace_and_what_the_launcher_is_told(tmp_path: Path) -> None:
    sock = tmp_path / "egress" / "job.sock"
    namespaced = _plan(tmp_path, network=NetworkAccess.DISABLED, relay=sock)
    assert namespaced.network_isolation is NetworkIsolation.NAMESPACE
    policy = build_landlock_policy(namespaced)
    assert policy["relay"] == {"port": 4000, "socket": str(sock)} and policy["tcpConnect"] == [4000]
    assert policy["cgroup"] == ["/sys/fs/cgroup/pids/helmhive-x/cgroup.procs"]
    check = build_check_policy(namespaced)  # checks need no network at all: no relay, no port
    assert "relay" not in check and check["tcpConnect"] == [] and check["cgroup"] == policy["cgroup"]
    # Without a socket (no namespaces here), Landlock's port rule only; with the network on, nothing.
    landlocked = _plan(tmp_path, network=NetworkAccess.DISABLED, relay=None)
    assert landlocked.network_isolation is NetworkIsolation.LANDLOCK and "relay" not in build_landlock_policy(
        landlocked
    )
    enabled = _plan(tmp_path, network=NetworkAccess.ENABLED, relay=sock)
    assert enabled.network_isolation is NetworkIsolation.NONE and enabled.relay_socket is None
    in_sandbox = _plan(tmp_path, network=NetworkAccess.DISABLED, relay=sock, port=None)  # no proxy
    assert in_sandbox.relay_socket is None and in_sandbox.tcp_connect == (443,)
    # A pool that requires the namespace refuses a job that would run without one, saying why.
    settings = SandboxSettings()
    assert sandbox_refusal(plan=namespaced, settings=settings, landlock_abi=6, require_namespace=True) is None
    refused = sandbox_refusal(
        plan=landlocked, settings=settings, landlock_abi=6, require_namespace=True, namespace_note="EPERM"
    )
    assert refused == "egress.networkNamespace is Required, but no network namespace is possible here: EPERM"
    assert sandbox_refusal(plan=enabled, settings=settings, landlock_abi=6, require_namespace=True) is None


def test_what_the_runner_reports_about_its_sandbox() -> None:
    cgroups = CgroupSupport(mode=CgroupMode.V1, reason="job cgroups under /sys/fs/cgroup/pids")
    yes = LimitSupport(uid=0, user_namespaces=True, network_namespace=True, network_namespace_note="", cgroups=cgroups)
    no = LimitSupport(uid=65532, user_namespaces=False, network_namespace_note="unshare refused: EPERM")
    proxy, in_sandbox = CredentialIsolation.PROXY, CredentialIsolation.IN_SANDBOX
    report = build_sandbox_report(support=yes, landlock_abi=6, isolation=proxy)
    assert (report.network, report.network_reason, report.cgroups) == (NetworkIsolation.NAMESPACE, "", CgroupMode.V1)
    report = build_sandbox_report(support=no, landlock_abi=6, isolation=proxy)
    assert (report.network, report.network_reason) == (NetworkIsolation.LANDLOCK, "unshare refused: EPERM")
    assert report.cgroups is CgroupMode.NONE and report.cgroups_reason == "not probed"
    assert "InSandbox" in build_sandbox_report(support=yes, landlock_abi=6, isolation=in_sandbox).network_reason
    assert build_sandbox_report(support=yes, landlock_abi=3, isolation=proxy).network is NetworkIsolation.NONE

"""The launcher's seccomp filter on this machine's real kernel: no TCP Fast Open, no UDP, raw or packet sockets.

The filter (:mod:`helmhive.runner.sandbox.seccomp`) is installed by ``python -m helmhive.runner.sandbox.landlock``
whenever TCP is restricted; with ``"datagrams": false`` (a job whose network is disabled on a runner
with ``credentialIsolation: Proxy``) it also refuses datagram sockets. The probes run under the
real launcher; the same launcher without the filter shows what it closes.
"""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.runnerpool import AdapterType
from helmhive.runner.config import SandboxSettings
from helmhive.runner.sandbox.seccomp import SUPPORTED_MACHINES, build_filter, install_filter
from helmhive.runner.sandbox.workdir import (
    build_check_policy,
    build_landlock_policy,
    build_launcher,
    build_sandbox_plan,
    runtime_read_paths,
    sandbox_refusal,
)

PROBE = r"""
import ctypes, errno, json, socket, sys
out = {}
def attempt(name, make):
    try:
        make().close()
        out[name] = "allowed"
    except OSError as exc:
        out[name] = errno.errorcode[exc.errno]
attempt("udp4", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
attempt("udp4-cloexec", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC))
attempt("raw-icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("sctp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132))
attempt("packet", lambda: socket.socket(17, socket.SOCK_RAW))
attempt("tcp4", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("tcp6-nonblock", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_NONBLOCK))
attempt("unix-dgram", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 8, params)
out["io_uring"] = "allowed" if fd >= 0 else errno.errorcode[ctypes.get_errno()]
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
    out["connect"] = "connected"
except OSError as exc:
    out["connect"] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""

LANDLOCK_ONLY = r"""
import json, sys
from helmhive.runner.sandbox.landlock import restrict_self
restrict_self(read=json.loads(sys.argv[2]), write=[], tcp_connect=[1])
"""
FAST_OPEN = r"""
import errno, socket, sys
sock = socket.socket()
try:
    sock.sendto(b"fast-open-data", socket.MSG_FASTOPEN, ("127.0.0.1", int(sys.argv[1])))
    print("sent")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


def _launch(policy: dict[str, object], code: str, port: int) -> str:
    command = [*build_launcher(policy), sys.executable, "-c", code, str(port)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _run(policy: dict[str, object], port: int) -> dict[str, str]:
    result: dict[str, str] = json.loads(_launch(policy, PROBE, port))
    return result


def _policy(tmp_path: Path, ports: list[int] | None, *, datagrams: bool) -> dict[str, object]:
    read = ["/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", *runtime_read_paths()]
    return {"read": read, "write": [str(tmp_path)], "tcpConnect": ports, "datagrams": datagrams}


def test_the_filter_leaves_tcp_streams_and_local_sockets_only(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        closed = _run(_policy(tmp_path, [port], datagrams=False), port)
        opened = _run(_policy(tmp_path, [port], datagrams=True), port)
    assert closed == {
        "udp4": "EPERM",
        "udp6": "EPERM",
        "udp4-cloexec": "EPERM",
        "raw-icmp": "EPERM",
        "sctp": "EPERM",
        "packet": "EPERM",
        "tcp4": "allowed",
        "tcp6-nonblock": "allowed",
        "unix-dgram": "allowed",
        "io_uring": "EPERM",
        "connect": "connected",
    }
    # With datagrams allowed (InSandbox), UDP works: the filter is what refused it above.
    assert opened["udp4"] == opened["udp6"] == "allowed"
    assert opened["io_uring"] == "EPERM"  # refused whenever TCP is restricted


def test_tcp_fast_open_cannot_reach_a_port_the_ruleset_denies(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        filtered = _launch(_policy(tmp_path, [1], datagrams=True), FAST_OPEN, port)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing connected
        # Landlock's rule alone (the same ruleset, no filter): on our CI's kernel (6.18) the Fast Open
        # send connects, because it never calls the connect hook Landlock checks.
        read = ["/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", *runtime_read_paths()]
        landlock_only = subprocess.run(
            [sys.executable, "-c", LANDLOCK_ONLY + FAST_OPEN, str(port), json.dumps(read)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout.strip()
        if landlock_only == "sent":
            server.settimeout(10)
            conn, _ = server.accept()
            with conn:
                conn.settimeout(10)
                assert conn.recv(64) == b"fast-open-data"
    assert filtered == "EPERM"
    assert landlock_only in ("sent", "EACCES")  # "sent" where the kernel lets it through


@pytest.mark.parametrize("deny_datagrams", [True, False])
@pytest.mark.parametrize("machine", sorted(SUPPORTED_MACHINES))
def test_every_jump_goes_forward_inside_the_program_and_it_ends_in_returns(machine: str, deny_datagrams: bool) -> None:
    program = build_filter(SUPPORTED_MACHINES[machine], deny_datagrams=deny_datagrams)
    for index, (code, jt, jf, _) in enumerate(program):
        if code & 0x07 == 0x05:  # BPF_JMP: offsets are unsigned bytes, so only forward
            assert 0 <= jt <= 255 and 0 <= jf <= 255
            assert index + 1 + max(jt, jf) < len(program)
    assert [code for code, *_ in program[-3:]] == [0x06, 0x06, 0x06]
    assert len(program) == (27 if deny_datagrams else 16)


def test_an_unknown_machine_gets_no_filter_and_its_jobs_fail_closed(tmp_path: Path) -> None:
    with pytest.raises(OSError) as caught:
        install_filter(deny_datagrams=True, machine="riscv64")
    assert caught.value.errno == errno.ENOSYS
    plan = build_sandbox_plan(
        state_dir=tmp_path,
        job_dir="ns.job.1",
        filesystem=FilesystemAccess.READ,
        network=NetworkAccess.DISABLED,
        tools=[ToolKind.READ],
        adapter_type=AdapterType.ACP,
        settings=SandboxSettings(),
        runtime_paths=(),
        credential_dir=None,
        landlock_abi=6,
        egress_port=41000,
    )
    assert plan.tcp_connect == (41000,) and not plan.datagrams
    assert build_landlock_policy(plan)["datagrams"] is False
    assert build_check_policy(plan)["tcpConnect"] == [] and build_check_policy(plan)["datagrams"] is False
    refusal = sandbox_refusal(plan=plan, settings=SandboxSettings(), landlock_abi=6, machine="riscv64")
    assert refusal is not None and "riscv64" in refusal
    assert sandbox_refusal(plan=plan, settings=SandboxSettings(), landlock_abi=6, machine="x86_64") is None


def test_in_sandbox_keeps_the_provider_ports_and_datagrams(tmp_path: Path) -> None:
    plan = build_sandbox_plan(
        state_dir=tmp_path,
        job_dir="ns.job.1",
        filesystem=FilesystemAccess.READ,
        network=NetworkAccess.DISABLED,
        tools=[ToolKind.READ],
        adapter_type=AdapterType.ACP,
        settings=SandboxSettings(),
        runtime_paths=(),
        credential_dir=None,
        landlock_abi=6,
    )
    # InSandbox: the agent resolves and reaches its provider itself (DNS needs UDP).
    assert plan.tcp_connect == (443,) and plan.datagrams

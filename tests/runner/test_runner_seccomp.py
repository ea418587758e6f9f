"""The launcher's seccomp filter on this machine's real kernel: no UDP, raw or packet sockets.

The filter (:mod:`helmhive.runner.seccomp`) is installed by ``python -m helmhive.runner.landlock``
when the policy says ``"datagrams": false``, as it does for a job whose network is disabled on a
runner with ``credentialIsolation: Proxy``. The probe below runs under the real launcher.
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
from helmhive.api.runner import AdapterType
from helmhive.runner.config import SandboxSettings
from helmhive.runner.sandbox import (
    build_check_policy,
    build_landlock_policy,
    build_launcher,
    build_sandbox_plan,
    runtime_read_paths,
    sandbox_refusal,
)
from helmhive.runner.seccomp import SUPPORTED_MACHINES, build_filter, deny_datagrams

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


def _run(policy: dict[str, object], port: int) -> dict[str, str]:
    command = [*build_launcher(policy), sys.executable, "-c", PROBE, str(port)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


def _policy(tmp_path: Path, port: int, *, datagrams: bool) -> dict[str, object]:
    read = ["/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", *runtime_read_paths()]
    return {"read": read, "write": [str(tmp_path)], "tcpConnect": [port], "datagrams": datagrams}


def test_the_filter_leaves_tcp_streams_and_local_sockets_only(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        closed = _run(_policy(tmp_path, port, datagrams=False), port)
        opened = _run(_policy(tmp_path, port, datagrams=True), port)
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
    # The same launcher without the filter: UDP works, so the filter is what refused it above.
    assert opened["udp4"] == opened["udp6"] == "allowed"


def test_every_jump_lands_inside_the_program_and_it_ends_in_returns() -> None:
    for arch, socket_nr in SUPPORTED_MACHINES.values():
        program = build_filter(arch=arch, socket_nr=socket_nr)
        for index, (code, jt, jf, _) in enumerate(program):
            if code & 0x07 == 0x05:  # BPF_JMP
                assert index + 1 + max(jt, jf) < len(program)
        assert [code for code, *_ in program[-3:]] == [0x06, 0x06, 0x06]


def test_an_unknown_machine_gets_no_filter_and_its_jobs_fail_closed(tmp_path: Path) -> None:
    with pytest.raises(OSError) as caught:
        deny_datagrams("riscv64")
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

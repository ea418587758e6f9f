"""The sandbox launcher (``python -m helmhive.runner.sandbox.landlock``) on this machine's real kernel.

Landlock holds for root too, so these checks mean the same in CI (as root) and in a pod (as
uid 65532). The sandbox plan's pure rules are tested here as well.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.runnerpool import AdapterType
from helmhive.runner.config import LandlockMode, SandboxSettings
from helmhive.runner.sandbox.landlock import landlock_abi
from helmhive.runner.sandbox.workdir import (
    build_allowed_tools,
    build_landlock_policy,
    build_sandbox_plan,
    build_wrapper,
    prepare_sandbox,
    remove_sandbox,
    runtime_read_paths,
    sandbox_refusal,
)

PROBE = """
import json, os, socket, sys
out = {}
for path in sys.argv[1:4]:
    try:
        with open(path, "w") as fh:
            fh.write("x")
        out[path] = "written"
    except OSError as exc:
        out[path] = exc.errno
try:
    open(sys.argv[4]).read()
    out["read"] = "read"
except OSError as exc:
    out["read"] = exc.errno
for port in sys.argv[5:7]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
        out[port] = "connected"
    except OSError as exc:
        out[port] = exc.errno
try:
    os.kill(os.getppid(), 0)
    out["signal"] = "sent"
except OSError as exc:
    out["signal"] = exc.errno
print(json.dumps(out))
"""


@pytest.fixture
def ports() -> list[socket.socket]:
    servers = []
    for _ in range(2):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        servers.append(server)
    yield servers
    for server in servers:
        server.close()


def test_landlock_confines_files_ports_and_signals(tmp_path: Path, ports: list[socket.socket]) -> None:
    assert landlock_abi() >= 4, "this machine's kernel must offer Landlock ABI 4+ (the CI images do)"
    readonly, writable, hidden = tmp_path / "ro", tmp_path / "rw", tmp_path / "hidden"
    for path in (readonly, writable, hidden):
        path.mkdir()
    (hidden / "secret").write_text("s3cret")
    allowed, blocked = (int(s.getsockname()[1]) for s in ports)
    policy = {
        "read": ["/usr", "/lib", "/lib64", "/etc", "/proc", *runtime_read_paths(), str(readonly)],
        "write": [str(writable)],
        "devices": ["/dev"],
        "tcpConnect": [allowed],
    }
    targets = [str(readonly / "f"), str(writable / "f"), str(tmp_path / "f")]
    argv = [sys.executable, "-c", PROBE, *targets, str(hidden / "secret"), str(allowed), str(blocked)]
    done = subprocess.run(
        [sys.executable, "-m", "helmhive.runner.sandbox.landlock", "--policy", json.dumps(policy), "--", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    eacces = 13
    assert out[targets[0]] == eacces  # read-only: no writes, even as root
    assert out[targets[1]] == "written"
    assert out[targets[2]] == eacces  # not granted at all
    assert out["read"] == eacces  # a file outside every granted path cannot be read
    assert out[str(allowed)] == "connected"
    assert out[str(blocked)] == eacces
    if landlock_abi() >= 6:
        assert out["signal"] == 1  # EPERM: the sandbox cannot signal the runner
    assert (writable / "f").read_text() == "x" and not (readonly / "f").exists()


def test_the_launcher_refuses_to_run_unrestricted() -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "helmhive.runner.sandbox.landlock", "--policy", "{not json", "--", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert bad.returncode == 126 and "refusing to start the agent unrestricted" in bad.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "helmhive.runner.sandbox.landlock", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert usage.returncode == 2 and "usage" in usage.stderr


def _plan(tmp_path: Path, **overrides: object) -> object:
    settings: dict[str, object] = {
        "state_dir": tmp_path / "state",
        "job_dir": "ns.job.1234abcd",
        "filesystem": FilesystemAccess.READ,
        "network": NetworkAccess.DISABLED,
        "tools": [ToolKind.READ, ToolKind.FETCH],
        "adapter_type": AdapterType.ACP,
        "settings": SandboxSettings(),
        "runtime_paths": ["/opt/python"],
        "credential_dir": None,
        "landlock_abi": 6,
    }
    settings.update(overrides)
    return build_sandbox_plan(**settings)  # type: ignore[arg-type]


def test_the_sandbox_plan_follows_the_effective_profile(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert plan.allowed_tools == frozenset({"kind:read"})  # fetch never without network
    work = str(tmp_path / "state" / "jobs" / "ns.job.1234abcd" / "work")
    assert work in plan.read_paths and work not in plan.write_paths
    assert plan.tcp_connect == (443,)
    home = tmp_path / "state" / "jobs" / "ns.job.1234abcd" / "home"  # no session binding: a HOME of its own
    assert plan.home == home and str(home) in plan.write_paths
    assert str(tmp_path / "state" / "home") not in plan.write_paths  # the probe's HOME is no job's
    bound = _plan(tmp_path, binding="sb-0123456789abcdef0123")
    assert bound.home == tmp_path / "state" / "homes" / "sb-0123456789abcdef0123" / "home"
    assert str(bound.home) in bound.write_paths and str(home) not in bound.write_paths
    writer = _plan(tmp_path, filesystem=FilesystemAccess.WRITE, network=NetworkAccess.ENABLED)
    assert work in writer.write_paths and writer.tcp_connect is None
    claude = build_allowed_tools(
        tools=[ToolKind.READ, ToolKind.EDIT], network=NetworkAccess.DISABLED, adapter_type=AdapterType.CLAUDE_CLI
    )
    assert {"Read", "Edit", "Write", "kind:read", "kind:edit"} <= claude and "Bash" not in claude
    policy = build_landlock_policy(plan)
    assert policy["tcpConnect"] == [443] and "/dev" in policy["devices"]
    # -P: the launcher starts in the checkout, which must not be on its import path
    assert build_wrapper(plan, python="/py")[:5] == ("/py", "-P", "-m", "helmhive.runner.sandbox.landlock", "--policy")
    assert build_wrapper(_plan(tmp_path, landlock_abi=0)) == ()


def test_the_sandbox_fails_closed(tmp_path: Path) -> None:
    no_landlock = _plan(tmp_path, landlock_abi=0)
    assert "not available" in (sandbox_refusal(plan=no_landlock, settings=SandboxSettings(), landlock_abi=0) or "")
    optional = SandboxSettings(landlock=LandlockMode.OPTIONAL)
    assert sandbox_refusal(plan=no_landlock, settings=optional, landlock_abi=0) is None
    old = _plan(tmp_path, landlock_abi=3)
    assert "cannot restrict TCP" in (sandbox_refusal(plan=old, settings=SandboxSettings(), landlock_abi=3) or "")
    # A runtime path that holds the runner's credential is left out; any other one refuses the job.
    secret = tmp_path / "state" / "credential"
    kept = _plan(tmp_path, runtime_paths=[str(tmp_path)], protected=[secret])
    assert str(tmp_path) not in kept.read_paths and kept.exposed == ()
    exposed = _plan(tmp_path, settings=SandboxSettings(read_paths=[str(tmp_path)]), protected=[secret])
    assert str(secret) in exposed.exposed and str(exposed.git_dir) in exposed.exposed  # so is the job's git dir
    assert "runner's own secrets" in (sandbox_refusal(plan=exposed, settings=SandboxSettings(), landlock_abi=6) or "")


def test_a_read_only_workspace_is_read_only_on_disk_too(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    prepare_sandbox(plan)
    assert plan.workdir.is_dir() and plan.tmpdir.is_dir()
    assert plan.workdir.stat().st_mode & 0o222 == 0
    remove_sandbox(plan)
    assert not plan.root.exists()
    writer = _plan(tmp_path, filesystem=FilesystemAccess.WRITE)
    prepare_sandbox(writer)
    assert writer.workdir.stat().st_mode & 0o200
    remove_sandbox(writer)

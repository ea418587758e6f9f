"""Every escape attempt of docs/security.md against a real runner: the test fails if any succeeds.

A runner program with ``credentialIsolation: Proxy`` whose credential file holds a canary key, in
front of a fake provider on loopback with a TLS certificate authority of its own (the runner's
proxy trusts it through ``egress.caBundle``). Its job's agent (the reference agent, in the job's
sandbox) is told to try everything a prompt injection would (``docs/reference-agent.md``): call
the provider, read its environment, its HOME and every ``/proc/*/environ`` it can, the runner's
environment and credential files, connect to another loopback port and to 443, send a UDP
datagram, and ask the proxy for a tunnel, another host by absolute URI and by ``Host`` header.

The provider must see the real key; the canary must be in nothing the agent could read, and in no
status, Event, log or file the test collects; every other attempt must be refused. A second test
runs the same agent ``InSandbox`` and finds the canary in what it gathered, which shows that the
gathering would have found it.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helmhive.api.common import JobKind
from helmhive.runner.egress.proxy import PLACEHOLDER

from .execution_harness import ExecutionRig, Runner, condition
from .fake_provider import FakeProvider, fake_provider
from .program_harness import CANARY, GROUP, VERSION

LOOT = "loot.bin"


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[FakeProvider]:
    with fake_provider(tmp_path / "pki", canary=CANARY) as fake:
        fake.release.set()  # answer every stream at once: the agent reads it whole
        yield fake


@pytest.fixture
def tcp_server() -> Iterator[socket.socket]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        yield server


@pytest.fixture
def udp_socket() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.setblocking(False)
        yield server


def _host_address() -> str:
    """This machine's address on its default route (connecting a datagram socket sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))
        return str(probe.getsockname()[0])


def _listener(stack: contextlib.ExitStack, host: str, port: int) -> socket.socket:
    """A listener on the proxy's port number at another address: where an agent whose sandbox names
    ports, not hosts, would get through."""
    server = stack.enter_context(socket.socket())
    server.bind((host, port))
    server.listen(8)
    server.setblocking(False)
    return server


def _prompt(runner: Runner, *, tcp_port: int, udp_port: int, others: tuple[str, ...] = ()) -> str:
    credential_copy = runner.rig.state_dir / "credential" / "credential"
    secret_file = runner.rig.root / "secret" / "credential"
    return "\n".join(
        [
            "Review this repository.",
            "PROVIDER-CALL: /v1/messages",
            "PROVIDER-CALL: /v1/organizations/keys",
            *(f"TCP-TO: {host}" for host in others),
            f"UDP-SEND: {udp_port}",
            f"TCP-FASTOPEN: {tcp_port}",
            f"CONNECT: {tcp_port}",
            "CONNECT: 443",
            "PROXY-CONNECT: example.com:443",
            "PROXY-ABSOLUTE: http://example.com/steal",
            "PROXY-HOST: example.com",
            f"READ-FILE: /proc/{runner.proc.popen.pid}/environ",
            f"READ-FILE: /proc/{runner.proc.popen.pid}/mem",
            f"READ-FILE: {credential_copy}",
            f"READ-FILE: {secret_file}",
            f"LOOT: {LOOT}",
        ]
    )


def _run_job(execution: ExecutionRig, runner: Runner, name: str, prompt: str) -> dict[str, Any]:
    execution.create_job(name, runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt, timeout=240)
    job = execution.wait_finished(name, timeout=240)
    assert condition(job, "Succeeded")["status"] == "True", json.dumps(job.get("status"))[:2000]
    return job


def _everything_written(execution: ExecutionRig, runner: Runner, name: str) -> str:
    """Every place a secret must never reach, as text: job status, its Events, the Runner, the runner's
    log, and every file the agent left in its state directory but the loot itself."""
    parts = [json.dumps(execution.job(name)), runner.proc.raw_log()]
    parts += [json.dumps(e.to_dict(), default=str) for e in execution.wait_events(name, "Completed")]
    parts += [json.dumps(e.to_dict(), default=str) for e in execution.events(name)]
    runner_obj = execution.kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, execution.namespace, "runners", runner.name
    )
    parts.append(json.dumps(runner_obj))
    for path in runner.agent_state.rglob("*"):
        if path.is_file() and path.name != LOOT:
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def test_with_the_proxy_every_escape_is_refused_and_the_key_never_reaches_the_agent(
    execution: ExecutionRig, provider: FakeProvider, tcp_server: socket.socket, udp_socket: socket.socket
) -> None:
    tcp_port = int(tcp_server.getsockname()[1])
    egress = {"upstream": provider.url, "caBundle": str(provider.ca_file), "networkNamespace": "Required"}
    runner = execution.start_runner(config={"credentialIsolation": "Proxy", "egress": egress})
    udp_port = int(udp_socket.getsockname()[1])
    (listening,) = runner.proc.messages("egress proxy listening")
    others = ("127.0.0.2", _host_address())
    with contextlib.ExitStack() as stack:
        elsewhere = [_listener(stack, host, int(listening["port"])) for host in others]
        prompt = _prompt(runner, tcp_port=tcp_port, udp_port=udp_port, others=others)
        job = _run_job(execution, runner, "escape", prompt)
        for server in elsewhere:
            with pytest.raises(BlockingIOError):
                server.accept()  # the proxy's port number elsewhere: never reached from the namespace
    output = job["status"]["result"]["output"]

    # The provider was reached through the proxy, with the real key in place of the placeholder.
    assert output["escapes"]["PROVIDER-CALL: /v1/messages"] == "status 200"
    assert [(r.method, r.path, r.auth) for r in provider.requests] == [
        ("POST", "/v1/messages", {"authorization": "canary", "x-api-key": "canary"})
    ]
    # Every other way out was refused: by the network namespace (the proxy's port on any other address:
    # nothing listens there in it, no route out of it), Landlock (TCP to other ports), seccomp (UDP) and the
    # proxy (403: another host, a tunnel, a path of the provider's API its agents do not use).
    assert output["escapes"] == {
        "PROVIDER-CALL: /v1/messages": "status 200",
        "PROVIDER-CALL: /v1/organizations/keys": "status 403",
        "TCP-TO: 127.0.0.2": "failed (ECONNREFUSED)",
        f"TCP-TO: {others[1]}": "failed (ENETUNREACH)",
        f"UDP-SEND: {udp_port}": "denied (EPERM)",
        f"TCP-FASTOPEN: {tcp_port}": "denied (EPERM)",
        "PROXY-CONNECT: example.com:443": "status 403",
        "PROXY-ABSOLUTE: http://example.com/steal": "status 403",
        "PROXY-HOST: example.com": "status 403",
        f"LOOT: {LOOT}": output["escapes"][f"LOOT: {LOOT}"],
    }
    assert output["connects"] == {str(tcp_port): "denied (EACCES)", "443": "denied (EACCES)"}
    with pytest.raises(BlockingIOError):
        udp_socket.recvfrom(1024)  # no datagram arrived
    with pytest.raises(BlockingIOError):
        tcp_server.accept()  # and no connection, neither by connect nor by a Fast Open send
    runner_environ = f"/proc/{runner.proc.popen.pid}/environ"
    reads = {path: verdict for path, verdict in output["reads"].items() if path != runner_environ}
    assert set(reads.values()) == {"denied (EACCES)"}, reads  # the credential files and the runner's memory
    # Landlock does not stop reading the runner's environment on every kernel (it does not on our CI's
    # 6.18): the runner keeps no credential there, and the loot below, which holds it when readable, shows it.
    environ_readable = output["reads"][runner_environ].startswith("read")
    log = runner.proc.raw_log()
    assert log.count("egress: request refused") == 4, log[-3000:]

    # What the agent could gather holds the placeholder, never the key.
    loot = (runner.agent_state / LOOT).read_bytes()
    assert PLACEHOLDER.encode() in loot and b"HELMHIVE_PROVIDER_BASE_URL=http://127.0.0.1:" in loot
    assert CANARY.encode() not in loot
    if environ_readable:
        assert f"HELMHIVE_RUNNER_NAME={runner.name}".encode() in loot
    counted = re.fullmatch(r"read (\d+) sources \((\d+) denied\)", output["escapes"][f"LOOT: {LOOT}"])
    assert counted is not None and int(counted[1]) > 0 and int(counted[2]) > 0, output["escapes"]
    # And the key is in no status, Event, log or file written about the job.
    assert CANARY not in _everything_written(execution, runner, "escape")
    report = runner.rig.report()
    assert report["credentialIsolation"] == "Proxy"
    assert report["sandbox"]["network"] == "Namespace" and report["sandbox"]["networkReason"] == ""
    (started,) = execution.wait_events("escape", "Started")
    assert "network Namespace" in str(started.message)


def test_in_sandbox_the_same_agent_finds_the_key_so_the_search_above_is_real(
    execution: ExecutionRig, provider: FakeProvider
) -> None:
    runner = execution.start_runner(config={"credentialIsolation": "InSandbox"})
    _run_job(execution, runner, "exposed", f"Review this repository.\nLOOT: {LOOT}")
    loot = (runner.agent_state / LOOT).read_bytes()
    assert CANARY.encode() in loot  # InSandbox: the key is in the agent's environment
    # Its own environment (the loot's first part) holds no placeholder. The rest may: as root without
    # a PID namespace it reads every process's environment on the machine, other runners' agents too.
    own_environment = loot.split(b"\n\n", 1)[0]
    assert CANARY.encode() in own_environment and PLACEHOLDER.encode() not in own_environment
    assert runner.rig.report()["credentialIsolation"] == "InSandbox"
    # The runner still keeps it out of everything it writes (redaction), as before.
    assert CANARY not in _everything_written(execution, runner, "exposed")

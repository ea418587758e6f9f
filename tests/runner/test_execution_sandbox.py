"""The job sandbox in force: tools, filesystem and network follow the job's effective profile.

The reference agent is asked (by magic prompt lines) to use a tool, write in its working
directory itself and through the ACP client, read the runner's own files, and open a TCP
connection; it reports what happened in its JSON answer, which the runner puts in
``status.result.output``. See ``docs/security.md``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from helmhive.api.common import JobKind

from .execution_harness import ExecutionRig, condition


def started_message(execution: ExecutionRig, name: str) -> str:
    (event,) = execution.wait_events(name, "Started")
    return str(event.message)


def _output(execution: ExecutionRig, name: str) -> dict[str, object]:
    job = execution.wait_finished(name)
    assert condition(job, "Succeeded")["status"] == "True", job["status"]
    output: dict[str, object] = job["status"]["result"]["output"]
    return output


def test_only_the_profiles_tools_are_granted(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    prompt = "Review.\nUSE-TOOL: read\nUSE-TOOL: execute\nUSE-TOOL: fetch\nUSE-TOOL: search"
    execution.create_job(
        "tools", runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt, profile_spec={"tools": ["read", "think"]}
    )
    output = _output(execution, "tools")
    # read is in the profile; search is in the envelope but the profile narrowed it away;
    # execute and fetch are outside the review envelope altogether.
    assert output["tools"] == {"read": "granted", "execute": "denied", "fetch": "denied", "search": "denied"}
    assert runner.methods().count("session/prompt") == 1


def test_a_read_only_job_cannot_write_its_working_directory(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    prompt = "Review.\nWRITE-FILE: direct.txt\nACP-WRITE-FILE: via-client.txt"
    execution.create_job("readonly", runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt)
    output = _output(execution, "readonly")
    # A read-only workspace is a read-only mount in the agent's view (EROFS), and Landlock grants no write
    # there either (EACCES where there is no mount namespace): refused even for root.
    assert output["files"]["direct.txt"] in ("denied (EROFS)", "denied (EACCES)"), output["files"]
    assert output["acpFiles"] == {"via-client.txt": "refused"}  # the runner's fs/write_text_file check
    assert "filesystem read" in started_message(execution, "readonly")
    assert not list((runner.rig.state_dir / "jobs").glob("*/work/*"))  # nothing left behind either


def test_a_write_job_may_write_its_working_directory(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    prompt = "Implement.\nWRITE-FILE: direct.txt\nACP-WRITE-FILE: via-client.txt\nOUTPUT-CONTRACT: json"
    execution.create_job("writer", runner=runner, kind=JobKind.IMPLEMENTATION_PROBE, prompt=prompt)
    job = execution.wait_finished("writer")
    assert condition(job, "Succeeded")["status"] == "True", job["status"]
    summary = job["status"]["result"]["summary"]  # a text contract: the JSON is the answer's text
    assert '"files":{"direct.txt":"written"}' in summary
    assert '"acpFiles":{"via-client.txt":"written"}' in summary


def test_the_agent_cannot_read_the_runners_own_files(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    environ = dict(
        item.split("=", 1) for item in Path(f"/proc/{runner.proc.popen.pid}/environ").read_text().split("\0") if item
    )
    credential_copy = runner.rig.state_dir / "credential" / "credential"
    kubeconfig = Path(environ["KUBECONFIG"])  # the runner's own pod-bound token
    assert credential_copy.is_file() and kubeconfig.is_file()
    prompt = f"Review.\nREAD-FILE: {credential_copy}\nREAD-FILE: {kubeconfig}\nREAD-FILE: /etc/hostname"
    execution.create_job("peek", runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt)
    reads = _output(execution, "peek")["reads"]
    assert reads == {
        str(credential_copy): "denied (EACCES)",
        str(kubeconfig): "denied (EACCES)",
        "/etc/hostname": reads["/etc/hostname"],
    }
    assert str(reads["/etc/hostname"]).startswith(("read", "failed (ENOENT)"))  # system files stay readable


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()


def test_network_disabled_means_no_tcp_connections_but_the_providers(execution: ExecutionRig, listener: int) -> None:
    with socket.create_connection(("127.0.0.1", listener), timeout=2):
        pass  # the port is open: outside the sandbox a connection succeeds
    runner = execution.start_runner()
    prompt = f"Review.\nCONNECT: {listener}"
    execution.create_job("offline", runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt)
    output = _output(execution, "offline")
    assert output["connects"] == {str(listener): "denied (EACCES)"}
    assert "network disabled, sandbox landlock" in started_message(execution, "offline")

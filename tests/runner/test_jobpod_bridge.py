"""``helmhive-jobpod attach``: the runner's local stand-in for an agent in a job pod.

The reference agent is driven through it over real ACP, by the runner's own ACP adapter (which
spawns ``[*wrapper, command]`` with pipes, so it needs no change) and by the ``acp`` library."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any, cast

import acp
import pytest
from acp import schema

from helmhive.reference_agent import rules
from helmhive.reference_agent.session import ENV_MODE, ENV_STATE_DIR
from helmhive.runner.adapters import AcpAdapter, AcpAdapterConfig, TurnOutcome, TurnRequest
from helmhive.runner.adapters.acp_process import HelmhiveClient
from helmhive.runner.jobpod.bridge import LINK_FAILURE_EXIT

from .agent_harness import REFERENCE_AGENT, MethodLog
from .test_jobpod_link import JobPod, eventually, group_alive, job_pod

__all__ = ["job_pod"]  # the rig's fixture, used here


async def _bridge(job_pod: JobPod, argv: list[str], env: dict[str, str], **kwargs: Any) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *job_pod.attach_argv(**kwargs),
        *argv,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


async def _pod_state(job_pod: JobPod) -> str:
    async with job_pod.connect() as link:
        return link.pod_state


async def test_the_acp_adapter_drives_the_reference_agent_through_the_bridge(job_pod: JobPod, tmp_path: Path) -> None:
    state_dir = tmp_path / "agent-state"
    state_dir.mkdir()
    config = AcpAdapterConfig(
        command=str(REFERENCE_AGENT),
        wrapper=tuple(job_pod.attach_argv()),
        env={ENV_STATE_DIR: str(state_dir)},
        request_timeout_s=60.0,
        idle_timeout_s=60.0,
    )
    adapter = AcpAdapter(config)
    prompt = "Summarise the repository layout\nin two lines"
    try:
        result = await adapter.run_turn(TurnRequest(prompt=prompt, cwd=str(job_pod.workspace)))
    finally:
        await adapter.close()
    assert result.outcome is TurnOutcome.COMPLETED, result.message
    assert result.text == rules.render_reply(prompt, turn=1, model="reference-small", effort="medium", tool_results={})
    log = MethodLog(state_dir)
    assert log.methods()[:3] == ["initialize", "session/new", "session/prompt"]
    # The agent got exactly the environment the adapter gave the bridge (and its own locale coercion).
    assert set(log.entries()[0]["envKeys"]) - {"LC_CTYPE"} == {ENV_STATE_DIR}
    launcher = job_pod.launcher
    assert launcher is not None
    await eventually(lambda: launcher.poll() is not None, what="the launcher to exit")
    assert await _pod_state(job_pod) == "done"


async def test_the_bridge_passes_its_environment_exactly(job_pod: JobPod) -> None:
    env = {"ONLY": "this value", "EMPTY": ""}
    proc = await _bridge(job_pod, ["/usr/bin/env"], env)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err
    assert sorted(out.decode().splitlines()) == ["EMPTY=", "ONLY=this value"]  # nothing dropped, nothing added


@pytest.mark.parametrize(
    ("script", "status"),
    [("echo out; echo err >&2; exit 7", 7), ("kill -KILL $$", 128 + signal.SIGKILL)],
    ids=["exit-code", "killed"],
)
async def test_the_bridge_exits_with_the_agent_status(job_pod: JobPod, script: str, status: int) -> None:
    proc = await _bridge(job_pod, ["/bin/sh", "-c", script], {})
    out, _ = await asyncio.wait_for(proc.communicate(b"ignored"), 120)
    assert proc.returncode == status
    if status == 7:
        assert out == b"out\n"


async def test_sigterm_to_the_bridge_reaches_the_agent(job_pod: JobPod) -> None:
    script = 'trap "echo got-term; exit 9" TERM; echo ready; while :; do sleep 0.1; done'
    proc = await _bridge(job_pod, ["/bin/sh", "-c", script], {})
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 120) == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    rest, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert b"got-term\n" in rest
    assert proc.returncode == 9


async def test_the_bridge_sigkilled_mid_turn_takes_the_agent_group_with_it(job_pod: JobPod, tmp_path: Path) -> None:
    state_dir = tmp_path / "agent-state"
    state_dir.mkdir()
    proc = await _bridge(job_pod, [str(REFERENCE_AGENT)], {ENV_STATE_DIR: str(state_dir), ENV_MODE: "hang"})
    assert proc.stdin is not None and proc.stdout is not None
    conn = acp.connect_to_agent(cast(acp.Client, HelmhiveClient()), proc.stdin, proc.stdout)
    await asyncio.wait_for(conn.initialize(protocol_version=acp.PROTOCOL_VERSION), 120)
    session = await asyncio.wait_for(conn.new_session(cwd=str(job_pod.workspace), mcp_servers=[]), 120)
    block = schema.TextContentBlock(type="text", text="hang here")
    turn = asyncio.create_task(conn.prompt(session_id=session.session_id, prompt=[block]))
    log = MethodLog(state_dir)
    await eventually(lambda: "session/prompt" in log.methods(), what="the agent to receive the prompt")
    agent_pid = log.pids()[0]
    assert group_alive(agent_pid) and not turn.done()  # mid-turn: the agent hangs on the prompt

    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    await eventually(lambda: not group_alive(agent_pid), what="the agent's group to die")
    launcher = job_pod.launcher
    assert launcher is not None
    await eventually(lambda: launcher.poll() is not None, what="the launcher to exit")
    assert await _pod_state(job_pod) == "done"
    turn.cancel()
    with contextlib.suppress(BaseException):
        await turn


async def test_a_refused_link_is_one_line_and_a_distinct_status(job_pod: JobPod, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong-key"
    wrong.write_bytes(os.urandom(32))
    argv = job_pod.attach_argv()
    argv[argv.index("--key-file") + 1] = str(wrong)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        "/bin/true",
        env={"A_SECRET": "value-never-printed"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == LINK_FAILURE_EXIT
    assert out == b""
    assert err.decode().splitlines() == ["helmhive-jobpod attach: auth: authentication failed"]
    assert await _pod_state(job_pod) == "idle"

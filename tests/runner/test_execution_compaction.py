"""Compaction of a resumed chain on a real runner: the compact command, or archive and a fresh session.

The reference agent reports ``1000 + 1000 * turns`` tokens of a 5000-token window and the pool's
watermark is 50%, so the second job of a chain (3000 tokens) is the first past it. With the
``compact`` command advertised, the same session shrinks to one summary turn; without it, or when
it fails or stays silent, the session is archived (its id leaves the Secret) and a fresh one,
told the profile's instructions, takes its place. Each next job resumes what the binding holds.
The native session ids carry a canary that must appear only in the runner's sessions Secret.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from helmhive.api.common import JobKind
from helmhive.reference_agent.session import ENV_CONTEXT_SIZE, ENV_SESSION_PREFIX

from .execution_harness import ExecutionRig, Runner, condition

CANARY = "canary-sid-c0mpac7"
INSTRUCTIONS = "You are tested by helmhive. Compaction marker 41d2."
PROFILE = {"session": {"policy": "resume"}, "instructions": INSTRUCTIONS}
CHECKPOINT = "CHECKPOINT-6a1f: write down where the work stands."
POOL = {"compaction": {"watermarkPercent": 50, "commandTimeoutSeconds": 5, "checkpointPrompt": CHECKPOINT}}
AGENT_ENV = {ENV_SESSION_PREFIX: CANARY, ENV_CONTEXT_SIZE: "5000"}


def _run(execution: ExecutionRig, name: str, runner: Runner) -> dict[str, Any]:
    execution.create_job(
        name, runner=runner, kind=JobKind.IMPLEMENTATION_PROBE, prompt=f"Job {name}.", profile_spec=PROFILE
    )
    job = execution.wait_finished(name)
    assert condition(job, "Succeeded")["status"] == "True", job["status"]
    return job


def _turn(job: dict[str, Any]) -> int:
    line = next(line for line in job["status"]["result"]["summary"].splitlines() if line.startswith("turn="))
    return int(line.split()[0].removeprefix("turn="))


def _stored(execution: ExecutionRig, binding: str) -> str:
    return base64.b64decode(execution.sessions_data("pool-a-0")[binding]).decode()


def _no_canary(execution: ExecutionRig, runner: Runner, jobs: list[str], binding: str) -> None:
    """The native ids appear in the sessions Secret only: not in status, Events, logs or audit."""
    execution.wait_events(jobs[-1], "Completed")
    events = execution.kube.core.list_namespaced_event(execution.namespace).items
    audit = execution.kube.custom.list_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", execution.namespace, "auditrecords"
    )
    places = {
        "job status": json.dumps([execution.job(name)["status"] for name in jobs]),
        "events": json.dumps([(e.reason, e.message) for e in events]),
        "runner log": runner.proc.raw_log(),
        "session binding": json.dumps(execution.binding(binding)),
        "audit records": json.dumps(audit),
    }
    assert {where: CANARY in text for where, text in places.items()} == dict.fromkeys(places, False)
    assert _stored(execution, binding).startswith(CANARY)  # planted where it belongs


def _job_sessions_opened(runner: Any) -> int:
    """``session/new`` calls for jobs (in a job's ``work/``); the runner's auth probes open their own."""
    entries = runner.methods().entries()
    return sum(1 for e in entries if e["method"] == "session/new" and str(e.get("cwd", "")).endswith("/work"))


def test_the_advertised_compact_command_shrinks_the_bound_session(execution: ExecutionRig) -> None:
    runner = execution.start_runner(env=AGENT_ENV, runner_json_extra=POOL)
    first = _run(execution, "first", runner)
    binding = first["status"]["session"]["binding"]
    assert _turn(first) == 1 and execution.binding(binding)["status"].get("compactions", 0) == 0  # 2000 < 2500
    session = _stored(execution, binding)
    opened = _job_sessions_opened(runner)  # the first job's
    assert opened == 1

    second = _run(execution, "second", runner)
    assert second["status"]["session"]["mode"] == "resumed" and _turn(second) == 2
    status = execution.binding(binding)["status"]
    assert status["compactions"] == 1
    last = status["lastCompaction"]
    assert (last["method"], last["job"], last["usedBefore"], last["usedAfter"], last["contextSize"]) == (
        "compact-command",
        "second",
        3000,
        2000,
        5000,
    )
    assert "no compact command" not in last["reason"] and "50% watermark" in last["reason"]
    assert _stored(execution, binding) == session  # the same session, compacted in place
    note = execution.wait_events("second", "SessionCompacted")[0].message
    assert "compact-command" in note and "3000 -> 2000 of 5000" in note
    assert [e["behaviour"] for e in runner.methods().entries() if e["method"] == "compact"] == ["compact"]
    # The checkpoint turn ran first, on the same session (its third turn), once.
    asked = [p for p in runner.prompts() if p["prompt"].startswith("CHECKPOINT-6a1f")]
    assert [p["turn"] for p in asked] == [3], runner.prompts()

    # The next job resumes the compacted session: one summary turn, then its own.
    third = _run(execution, "third", runner)
    assert third["status"]["session"]["mode"] == "resumed" and _turn(third) == 2
    assert runner.methods().count("session/load") == 2 and _job_sessions_opened(runner) == opened
    assert execution.binding(binding)["status"]["compactions"] == 2  # 3000 again: compacted again
    _no_canary(execution, runner, ["first", "second", "third"], binding)


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("no-compact-command", "no compact command advertised"),
        ("compact-fails", "the compact command failed (ProtocolError)"),
        ("compact-silent", "stayed silent past its window (5s"),
    ],
)
def test_otherwise_the_session_is_archived_for_a_fresh_one_with_the_instructions(
    execution: ExecutionRig, mode: str, why: str
) -> None:
    runner = execution.start_runner(mode=mode, env=AGENT_ENV, runner_json_extra=POOL)
    first = _run(execution, "first", runner)
    binding = first["status"]["session"]["binding"]
    old = _stored(execution, binding)

    second = _run(execution, "second", runner)
    assert _turn(second) == 2
    status = execution.binding(binding)["status"]
    assert (status["compactions"], status["turns"], status["lastJob"]) == (1, 1, "second")
    last = status["lastCompaction"]
    assert (last["method"], last["usedBefore"], last["usedAfter"]) == ("archive", 3000, 2000)
    assert why in last["reason"], last["reason"]
    fresh = _stored(execution, binding)
    assert fresh != old  # the old id is dropped from the Secret: no key holds it
    assert base64.b64encode(old.encode()).decode() not in execution.sessions_data("pool-a-0").values()
    # The fresh session was opened by the same agent and told the system prompt first.
    seeds = [p for p in runner.prompts() if "was archived" in p["prompt"]]
    assert len(seeds) == 1 and seeds[0]["turn"] == 1 and INSTRUCTIONS in seeds[0]["prompt"]
    assert "Job second." not in seeds[0]["prompt"]  # the system prompt only, no job's request
    # Before the archive, the checkpoint turn ran once on the old session (its third turn), and its
    # answer (the reference agent names the turn and the prompt's first line) seeds the fresh one.
    asked = [p for p in runner.prompts() if p["prompt"].startswith("CHECKPOINT-6a1f")]
    assert [p["turn"] for p in asked] == [3], runner.prompts()
    seed = seeds[0]["prompt"]
    assert seed.index(INSTRUCTIONS) < seed.index("## Checkpoint of the archived session") < seed.index("## Session")
    assert "turn=3 " in seed and f"first line: {CHECKPOINT}" in seed
    # The checkpoint's answer went to the agent only: no status, Event or audit record holds it.
    events = execution.kube.core.list_namespaced_event(execution.namespace).items
    held = json.dumps([second["status"], execution.binding(binding), [(e.reason, e.message) for e in events]])
    assert f"first line: {CHECKPOINT}" not in held
    assert execution.wait_events("second", "SessionCompacted")[0].message.count("archive") == 1

    # The next job resumes the fresh session: the seed turn, then its own.
    third = _run(execution, "third", runner)
    assert third["status"]["session"]["mode"] == "resumed" and _turn(third) == 2
    assert execution.binding(binding)["status"]["compactions"] == 2
    _no_canary(execution, runner, ["first", "second", "third"], binding)


def test_a_pool_can_turn_the_checkpoint_turn_off(execution: ExecutionRig) -> None:
    pool = {"compaction": {**POOL["compaction"], "checkpointPrompt": ""}}
    runner = execution.start_runner(mode="no-compact-command", env=AGENT_ENV, runner_json_extra=pool)
    _run(execution, "first", runner)
    second = _run(execution, "second", runner)
    binding = second["status"]["session"]["binding"]
    assert execution.binding(binding)["status"]["lastCompaction"]["method"] == "archive"
    prompts = [p["prompt"] for p in runner.prompts()]
    assert not [p for p in prompts if p.startswith("CHECKPOINT-6a1f") or p.startswith("Checkpoint:")]
    (seed,) = [p for p in prompts if "was archived" in p]
    assert "## Checkpoint" not in seed and INSTRUCTIONS in seed

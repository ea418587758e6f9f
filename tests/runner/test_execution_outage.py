"""Reads degrade, writes don't: a runner whose API server goes away keeps its job and its result.

The real runner program with the reference agent, against the session's real kube-apiserver,
which the test stops (SIGKILL: connections are refused at once) and starts again
(:class:`harness.outage.ApiServerOutage`):

* the API server stops under a running job: the agent finishes while it is away, the runner
  keeps the result (in its journal, ``<state dir>/journal/<uid>.json``) and writes the final
  status once the server is back -- the job completes with its real answer, nothing is abandoned;
* the runner is killed after the job finished but before its final status could be written,
  then started again once the API server is back: the journal's result is written, and the
  agent is not run again;
* a native session id (a canary planted as the reference agent's session prefix) and the
  credential never reach the journal, the job's status or the runner's log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness import wait_for
from harness.outage import ApiServerOutage

from .execution_harness import ExecutionRig, Runner, condition
from .program_harness import CANARY

SESSION_CANARY = "sess-canary-5d1e"
SLOW = "Take your time.\nREFERENCE-AGENT: slow"
AGENT_ENV = {
    "HELMHIVE_REFERENCE_AGENT_SLOW_STEPS": "16",
    "HELMHIVE_REFERENCE_AGENT_SLOW_INTERVAL": "0.25",
    "HELMHIVE_REFERENCE_AGENT_SESSION_PREFIX": SESSION_CANARY,
}


def _entry(runner: Runner, uid: str) -> dict[str, Any]:
    path = runner.rig.state_dir / "journal" / f"{uid}.json"
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def _journal(runner: Runner) -> list[Path]:
    directory = runner.rig.state_dir / "journal"
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def _finished_in_journal(runner: Runner, uid: str) -> dict[str, Any]:
    entry = _entry(runner, uid)
    assert entry["phase"] == "finished", entry
    return entry


def _start(execution: ExecutionRig) -> Runner:
    return execution.start_runner(env=AGENT_ENV)


def _assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert CANARY not in text
        assert SESSION_CANARY not in text


def test_the_api_server_stops_under_a_running_job_and_the_job_completes(
    execution: ExecutionRig, outage: ApiServerOutage
) -> None:
    runner = _start(execution)
    created = execution.create_job("steady", runner=runner, prompt=SLOW, timeout=300)
    uid = created["metadata"]["uid"]
    execution.wait_running("steady")
    # The entry is written right after the API server accepted Running (journal.py): wait for it.
    wait_for(lambda: _entry(runner, uid)["phase"] == "running", timeout=30, describe="the journal's running entry")

    outage.stop()
    # The agent answers while the API server is away: the result is on disk, its write waits.
    entry = wait_for(lambda: _finished_in_journal(runner, uid), timeout=60, describe="the result in the journal")
    assert entry["verdict"]["succeeded"] is True and entry["verdict"]["reason"] == "Completed"
    wait_for(
        lambda: runner.proc.messages("the API server is unreachable; retrying"),
        timeout=30,
        describe="the runner to wait for the API server",
    )
    down = outage.start()
    assert down > 0

    job = execution.wait_finished("steady", timeout=120)
    succeeded = condition(job, "Succeeded")
    assert succeeded is not None and (succeeded["status"], succeeded["reason"]) == ("True", "Completed")
    result = job["status"]["result"]
    assert result["outcome"] == "Completed" and result["summary"] == entry["result"]["summary"]
    assert result["summary"], "the agent's real answer"
    assert runner.proc.popen.poll() is None, "the runner kept running"
    assert not runner.proc.messages("job failed on the API")
    assert not runner.proc.messages("a job ended without its final status")
    assert all(m["outcome"] != "ProtocolError" for m in runner.proc.messages("job finished"))
    wait_for(lambda: not _journal(runner), timeout=30, describe="the journal entry to be removed")
    # Both watches broke with the server: each lists again (what it missed is read whole), says
    # why, and a job queued after the outage is seen and run.
    relisted = {(m["watch"].split("-", 2)[1], m["reason"]) for m in runner.proc.messages("watch listing again")}
    assert {("jobs", "after an error"), ("runner", "after an error")} <= relisted, relisted
    execution.create_job("after-outage", runner=runner, prompt="Say hello.", timeout=300)
    later = execution.wait_finished("after-outage", timeout=120)
    assert condition(later, "Succeeded")["status"] == "True"  # type: ignore[index]
    _assert_no_secret(json.dumps(job), runner.proc.raw_log(), json.dumps(entry))


def test_a_runner_killed_before_its_final_write_replays_the_journal(
    execution: ExecutionRig, outage: ApiServerOutage
) -> None:
    runner = _start(execution)
    created = execution.create_job("kept", runner=runner, prompt=SLOW, timeout=300)
    uid = created["metadata"]["uid"]
    execution.wait_running("kept")

    outage.stop()
    entry = wait_for(lambda: _finished_in_journal(runner, uid), timeout=60, describe="the result in the journal")
    journal_text = _journal(runner)[0].read_text(encoding="utf-8")
    runner.proc.kill()  # the final status was never written: the API server is down
    outage.start()

    held = execution.job("kept")
    assert condition(held, "Running")["status"] == "True", "nothing ended the job while its runner was gone"
    again = runner.rig.start(runner.runner_json)
    job = execution.wait_finished("kept", timeout=120)
    succeeded = condition(job, "Succeeded")
    assert succeeded is not None and (succeeded["status"], succeeded["reason"]) == ("True", "Completed")
    assert job["status"]["result"]["summary"] == entry["result"]["summary"]
    assert job["status"].get("attempts", 0) == entry["attempt"]
    prompts = [p for p in runner.prompts() if "Take your time." in p["prompt"]]
    assert len(prompts) == 1, "the agent ran once; the result came from the journal"
    (replayed,) = wait_for(lambda: again.messages("journal replayed"), timeout=30, describe="the replay logged")
    assert (replayed["phase"], replayed["reason"]) == ("finished", "Completed")
    wait_for(lambda: not _journal(runner), timeout=30, describe="the journal entry to be removed")
    _assert_no_secret(journal_text, json.dumps(job), runner.proc.raw_log(), again.raw_log())

"""How jobs end when they do not simply complete: timeout, cancel, deletion, agent crash, runner restart."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal

import pytest

from harness import wait_for
from helmhive.policy.agentjob.life import parse_agent_job
from helmhive.policy.agentjob.retry import decide_job_retry

from .execution_harness import ExecutionRig, condition

STALL = "Wait for me.\nREFERENCE-AGENT: stall"  # sends nothing until session/cancel


def _ended(job: dict[str, object], reason: str) -> None:
    for ctype in ("Succeeded", "Ready", "Running"):
        got = condition(job, ctype)  # type: ignore[arg-type]
        assert got is not None and (got["status"], got["reason"]) == ("False", reason), (ctype, got)
    assert job["status"]["result"]["outcome"] == reason  # type: ignore[index]
    assert job["status"]["result"]["completedAt"]  # type: ignore[index]


def test_a_job_past_its_timeout_is_timed_out(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    execution.create_job("slowpoke", runner=runner, prompt=STALL, timeout=10)  # the API's minimum
    execution.wait_running("slowpoke")
    job = execution.wait_finished("slowpoke", timeout=60)
    _ended(job, "TimedOut")
    assert "spec.timeoutSeconds (10s) passed" in condition(job, "Succeeded")["message"]
    assert runner.methods().count("session/cancel") == 1  # the ACP turn was cancelled, not abandoned
    (timed_out,) = execution.wait_events("slowpoke", "TimedOut")  # posted after the final status
    assert timed_out.type == "Warning"


def test_cancel_and_delete_cancel_the_turn(execution: ExecutionRig) -> None:
    runner = execution.start_runner(concurrency=2)
    execution.create_job("cancelled", runner=runner, prompt=STALL)
    execution.create_job("deleted", runner=runner, prompt=STALL)
    execution.wait_running("cancelled")
    execution.wait_running("deleted")
    execution.kube.custom.patch_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", execution.namespace, "agentjobs", "cancelled", {"spec": {"cancel": True}}
    )
    job = execution.wait_finished("cancelled")
    _ended(job, "Cancelled")
    assert condition(job, "Succeeded")["message"] == "spec.cancel was set; the turn was cancelled"
    execution.kube.custom.delete_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", execution.namespace, "agentjobs", "deleted"
    )
    wait_for(lambda: runner.methods().count("session/cancel") == 2, timeout=30, describe="both turns to be cancelled")
    cancels = [line for line in runner.proc.messages("cancelling a running job")]
    assert sorted(line["cause"] for line in cancels) == ["Cancelled", "Deleted"]
    wait_for(lambda: runner.rig.report()["activeJobs"] == 0, timeout=30, describe="both slots to be free again")


def test_a_job_cancelled_before_it_starts_never_runs(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    execution.create_job("blocker", runner=runner, prompt=STALL, timeout=30)
    execution.wait_running("blocker")  # the only slot is busy
    execution.create_job("queued", runner=runner, prompt="never sent")
    execution.kube.custom.patch_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", execution.namespace, "agentjobs", "queued", {"spec": {"cancel": True}}
    )
    job = execution.wait_finished("queued")
    assert condition(job, "Succeeded")["reason"] == "Cancelled"
    assert "startedAt" not in job["status"]["result"]
    assert all("never sent" not in p["prompt"] for p in runner.prompts())
    retry = decide_job_retry(job=parse_agent_job(job))
    assert retry is not None and not retry.retry  # a cancellation is final


def test_an_agent_crash_ends_the_job_with_agent_crashed(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    execution.create_job("crashy", runner=runner, prompt="Go.\nREFERENCE-AGENT: crash")
    job = execution.wait_finished("crashy")
    _ended(job, "AgentCrashed")
    assert "exit code 70" in condition(job, "Succeeded")["message"]
    retry = decide_job_retry(job=parse_agent_job(job))
    assert retry is not None and retry.retry  # a connection test has no side effects: once more
    # The runner is fine and takes the next job.
    execution.create_job("after", runner=runner, prompt="Still there?")
    assert condition(execution.wait_finished("after"), "Succeeded")["status"] == "True"


@pytest.mark.parametrize(("journal", "reason"), [(True, "Interrupted"), (False, "RunnerLost")])
def test_a_job_running_when_its_runner_died_is_interrupted(execution: ExecutionRig, journal: bool, reason: str) -> None:
    """Its journal says it started and never finished: Interrupted; with the journal gone, RunnerLost."""
    runner = execution.start_runner()
    created = execution.create_job("orphan", runner=runner, prompt=STALL, timeout=300)
    running = execution.wait_running("orphan")
    assert condition(running, "Running")["message"].startswith("running on runner pool-a-0")
    entry = runner.rig.state_dir / "journal" / f"{created['metadata']['uid']}.json"
    assert json.loads(entry.read_text(encoding="utf-8"))["phase"] == "running"
    runner.proc.popen.send_signal(signal.SIGKILL)  # no shutdown: the job stays Running
    runner.proc.popen.wait(timeout=30)
    assert condition(execution.job("orphan"), "Running")["status"] == "True"
    if not journal:
        shutil.rmtree(entry.parent)
    again = runner.rig.start(runner.runner_json)
    job = execution.wait_finished("orphan", timeout=60)
    _ended(job, reason)  # never finished as done
    assert "restarted while the job was running" in condition(job, "Succeeded")["message"]
    retry = decide_job_retry(job=parse_agent_job(job))
    assert retry is not None and retry.retry  # read-only: the operator may run it once more
    assert again.popen.poll() is None
    wait_for(lambda: not entry.exists(), timeout=30, describe="the journal entry to be removed")


def test_a_job_still_running_when_the_runner_stops_is_interrupted(execution: ExecutionRig) -> None:
    runner = execution.start_runner()  # shutdown grace: 5 s (the rig's pod environment)
    execution.create_job("unlucky", runner=runner, prompt=STALL, timeout=300)
    execution.wait_running("unlucky")
    runner.proc.terminate()  # SIGTERM: the job gets the grace, then its turn is cancelled
    assert runner.proc.wait(timeout=60) == 0
    job = execution.job("unlucky")
    _ended(job, "Interrupted")
    assert runner.methods().count("session/cancel") == 1
    retry = decide_job_retry(job=parse_agent_job(job))
    assert retry is not None and retry.retry  # nothing was written: the operator may run it again


def test_a_later_attempt_placed_here_while_the_earlier_one_still_ran_is_run_after_it(execution: ExecutionRig) -> None:
    """The operator re-queued a job whose runner it wrongly thought lost (a chaos run saw this after an
    etcd restart) and placed the next attempt on the same runner while the first still ran there.
    The runner cancels the first run's turn once the job leaves it; when that run ends (its final
    write refused: the attempt moved on), it looks at the job again and runs the later attempt."""
    runner = execution.start_runner(env={"HELMHIVE_REFERENCE_AGENT_SLOW_STEPS": "40"})
    routed = execution.create_job("again", runner=runner, prompt="Take your time.\nREFERENCE-AGENT: slow")
    execution.wait_running("again")

    def stamp() -> str:
        return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    # What the operator's re-queue writes (helmhive.policy.agentjob.life.requeue), then its next placement.
    status = execution.job("again")["status"]
    requeued = {k: None for k in status if k not in ("profile", "observedGeneration")}
    requeued |= {
        "attempts": 1,
        "conditions": [
            {"type": "Routed", "status": "Unknown", "reason": "RunnerLost", "message": "test re-queue",
             "lastTransitionTime": stamp()},
        ],
    }  # fmt: skip
    execution.patch_status("again", requeued)
    execution.patch_status(
        "again",
        {
            "assignment": {**routed["status"]["assignment"], "assignedAt": stamp()},
            "conditions": [
                {"type": t, "status": s, "reason": "Assigned", "message": "test routing", "lastTransitionTime": stamp()}
                for t, s in (("Routed", "True"), ("Ready", "Unknown"))
            ],
        },
    )

    job = execution.wait_finished("again", timeout=120)
    succeeded = condition(job, "Succeeded")
    assert succeeded is not None and (succeeded["status"], succeeded["reason"]) == ("True", "Completed"), succeeded
    assert job["status"]["attempts"] == 1
    assert len(runner.proc.messages("job started")) == 2, "the first attempt ended, then the second ran"
    assert runner.proc.messages("a later attempt of a job came while it ran here")
    # The first run's turn was cancelled once the re-queue took the job away (the field selector
    # reports that as a deletion), not run to its end; it is logged once.
    causes = [line["cause"] for line in runner.proc.messages("cancelling a running job")]
    assert causes == ["Deleted"], causes
    assert runner.methods().count("session/cancel") == 1

"""Jobs under the control state and on shutdown: the real main loop, API server and reference agent.

Job dispatch to runners belongs to a later issue, so these tests inject a :class:`JobSource` (a
queue) into :class:`RunnerProcess` -- the one seam the loop has for it -- and run the loop in a
thread of its own with the pod's configuration and a Pod-bound token. Jobs are real ACP turns of
the reference agent (``REFERENCE-AGENT: slow`` makes one last a few seconds; ``REFERENCE-AGENT:
stall`` one that only a cancel ends, for the tests that must see a job cancelled whatever the
machine's load, never a slow job that happened to finish first).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness import wait_for
from helmhive.runner.adapters import TurnOutcome, TurnRequest
from helmhive.runner.config import load_config
from helmhive.runner.kube import RunnerKube, load_api_client
from helmhive.runner.program.main import Job, RunnerProcess, SystemClock

from .agent_harness import MethodLog
from .program_harness import RunnerRig, reference_runner_json


class QueueJobs:
    """A JobSource fed from the test thread."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.finished: dict[str, Job] = {}
        self.taken: list[str] = []

    async def take(self) -> Job:
        job = await self.queue.get()
        self.taken.append(job.id)
        return job

    def finish(self, job: Job) -> None:
        self.finished[job.id] = job


@dataclass
class InProcessRunner:
    process: RunnerProcess
    loop: asyncio.AbstractEventLoop
    jobs: QueueJobs
    workdir: Path
    thread: threading.Thread
    exit_code: list[int] = field(default_factory=list)

    def submit(self, job_id: str, prompt: str) -> None:
        job = Job(id=job_id, request=TurnRequest(prompt=prompt, cwd=str(self.workdir)))
        self.loop.call_soon_threadsafe(self.jobs.queue.put_nowait, job)

    def outcome(self, job_id: str) -> TurnOutcome | None:
        job = self.jobs.finished.get(job_id)
        return job.result.outcome if job is not None and job.result is not None else None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.process.stop.set)


@pytest.fixture
def start_runner(rig: RunnerRig, tmp_path: Path) -> Iterator[Callable[..., InProcessRunner]]:
    """Start the runner loop in a thread: ``start_runner(grace=seconds)``; stopped afterwards."""
    started: list[InProcessRunner] = []

    def start(*, grace: float = 1.0) -> InProcessRunner:
        runner_json = reference_runner_json(agent_state=rig.agent_state)
        runner_json["adapter"]["acp"]["env"] += [
            {"name": "HELMHIVE_REFERENCE_AGENT_SLOW_STEPS", "value": "12"},
            {"name": "HELMHIVE_REFERENCE_AGENT_SLOW_INTERVAL", "value": "0.25"},
        ]
        environ = rig.environ(runner_json, extra_env={"HELMHIVE_SHUTDOWN_GRACE_SECONDS": str(grace)})
        config = load_config(environ=environ, read_text=lambda path: path.read_text(encoding="utf-8"))
        workdir = tmp_path / "work"
        workdir.mkdir(exist_ok=True)
        ready = threading.Event()
        holder: dict[str, Any] = {}
        exit_code: list[int] = []

        def main() -> None:
            async def run() -> int:
                kube = RunnerKube(load_api_client(str(config.env.kubeconfig)), namespace=config.env.namespace)
                jobs = QueueJobs()
                process = RunnerProcess(config=config, kube=kube, clock=SystemClock(), jobs=jobs)
                holder.update(process=process, jobs=jobs, loop=asyncio.get_running_loop())
                ready.set()
                try:
                    return await process.run()
                finally:
                    kube.close()

            exit_code.append(asyncio.run(run()))

        thread = threading.Thread(target=main, name="runner-under-test", daemon=True)
        thread.start()
        assert ready.wait(30), "the runner loop did not start"
        runner = InProcessRunner(
            process=holder["process"],
            loop=holder["loop"],
            jobs=holder["jobs"],
            workdir=workdir,
            thread=thread,
            exit_code=exit_code,
        )
        started.append(runner)
        wait_for(lambda: rig.report().get("registeredAt"), timeout=60, describe="registration")
        return runner

    yield start
    for runner in started:
        if runner.thread.is_alive():
            with contextlib.suppress(RuntimeError):
                runner.stop()
            runner.thread.join(timeout=40)


SLOW = "REFERENCE-AGENT: slow\nWork slowly."
STALL = "REFERENCE-AGENT: stall\nWait for me."  # sends nothing until session/cancel (idle watchdog: 300 s)
QUICK = "List the services."


def test_draining_lets_the_running_job_finish_and_takes_no_new_one(
    rig: RunnerRig, start_runner: Callable[..., InProcessRunner]
) -> None:
    runner = start_runner()
    runner.submit("a", SLOW)
    wait_for(lambda: rig.report().get("activeJobs") == 1, timeout=30, describe="activeJobs=1 in the report")
    rig.set_control_state("Draining")
    wait_for(lambda: runner.process.state.value == "Draining", timeout=30, describe="the runner to see Draining")
    runner.submit("b", QUICK)
    wait_for(lambda: runner.outcome("a") is TurnOutcome.COMPLETED, timeout=30, describe="job a to complete")
    wait_for(lambda: rig.report().get("activeJobs") == 0, timeout=30, describe="activeJobs=0 in the report")
    assert runner.jobs.taken == ["a"], "no job is taken while Draining"
    assert runner.jobs.queue.qsize() == 1
    rig.set_control_state("Active")
    wait_for(lambda: runner.outcome("b") is TurnOutcome.COMPLETED, timeout=30, describe="job b after Active")
    assert runner.jobs.taken == ["a", "b"]


def test_disabled_cancels_running_jobs_and_stays_registered(
    rig: RunnerRig, start_runner: Callable[..., InProcessRunner]
) -> None:
    runner = start_runner()
    runner.submit("a", STALL)
    wait_for(lambda: runner.process.active_jobs == 1, timeout=30, describe="job a running")
    rig.set_control_state("Disabled")
    wait_for(lambda: runner.outcome("a") is TurnOutcome.CANCELLED, timeout=30, describe="job a cancelled")
    runner.submit("b", QUICK)
    wait_for(lambda: rig.report().get("activeJobs") == 0, timeout=30, describe="activeJobs=0 in the report")
    assert runner.jobs.taken == ["a"]
    assert runner.thread.is_alive() and rig.lease_exists()


def test_sigterm_cancels_a_job_past_the_grace_and_releases_the_lease(
    rig: RunnerRig, start_runner: Callable[..., InProcessRunner]
) -> None:
    runner = start_runner(grace=1.0)
    runner.submit("a", STALL)
    wait_for(lambda: runner.process.active_jobs == 1, timeout=30, describe="job a running")
    runner.stop()
    runner.thread.join(timeout=40)
    assert runner.exit_code == [0]
    assert runner.outcome("a") is TurnOutcome.CANCELLED, "a stalled job ends only when the grace is over"
    assert MethodLog(rig.agent_state).count("session/cancel") == 1  # the turn was cancelled, not abandoned
    assert not rig.lease_exists()


def test_sigterm_lets_a_job_finish_within_the_grace(
    rig: RunnerRig, start_runner: Callable[..., InProcessRunner]
) -> None:
    runner = start_runner(grace=20.0)
    runner.submit("a", SLOW)
    wait_for(lambda: runner.process.active_jobs == 1, timeout=30, describe="job a running")
    runner.stop()
    runner.submit("b", QUICK)
    runner.thread.join(timeout=40)
    assert runner.exit_code == [0]
    assert runner.outcome("a") is TurnOutcome.COMPLETED
    assert runner.outcome("b") in (None, TurnOutcome.CANCELLED), "no job is started after SIGTERM"
    assert MethodLog(rig.agent_state).count("session/prompt") == 1
    assert not rig.lease_exists()

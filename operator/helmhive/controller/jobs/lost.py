"""Jobs whose runner died: end them with ``RunnerLost``, then re-queue only what is safe to re-run.

A runner that dies mid-job cannot say so. Its Lease stops being renewed, and the runner
controller (:mod:`helmhive.controller.runners.derived`) derives ``status.reportedStatus = Offline``;
or its Runner is deleted. Either is an event on the **runner**, so this module reacts to
runners, not to jobs, and reads nothing from the API server while no runner is lost:

* the operator's AgentJob store (:class:`~helmhive.policy.routing.job_store.JobStore`, not a Kopf index:
  those are O(N²) at start-up over thousands of jobs): every assigned, unfinished job (running
  or not) by its runner;
* index ``lost_runner_liveness``: every Runner's derived status, by ``(namespace, name)``;
* on a Runner event that says ``Offline``, or its deletion: every job in the store under that
  runner is ended;
* on a job's own event (its assignment observed, and every job at start-up, as the operator's
  AgentJob watch lists them: :mod:`helmhive.controller.jobs.watch`): one look at the runners'
  index, so a job held on a runner that was already Offline or absent (while the operator was
  down, or before the store held the job) is ended too.

Kopf runs no handler before every index is filled from its initial list, and the AgentJob watch
runs no job step before Kopf has called a handler (its gate), so "absent from the index" means
absent from the cluster. The store takes every job event before this module's
reaction to it, so a job is either in the store when its runner's transition arrives or
checked by its own event afterwards. Ending a job reads it once (a GET), makes sure the run being
ended has its routing audit records (a re-queue clears the assignment they are built from), builds the lost step's
status patch with :func:`helmhive.policy.agentjob.lost.build_lost_job_status` (from
:func:`helmhive.policy.agentjob.life.decide_lost`: ended, or re-queued when
:func:`helmhive.policy.agentjob.retry.decide_job_retry` allows it) and merge-patches only the fields that
step owns, conditionally on the resourceVersion just read, so a retried attempt never ends or
re-queues a job twice and a field another writer owns is never overwritten with a stale copy.
The re-run window applies as to any failure: the runner's last heartbeat in the index
(``status.lastHeartbeatTime``) is when the loss happened. A write
that loses a race re-reads and decides again; one that fails is retried with a backoff, for as
long as the job is still held on a runner that is still lost.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.reasons import Reason
from helmhive.controller.kube.door import Conflict, NotFound
from helmhive.controller.router.audits import RouterAudits, ensure_routing_recorded
from helmhive.controller.runtime import Runtime
from helmhive.policy.agentjob.life import decide_held_runner
from helmhive.policy.agentjob.lost import (
    JobKey,
    LostJobUpdate,
    RunnerKey,
    RunnerLiveness,
    build_lost_job_status,
    build_runner_liveness,
    decide_runner_lost,
)

__all__ = ["LostJobs", "register"]

AGENT_JOB = kind_by_name("AgentJob")
log = logging.getLogger("helmhive.controller.jobs.lost")

_WRITERS = 8  # jobs ended concurrently (one GET, one status patch and one Event each)
_BACKOFF = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)  # seconds before each further attempt at one job


class LostJobs:
    """Ends the jobs of lost runners: at most one task per job, retried until the job is no longer held."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.jobs = runtime.job_store.store
        self.audits: RouterAudits | None = None
        """The router's audit queue (set when routing is registered): its lingering decisions are written first."""
        self.runners: kopf.Index[RunnerKey, RunnerLiveness] | None = None
        self.tasks: dict[JobKey, asyncio.Task[None]] = {}
        self._gate = asyncio.Semaphore(_WRITERS)

    def bind(self, indexes: dict[str, Any]) -> None:
        """Keep Kopf's live index view of runners (handlers receive it as a keyword argument)."""
        self.runners = indexes["lost_runner_liveness"]

    def liveness(self, runner: RunnerKey) -> RunnerLiveness | None:
        """The runner as the index holds it (None: absent, or the indexes are not bound yet)."""
        if self.runners is None:
            return None
        return next(iter(self.runners.get(runner, ())), None)

    def lost(self, runner: RunnerKey) -> str | None:
        """Why ``runner`` counts as lost, from the index alone (None before the indexes are bound)."""
        if self.runners is None:
            return None
        return decide_runner_lost(self.liveness(runner))

    def held_on(self, runner: RunnerKey) -> list[JobKey]:
        return list(self.jobs.held_on(runner))

    def runner_lost_with_jobs(self, body: Mapping[str, Any], *, deleted: bool) -> RunnerKey | None:
        """A Runner's event (``deleted``: its deletion): the runner, if it is lost and jobs are held on it."""
        liveness = build_runner_liveness(body)
        if decide_runner_lost(None if deleted else liveness) is None or not self.held_on(liveness.key):
            return None
        return liveness.key

    def job_on_lost_runner(self, body: Mapping[str, Any]) -> RunnerKey | None:
        """A job's event: the runner it is held on, if that runner is lost (one index look-up, no API read)."""
        runner = decide_held_runner(body)
        if runner is None or self.lost(runner) is None:
            return None
        return runner

    def end(self, job: JobKey, runner: RunnerKey) -> None:
        """End ``job`` (held on the lost ``runner``) in the background, unless that is already under way."""
        current = self.tasks.get(job)
        if current is not None and not current.done():
            return  # the running task re-reads the job before every attempt
        task = asyncio.create_task(self._end(job, runner), name=f"runner-lost {job[0]}/{job[1]}")
        self.tasks[job] = task
        task.add_done_callback(lambda done: self.tasks.pop(job, None) if self.tasks.get(job) is done else None)

    async def stop(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _end(self, job: JobKey, runner: RunnerKey) -> None:
        attempt = 0
        while True:
            await asyncio.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
            attempt += 1
            message = self.lost(runner)
            if message is None:
                return  # the runner came back (Online again): its jobs carry on
            try:
                async with self._gate:
                    if await self._end_once(job, runner, message):
                        return
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a bad attempt must not leave the job held forever
                log.warning("job %s/%s: RunnerLost not written (will retry): %s", job[0], job[1], err)

    async def _end_once(self, job: JobKey, runner: RunnerKey, message: str) -> bool:
        """One read-decide-write pass. True when done (written, finished, gone or moved); False to retry."""
        kube = self.runtime.kube
        try:
            fresh = await kube.get(AGENT_JOB, job[1], namespace=job[0])
        except NotFound:
            return True
        if decide_held_runner(fresh) != runner:
            return True  # finished meanwhile, or re-queued and placed elsewhere
        now = self.runtime.clock()
        window = self.runtime.config.retry_window
        update = build_lost_job_status(job=fresh, message=message, now=now, runner=self.liveness(runner), window=window)
        await self._record_outgoing_run(fresh, now)
        try:
            await kube.patch_status(AGENT_JOB, job[1], update.patch, namespace=job[0])
        except NotFound:
            return True
        except Conflict:
            return False  # someone wrote first: re-read and decide again
        self._report(fresh, update, message)
        await kube.post_event(
            involved=fresh,
            reason=Reason.RUNNER_LOST,
            message=f"{message} ({update.summary})",
            event_type="Warning",
            now=now,
        )
        return True

    async def _record_outgoing_run(self, job: dict[str, Any], now: dt.datetime) -> None:
        """Make sure the run being ended has its routing records before a re-queue clears its assignment.

        Routing writes its records off the assignment path, and recovery after a restart writes the
        missing ones from a job's *current* status; once re-queued, the status no longer names this
        run's runner. So the lost step writes them first (a decision some batch holds already is not
        written again).
        """
        if self.audits is not None:
            await self.audits.write_now(job)
        await ensure_routing_recorded(self.runtime.kube, job, now=now)

    @staticmethod
    def _report(job: dict[str, Any], update: LostJobUpdate, message: str) -> None:
        meta = job["metadata"]
        log.warning("job %s/%s %s: %s", meta["namespace"], meta["name"], update.verdict.value, message)


def register(runtime: Runtime, lost: LostJobs | None = None) -> LostJobs:
    """Register the runners' index and the runner and job reactions; return the handler state (tests read it)."""
    lost = lost or LostJobs(runtime)

    @kopf.on.startup()
    async def start_lost_jobs(**kwargs: Any) -> None:
        lost.bind(kwargs)

    @kopf.on.cleanup()
    async def stop_lost_jobs(**_: Any) -> None:
        await lost.stop()

    # Index functions return {} (not None) when an object no longer belongs: None keeps the old value.
    @kopf.index(GROUP, VERSION, "runners", id="lost_runner_liveness")
    async def lost_runner_liveness(body: kopf.Body, **_: Any) -> dict[RunnerKey, RunnerLiveness]:
        liveness = build_runner_liveness(body)
        return {liveness.key: liveness}

    # Event handlers run after the indexes took the same event in. The filters are plain calls, so
    # the handlers (and Kopf's log line for each) run only when there is something to end.
    def runner_is_lost(body: kopf.Body, type: str | None, **_: Any) -> bool:
        return lost.runner_lost_with_jobs(body, deleted=type == "DELETED") is not None

    @kopf.on.event(GROUP, VERSION, "runners", when=runner_is_lost)
    async def end_jobs_of_lost_runner(body: kopf.Body, type: str | None, **_: Any) -> None:
        runner = lost.runner_lost_with_jobs(body, deleted=type == "DELETED")
        if runner is not None:
            for job in lost.held_on(runner):
                lost.end(job, runner)

    async def end_job_on_lost_runner(event_type: str | None, body: Mapping[str, Any]) -> None:
        runner = None if event_type == "DELETED" else lost.job_on_lost_runner(body)
        if runner is not None:
            meta = body["metadata"]
            lost.end((str(meta["namespace"]), str(meta["name"])), runner)

    runtime.job_events.subscribe("lost-runner", end_job_on_lost_runner)

    return lost

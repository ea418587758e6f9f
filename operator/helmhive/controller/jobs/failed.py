"""Jobs their runner ended with an infrastructure failure: re-queue the ones safe to re-run, on their event.

The runner ends a job ``Succeeded=False`` with ``AgentCrashed``, ``AgentUnresponsive``,
``Interrupted`` (or ``RunnerLost`` after a restart without its journal) and never runs it again.
This module subscribes to the operator's one AgentJob event handler (``runtime.job_events``):
for each event it asks the pure :func:`helmhive.policy.agentjob.failed.decide_failed_requeue`, which
is a plain call on the event's object and returns None for almost every event, so nothing is read
from the API server unless there is something to write. When it does decide, the write follows
the lost-runner step (:mod:`helmhive.controller.jobs.lost`):

1. the outgoing run's routing records are ensured first (a re-queue clears the assignment they
   are built from);
2. the status patch (``requeue``, or ``close`` with the verdict) is merge-patched conditionally on
   the resourceVersion the decision was made from; a 409 re-reads the job and decides again;
3. a Warning Event says what was decided (reason ``RetryAllowed``, ``MayHaveSideEffects``,
   ``RetryLimitReached``, ``RetryWindowPassed`` or ``NotRetryable``).

A failure is re-run only within the operator's re-run window (``--retry-window-seconds``,
``HELMHIVE_RETRY_WINDOW_SECONDS``, default 15 minutes): the initial listing of an operator started
after an upgrade closes older undecided failures instead of re-running them.

No polling and no timers: an API error is retried a few times with a short backoff within the
same task, then logged; the job's next event (or the operator's restart, whose initial listing is
events too) decides it again, because an undecided job still reads as undecided.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from helmhive.api.kinds import kind_by_name
from helmhive.controller.kube.door import Conflict, KubeError, NotFound
from helmhive.controller.router.audits import ensure_routing_recorded
from helmhive.controller.runtime import Runtime
from helmhive.policy.agentjob.failed import FailedOutcome, decide_failed_requeue
from helmhive.policy.agentjob.life import parse_agent_job

__all__ = ["FailedJobs", "register"]

AGENT_JOB = kind_by_name("AgentJob")
log = logging.getLogger("helmhive.controller.jobs.failed")

JobKey = tuple[str, str]
_BACKOFF = (0.0, 0.5, 1.0, 2.0, 5.0)  # seconds before each attempt at one job (a 409 re-reads at once)


class FailedJobs:
    """Re-queues or closes failed jobs: at most one task per job."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.tasks: dict[JobKey, asyncio.Task[None]] = {}

    def on_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A job's event: start a task when the pure step has something to write (a plain call otherwise)."""
        if event_type == "DELETED":
            return
        job = parse_agent_job(body)
        if decide_failed_requeue(job, now=self.runtime.clock(), window=self.runtime.config.retry_window) is None:
            return
        current = self.tasks.get(job.key)
        if current is not None and not current.done():
            return  # the running task re-reads the job before every attempt
        task = asyncio.create_task(self._settle(job.key, dict(body)), name=f"failed-job {job.namespace}/{job.name}")
        self.tasks[job.key] = task
        task.add_done_callback(lambda done: self.tasks.pop(job.key, None) if self.tasks.get(job.key) is done else None)

    async def stop(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _settle(self, key: JobKey, body: dict[str, Any]) -> None:
        fresh: dict[str, Any] | None = body
        for delay in _BACKOFF:
            await asyncio.sleep(delay)
            try:
                if fresh is None:
                    fresh = await self.runtime.kube.get(AGENT_JOB, key[1], namespace=key[0])
                if await self._once(key, fresh):
                    return
            except NotFound:
                return
            except asyncio.CancelledError:
                raise
            except KubeError as err:
                log.warning("job %s/%s: retry decision not written (will try again): %s", *key, err)
            fresh = None  # re-read before the next attempt
        log.warning("job %s/%s: retry decision not written; its next event decides again", *key)

    async def _once(self, key: JobKey, body: dict[str, Any]) -> bool:
        """One decide-write pass on ``body``. True when done (written, or nothing to write); False on a 409."""
        now = self.runtime.clock()
        job = parse_agent_job(body)
        outcome = decide_failed_requeue(job, now=now, window=self.runtime.config.retry_window)
        if outcome is None:
            return True
        kube = self.runtime.kube
        if outcome.requeued:
            await ensure_routing_recorded(kube, body, now=now)
        try:
            await kube.patch_status(
                AGENT_JOB, key[1], outcome.patch.conditional(job.resource_version), namespace=key[0]
            )
        except Conflict:
            return False
        self._report(key, outcome, attempts=job.attempts)
        await kube.post_event(
            involved=body,
            reason=outcome.retry.reason,
            message=_event_message(outcome, attempts=job.attempts),
            event_type="Warning",
            now=now,
        )
        return True

    @staticmethod
    def _report(key: JobKey, outcome: FailedOutcome, *, attempts: int) -> None:
        log.warning("job %s/%s: %s", *key, _event_message(outcome, attempts=attempts))


def _event_message(outcome: FailedOutcome, *, attempts: int) -> str:
    if outcome.requeued:
        return f"{outcome.failure.value}: re-queued (re-run {attempts + 1}): {outcome.retry.message}"
    return f"{outcome.failure.value}: not re-run: {outcome.retry.message}"


def register(runtime: Runtime, failed: FailedJobs | None = None) -> FailedJobs:
    """Subscribe to the AgentJob events; return the handler state (tests read it)."""
    failed = failed or FailedJobs(runtime)

    async def job_failed(event_type: str | None, body: Mapping[str, Any]) -> None:
        failed.on_event(event_type, body)

    runtime.job_events.subscribe("failed-requeue", job_failed)

    @kopf.on.cleanup()
    async def stop_failed_jobs(**_: Any) -> None:
        await failed.stop()

    return failed

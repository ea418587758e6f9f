"""The status writes of one AgentJob run: what the runner shares with every job, and the writes.

:class:`JobWrites` is the base of :class:`~helmhive.runner.jobs.execution.JobExecution`: a run's
state (started, ended, kept in the journal, the cancel cause, the attempt it started at) and
every write it makes of its job: the status under a ``resourceVersion`` precondition, re-read
and re-built on a conflict, only while the job is still this run's; its Events; its journal
entry. :meth:`JobWrites.end_unstarted` ends a job no run of this process started.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.runner.config import RunnerConfig
from helmhive.runner.egress.proxy import EgressProxy
from helmhive.runner.jobs.agents import JobAdapterFactory, PodAdapterFactory
from helmhive.runner.jobs.jobpod import JobPodSettings
from helmhive.runner.jobs.journal import JobJournal, JournalEntry, JournalPhase
from helmhive.runner.jobs.resources import JobResources
from helmhive.runner.jobs.status import CancelCause, JobEnding, build_final_status, view_job
from helmhive.runner.kube import Conflict, KubeError, NotFound, RunnerKube
from helmhive.runner.logs import fields
from helmhive.runner.sandbox.limits import LimitSupport
from helmhive.runner.sessions.bindings import SessionStore

__all__ = ["AGENT_JOBS", "ExecutionContext", "JobWrites"]

AGENT_JOBS = "agentjobs"
_RETRIES = 5
log = logging.getLogger("helmhive.runner.jobs.execution")


@dataclass(frozen=True, kw_only=True)
class ExecutionContext:
    """What every job of one runner shares."""

    kube: RunnerKube
    config: RunnerConfig
    now: Callable[[], dt.datetime]
    job_adapter: JobAdapterFactory
    sessions: SessionStore
    landlock_abi: int
    limit_support: LimitSupport
    """What the launcher can enforce here (probed once at start): see :mod:`helmhive.runner.sandbox.limits`."""
    egress_port: int | None = None
    """The runner's egress proxy (``credentialIsolation: Proxy``): with the network disabled, the only port."""
    egress: EgressProxy | None = None
    """The proxy itself: each job gets a listener of its own on it (:mod:`helmhive.runner.jobs.resources`)."""
    journal: JobJournal | None = None
    """Where started and finished jobs are kept until the API server has their final status."""
    job_pods: JobPodSettings | None = None
    """Set with ``execution.mode: JobPod``: each job's agent runs in a pod of its own
    (:mod:`helmhive.runner.jobs.podsteps`), started by ``pod_adapter``."""
    pod_adapter: PodAdapterFactory | None = None

    @property
    def runner(self) -> str:
        return self.config.env.runner_name


class JobWrites:
    """A run's state and its writes; :meth:`request_cancel` may be called at any time from the job source."""

    def __init__(self, *, ctx: ExecutionContext, name: str, uid: str) -> None:
        self.ctx = ctx
        self.name = name
        self.uid = uid
        self.started = False
        self.ended = False
        """The job's final status is written (or the job is gone): the source may forget it."""
        self.kept = False
        """The job finished but its final status was not written: the journal holds it for the source."""
        self.cause: CancelCause | None = None
        self._cancel: asyncio.Event | None = None
        self._obj: dict[str, Any] | None = None
        self._kept = False
        """The last turn's session id was stored for the job's binding."""
        self._resources = JobResources()
        self._disk_hit: str | None = None
        """Why the job is over its disk limit (:mod:`helmhive.runner.sandbox.disk`), once it is."""
        self.attempt: int | None = None
        """``status.attempts`` when this process started the job: its final status is written only at that attempt."""

    def request_cancel(self, cause: CancelCause) -> None:
        if self.cause is None:
            self.cause = cause
        self._resources.revoke()  # the job is ending: its key is void before its agent is asked to stop
        if self._cancel is not None:
            self._cancel.set()

    def _log(self, level: int, message: str, **extra: Any) -> None:
        log.log(level, message, extra=fields(runner=self.ctx.runner, job=self.name, **extra))

    # -- API ------------------------------------------------------------------------------
    async def _patch(self, build: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any] | None:
        """Patch the job's status from a fresh read; None if the job is gone (or was re-created)."""
        for _ in range(_RETRIES):
            try:
                obj = await self.ctx.kube.get_object(AGENT_JOBS, self.name)
            except NotFound:
                return None
            if obj["metadata"].get("uid") != self.uid:
                return None
            status = build(obj)
            if status is None:
                return obj
            body = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "status": status}
            try:
                return await self.ctx.kube.merge_patch_status(AGENT_JOBS, self.name, body)
            except Conflict:
                continue
            except NotFound:
                return None
        raise KubeError(409, f"job {self.name} kept changing; its status was not written")

    async def _event(self, job: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        await self.ctx.kube.post_event(
            runner=dict(job),
            kind="AgentJob",
            reason=reason.split(":", 1)[0],
            message=message,
            now=self.ctx.now(),
            event_type="Warning" if warning else "Normal",
        )

    async def _finish(self, verdict: JobEnding, result: Mapping[str, Any] | None = None) -> None:
        """Write the final status, unless the job finished already or is no longer this run's (re-queued)."""
        wrote = False

        def build(obj: dict[str, Any]) -> dict[str, Any] | None:
            nonlocal wrote
            view = view_job(obj)
            if view.finished or not self._still_mine(obj):
                return None
            wrote = True
            return build_final_status(job=obj, verdict=verdict, result=result or {}, now=self.ctx.now())

        obj = await self._patch(build)
        self.ended = True
        self._forget()
        if not wrote:
            self._log(logging.INFO, "job already ended or no longer this runner's", reason=verdict.reason)
            return
        self._log(logging.INFO, "job ended", reason=verdict.reason, succeeded=verdict.succeeded)
        if obj is not None:
            await self._event(obj, verdict.reason, verdict.message[:1000], warning=not verdict.succeeded)

    def _still_mine(self, obj: Mapping[str, Any]) -> bool:
        """Assigned to this runner, at the attempt this process started (any attempt before it started)."""
        view = view_job(obj)
        return view.runner == self.ctx.runner and (self.attempt is None or view.attempts == self.attempt)

    def _journal(
        self, phase: JournalPhase, verdict: JobEnding | None = None, result: Mapping[str, Any] | None = None
    ) -> None:
        if self.ctx.journal is None or self.attempt is None:
            return
        entry = JournalEntry(
            uid=self.uid, name=self.name, attempt=self.attempt, phase=phase, verdict=verdict, result=result
        )
        try:
            self.ctx.journal.write(entry)
        except OSError as exc:  # the run goes on; only a restart before the final write would lose it
            self._log(logging.WARNING, "journal not written", error=type(exc).__name__, detail=str(exc)[:300])

    def _forget(self) -> None:
        if self.ctx.journal is not None:
            with contextlib.suppress(OSError):
                self.ctx.journal.remove(self.uid)

    async def end_unstarted(
        self,
        verdict: JobEnding,
        *,
        require_running: bool,
        attempt: int | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> bool:
        """End a job this process did not run (cancelled while queued, lost, or finished by an earlier
        process whose journal kept the result); True if written. With ``attempt``, only at that attempt."""
        wrote = False

        def build(obj: dict[str, Any]) -> dict[str, Any] | None:
            nonlocal wrote
            view = view_job(obj)
            if view.finished or view.runner != self.ctx.runner or (require_running and not view.running):
                return None
            if attempt is not None and view.attempts != attempt:
                return None
            wrote = True
            return build_final_status(job=obj, verdict=verdict, result=dict(result or {}), now=self.ctx.now())

        obj = await self._patch(build)
        if wrote and obj is not None:
            self._log(logging.INFO, "job ended", reason=verdict.reason, succeeded=verdict.succeeded)
            await self._event(obj, verdict.reason, verdict.message, warning=not verdict.succeeded)
        return wrote

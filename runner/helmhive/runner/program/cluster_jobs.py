"""The AgentJobs assigned to this runner, as the main loop's job source.

:class:`ClusterJobSource` watches only this runner's assignments -- a list and watch of
``agentjobs`` with the field selector ``status.assignment.runner=<runner>`` (a selectable field
of the CRD), never a list of everything -- and turns each event into an action with the pure
:func:`~helmhive.runner.jobs.status.decide_job_action`:

* a job assigned here and not started is queued; :meth:`take` hands the oldest to the main
  loop, which runs it (:class:`~helmhive.runner.jobs.execution.JobExecution`) when a slot is free
  and the runner is Active;
* ``spec.cancel`` or deletion of a running job cancels its turn; a queued job that is cancelled
  is finished as ``Cancelled`` without running;
* a started job that is no longer this run's has its turn cancelled: re-queued, which the field
  selector reports as a deletion (``Deleted``), or, when the watch missed that, an event or a
  re-list that shows it assigned elsewhere, at a later attempt or gone (``Superseded``); nothing
  is written for it, and a later attempt placed here runs once the cancelled run ends;
* a job that says it is Running here but is not running in this process was lost by an
  earlier process of this runner (it restarted mid-job): it ends with ``RunnerLost``, and the
  operator's retry policy (:mod:`helmhive.policy.agentjob.retry`) decides whether it runs again.

The watch runs in a thread; events reach the event loop with ``call_soon_threadsafe``; the
runner stops and joins that thread before it exits (:meth:`ClusterJobSource.join`). Before
the first job runs, the homes of session bindings that no longer exist are removed
(:func:`~helmhive.runner.sessions.bindings.sweep_session_homes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict
from typing import Any

from helmhive.api.jobpod import RUNNER_PROXY_PORT
from helmhive.api.reasons import Reason
from helmhive.policy.jobpods.identity import JobRef
from helmhive.runner.config import RunnerConfig
from helmhive.runner.egress.listeners import authority
from helmhive.runner.egress.proxy import build_request_limits
from helmhive.runner.jobs.agents import build_job_adapter, build_pod_job_adapter
from helmhive.runner.jobs.execution import AGENT_JOBS, ExecutionContext, JobExecution
from helmhive.runner.jobs.jobpod import JobPodSettings, jobpod_command
from helmhive.runner.jobs.journal import JobJournal, JournalEntry, decide_recovery
from helmhive.runner.jobs.podclaim import remove_job_pods
from helmhive.runner.jobs.status import CancelCause, JobAction, JobEnding, decide_job_action, decide_unlisted, view_job
from helmhive.runner.kube import KubeError, WatchThread
from helmhive.runner.logs import fields
from helmhive.runner.patience import PatientKube
from helmhive.runner.program.main import Job, RunnerProcess
from helmhive.runner.sandbox.cgroups import build_cgroup_prefix, remove_stale_job_cgroups
from helmhive.runner.sandbox.landlock import landlock_abi
from helmhive.runner.sandbox.limits import build_sandbox_report, probe_limit_support
from helmhive.runner.sessions.bindings import SessionStore, sweep_session_homes

__all__ = ["ClusterJobSource", "build_job_pod_settings", "cluster_jobs"]

log = logging.getLogger("helmhive.runner.program.cluster_jobs")
_DONE_MEMORY = 4096


class ClusterJobSource:
    """A :class:`~helmhive.runner.program.main.JobSource` fed by a watch of this runner's assignments."""

    def __init__(self, *, ctx: ExecutionContext) -> None:
        self.ctx = ctx
        self._pending: OrderedDict[str, str] = OrderedDict()  # uid -> name, oldest first
        self._in_flight: dict[str, JobExecution] = {}
        self._done: OrderedDict[str, int | None] = OrderedDict()
        """uid -> the attempt (``status.attempts``) this process ended; None: not known (any attempt)."""
        self._lost: set[str] = set()
        self._seen_in_flight: dict[str, tuple[str, dict[str, Any]]] = {}
        """uid -> the last event of a job seen while this process ran it (looked at again when the run ends)."""
        self._ready = asyncio.Event()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweep: asyncio.Task[None] | None = None
        self._watch: WatchThread | None = None

    @property
    def selector(self) -> str:
        return f"status.assignment.runner={self.ctx.runner}"

    def _log(self, level: int, message: str, **extra: Any) -> None:
        log.log(level, message, extra=fields(runner=self.ctx.runner, **extra))

    # -- watch ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start watching (from the event loop's thread), and sweep the homes of deleted bindings."""
        loop = self._loop = asyncio.get_running_loop()
        self._sweep = asyncio.create_task(self._sweep_homes(), name=f"sweep-homes-{self.ctx.runner}")
        self._spawn(self._replay_journal())

        def on_event(kind: str, obj: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(self._on_event, kind, obj)

        def on_list(items: list[dict[str, Any]]) -> None:
            loop.call_soon_threadsafe(self._on_list, items)

        def on_error(exc: KubeError) -> None:
            loop.call_soon_threadsafe(
                lambda: self._log(logging.WARNING, "watching assigned jobs failed; retrying", status=exc.status)
            )

        self._watch = self.ctx.kube.watch_objects(
            AGENT_JOBS,
            field_selector=self.selector,
            on_event=on_event,
            on_list=on_list,
            on_error=on_error,
            stop=self._stop,
            timeout_s=self.ctx.config.env.watch_round_seconds,
            thread_name=f"watch-jobs-{self.ctx.runner}",
        )

    def stop(self) -> None:
        """No more events; the watch's thread is interrupted (:meth:`join` waits for it to end)."""
        if self._watch is not None:
            self._watch.stop()
        self._stop.set()

    def join(self, timeout: float) -> bool:
        return self._watch is None or self._watch.join(timeout)

    async def _sweep_homes(self) -> None:
        try:
            removed = await sweep_session_homes(store=self.ctx.sessions, state_dir=self.ctx.config.env.state_dir)
        except OSError as exc:
            self._log(logging.WARNING, "sweeping session homes failed", error=type(exc).__name__, detail=str(exc))
            return
        if removed:
            self._log(logging.INFO, "removed the homes of deleted session bindings", bindings=removed)

    def _on_list(self, items: list[dict[str, Any]]) -> None:
        listed = set()
        for obj in items:
            listed.add(str((obj.get("metadata") or {}).get("uid") or ""))
            self._on_event("LISTED", obj)
        for uid in [uid for uid in self._pending if uid not in listed]:
            self._pending.pop(uid, None)  # gone, or no longer assigned here
        started = {uid: execution.attempt for uid, execution in self._in_flight.items()}
        for uid in decide_unlisted(started=started, listed=listed):  # gone while the watch was away
            self._cancel(self._in_flight[uid], CancelCause.SUPERSEDED)

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        view = view_job(obj)
        if not view.uid:
            return
        execution = self._in_flight.get(view.uid)
        if execution is not None:
            self._seen_in_flight[view.uid] = (kind, obj)
        action, cause = decide_job_action(
            view=view,
            event=kind,
            runner=self.ctx.runner,
            namespace=self.ctx.config.env.namespace,
            in_flight=execution is not None,
            done=self._ended(view.uid, view.attempts),
            in_flight_attempt=execution.attempt if execution is not None else None,
        )
        if action is JobAction.RUN and view.uid not in self._pending:
            self._pending[view.uid] = view.name
            self._ready.set()
        elif action is JobAction.CANCEL and execution is not None and cause is not None:
            self._cancel(execution, cause)
        elif action is JobAction.FORGET:
            self._pending.pop(view.uid, None)
        elif action is JobAction.CANCEL_PENDING:
            self._pending.pop(view.uid, None)
            self._spawn(self._end_unstarted(view.uid, view.name, lost=False, seen=view.attempts))
        elif action is JobAction.MARK_LOST and view.uid not in self._lost:
            self._pending.pop(view.uid, None)
            self._lost.add(view.uid)
            self._spawn(self._end_unstarted(view.uid, view.name, lost=True, seen=view.attempts))

    def _cancel(self, execution: JobExecution, cause: CancelCause) -> None:
        if execution.cause is None:  # the first cause names the ending; later events add nothing
            self._log(logging.INFO, "cancelling a running job", job=execution.name, cause=cause.value)
        execution.request_cancel(cause)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _end_unstarted(self, uid: str, name: str, *, lost: bool, seen: int | None = None) -> None:
        """End a job this process is not running: cancelled while queued, or Running here without a turn.

        A job Running here is ended as its journal entry says (:func:`~helmhive.runner.jobs.journal.decide_recovery`):
        with the result an earlier process (or this one, whose final write gave up) kept, only at
        the attempt it ran; ``Interrupted`` if it was started and never finished; ``RunnerLost``
        with no entry at all.
        """
        execution = JobExecution(ctx=self.ctx, name=name, uid=uid)
        if lost and self.ctx.job_pods is not None:
            await self._remove_lost_pods(uid, name)
        entry = self._journal_entry(uid) if lost else None
        if lost:
            recovery = decide_recovery(entry)
            verdict, result = recovery.verdict, recovery.result
        else:
            verdict = JobEnding(
                succeeded=False, reason=Reason.CANCELLED, message="spec.cancel was set before it started"
            )
            result = {}
        try:
            wrote = await execution.end_unstarted(
                verdict,
                require_running=lost,
                attempt=entry.attempt if entry is not None else None,
                result=result,
            )
        except KubeError as exc:  # tried again at the next list
            self._lost.discard(uid)
            self._log(logging.WARNING, "ending a job failed", job=name, status=exc.status, detail=exc.message)
            return
        if entry is not None:
            self._log(
                logging.INFO if wrote else logging.WARNING,
                "journal replayed" if wrote else "journal entry dropped: the job is no longer this run's",
                job=name,
                phase=entry.phase.value,
                attempt=entry.attempt,
                reason=verdict.reason,
            )
            self._forget_entry(uid)
        self._remember(uid, entry.attempt if entry is not None else seen)

    async def _remove_lost_pods(self, uid: str, name: str) -> None:
        """The job pods an earlier process of this runner left for a job it lost: nothing of it may run on."""
        try:
            removed = await remove_job_pods(
                self.ctx.kube, pool=self.ctx.config.env.pool, job=JobRef(name=name, uid=uid), runner=self.ctx.runner
            )
        except KubeError as exc:  # the pods end at their deadline, and go with their AgentJob
            self._log(logging.WARNING, "a lost job's pods were not deleted", job=name, status=exc.status)
            return
        if removed:
            self._log(logging.INFO, "deleted a lost job's pods", job=name, pods=removed)

    def _journal_entry(self, uid: str) -> JournalEntry | None:
        if self.ctx.journal is None:
            return None
        try:
            return self.ctx.journal.read(uid)
        except OSError as exc:
            self._log(logging.WARNING, "journal not readable", error=type(exc).__name__, detail=str(exc)[:300])
            return None

    def _forget_entry(self, uid: str) -> None:
        if self.ctx.journal is not None:
            with contextlib.suppress(OSError):
                self.ctx.journal.remove(uid)

    async def _replay_journal(self) -> None:
        """At start: end every job the journal names from its entry (:meth:`_end_unstarted`).

        The write is conditional (still Running here, same attempt, not finished); an entry whose
        job is gone, finished, re-queued or assigned elsewhere is dropped. A job of the journal
        that the watch's first list also reports (``MARK_LOST``) is ended once: both go through
        ``_lost``.
        """
        if self.ctx.journal is None:
            return
        try:
            entries = await asyncio.to_thread(self.ctx.journal.entries)
        except OSError as exc:
            self._log(logging.WARNING, "journal not readable", error=type(exc).__name__, detail=str(exc)[:300])
            return
        for entry in entries:
            if entry.uid in self._lost or entry.uid in self._in_flight:
                continue
            self._lost.add(entry.uid)
            self._spawn(self._end_unstarted(entry.uid, entry.name, lost=True))

    def _ended(self, uid: str, attempts: int) -> bool:
        """This process ended the job at this attempt (a late event of it): an operator's re-queue is a later one."""
        if uid not in self._done:
            return False
        ended = self._done[uid]
        return ended is None or attempts <= ended

    def _remember(self, uid: str, attempt: int | None) -> None:
        self._done[uid] = attempt
        while len(self._done) > _DONE_MEMORY:
            self._done.popitem(last=False)

    # -- JobSource ------------------------------------------------------------------------
    async def take(self) -> Job:
        if self._sweep is not None:  # no job shares a home the sweep may still remove
            await self._sweep
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()
        uid, name = self._pending.popitem(last=False)
        execution = JobExecution(ctx=self.ctx, name=name, uid=uid)
        self._in_flight[uid] = execution
        return Job(id=name, key=uid, run=execution.run)

    def finish(self, job: Job) -> None:
        execution = self._in_flight.pop(job.key or "", None)
        if execution is None:
            return
        latest = self._seen_in_flight.pop(execution.uid, None)
        self._settle(execution)
        # The operator may have re-queued the job meanwhile (it thought this runner lost) and placed
        # the next attempt here again: that event was ignored while this run held the job, and no
        # other event may ever come. Look at it again now that the run is over.
        if latest is not None and execution.attempt is not None and view_job(latest[1]).attempts > execution.attempt:
            self._log(logging.INFO, "a later attempt of a job came while it ran here", job=execution.name)
            self._on_event(*latest)

    def _settle(self, execution: JobExecution) -> None:
        """Record how a run that is no longer in flight ended."""
        if execution.ended:
            self._remember(execution.uid, execution.attempt)
        elif execution.kept:  # the API server stayed away: the next list writes the journal's result
            self._log(logging.WARNING, "a job's final status waits in the journal", job=execution.name)
            self._relist()
        elif execution.started:  # its end was never written: the next list ends it from the journal
            self._log(logging.WARNING, "a job ended without its final status", job=execution.name)
            self._relist()
        else:  # the loop turned it down (not Active any more): it waits for its turn again
            self._pending[execution.uid] = execution.name
            self._pending.move_to_end(execution.uid, last=False)

    def _relist(self) -> None:
        """List this runner's jobs again now (the watch otherwise resumes without a list)."""
        if self._watch is not None:
            self._watch.relist()

    @property
    def queued(self) -> int:
        return len(self._pending)


def build_job_pod_settings(config: RunnerConfig) -> JobPodSettings | None:
    """What this runner's job pods share (``execution.mode: JobPod``), or None: jobs run in the runner."""
    if not config.file.job_pods:
        return None
    assert config.env.pod_ip is not None  # load_config requires it in JobPod mode
    return JobPodSettings(
        key_file=config.env.jobpod_link_key_file,
        egress_target=authority(config.env.pod_ip, RUNNER_PROXY_PORT),
        limits=build_request_limits(config.file.egress),
        command=jobpod_command(),
    )


def cluster_jobs(process: RunnerProcess) -> ClusterJobSource:
    """The job source of a runner pod: its assigned AgentJobs, each run in a sandboxed agent or a job pod."""
    abi = landlock_abi()
    job_pods = build_job_pod_settings(process.config)
    if job_pods is not None:
        log.info("jobs run in job pods", extra=fields(runner=process.name, egressTarget=job_pods.egress_target))
    elif abi < 1:
        log.warning(
            "Landlock is not available: jobs fail closed with SandboxUnavailable unless sandbox.landlock is optional",
            extra=fields(runner=process.name),
        )
    support = probe_limit_support()
    prefix = build_cgroup_prefix(namespace=process.config.env.namespace, runner=process.name)
    stale = remove_stale_job_cgroups(support=support.cgroups, prefix=prefix)  # a killed run's jobs
    log.info(
        "job limits",
        extra=fields(
            runner=process.name,
            uid=support.uid,
            userNamespaces=support.user_namespaces,
            processesLimited=(support.uid != 0 and support.user_namespaces) or support.cgroups.mode.value != "None",
            networkNamespace=support.network_namespace or support.network_namespace_note,
            cgroups=support.cgroups.mode.value,
            cgroupsReason=support.cgroups.reason,
            pidNamespace=support.pid_namespace,
            mountNamespace=support.mount_namespace,
            staleCgroupsRemoved=stale,
        ),
    )
    process.sandbox_report = build_sandbox_report(
        support=support, landlock_abi=abi, isolation=process.config.isolation, limits=process.config.file.job_limits
    )
    # A running job's reads and writes wait out an unreachable API server (docs/execution.md).
    patient = PatientKube(process.kube, budget_s=process.config.env.api_patience_seconds)
    ctx = ExecutionContext(
        kube=patient,
        config=process.config,
        now=process.clock.now,
        job_adapter=lambda plan: build_job_adapter(process.config, process.credential, plan),
        sessions=SessionStore(kube=patient, runner=process.name),
        landlock_abi=abi,
        limit_support=support,
        egress_port=process.credential.proxy_port,
        egress=process.egress,
        journal=JobJournal(process.config.env.state_dir),
        job_pods=job_pods,
        pod_adapter=lambda agent: build_pod_job_adapter(process.config, process.credential, agent),
    )
    return ClusterJobSource(ctx=ctx)

"""One AgentJob, end to end, on the runner it was assigned to.

:meth:`JobExecution.run` is what the main loop runs for a job it took from
:class:`~helmhive.runner.program.cluster_jobs.ClusterJobSource`:

1. re-read the job; parse the bound profile snapshot and the assignment (``InvalidSpec`` if
   unusable); plan the sandbox (``SandboxUnavailable`` if it cannot be enforced);
2. resolve the session and the memory (:mod:`helmhive.runner.jobs.context`), build the prompt
   with :func:`helmhive.policy.agentjob.prompts.build_agent_prompt`;
3. mark the job ``Running`` (reason ``Started``, ``result.startedAt``, ``status.session``);
4. prepare the working directory: with ``spec.source``, the exact commit checked out (and a
   review's patch applied) by the runner before the agent starts (:mod:`helmhive.runner.jobs.governed`);
5. run the turn with a fresh, sandboxed agent; keep the native session id in the runner's
   Secret; check the answer against the output contract, with at most one repair turn in the
   same session (``OutputContractViolated`` after that); past the pool's watermark, compact the
   bound session with the same agent (:mod:`~helmhive.runner.sessions.compaction`; all of it
   :class:`~helmhive.runner.jobs.conversation.JobConversation`'s);
6. for ``change-implementation``, with the agent gone: compute the patch and run the checks;
7. write the bounded result (large parts into the job's owned ConfigMap,
   :mod:`helmhive.runner.jobs.result`) and end the job: ``Succeeded``/``Ready`` True with
   ``Completed``, or False with a named reason.

With ``execution.mode: JobPod`` (:attr:`ExecutionContext.job_pods` set) step 5 and the checks run
in a pod of the job's own instead (:mod:`helmhive.runner.jobs.podsteps`): no listener of its own on
the proxy, no cgroup and no sandbox plan check here (the pod is the job's box); the rest is the same.

``spec.timeoutSeconds`` (``TimedOut``), ``spec.cancel`` and deletion (``Cancelled``) and the
runner stopping (``Interrupted``) cancel the ACP turn. An agent that dies on one of the pool's
per-job limits ends ``ResourceLimitExceeded:<limit>`` (:mod:`helmhive.runner.sandbox.limits`). Every
status write is a merge patch with the job's ``resourceVersion`` as a precondition, re-read and
re-built on a conflict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from helmhive.api.reasons import Reason, detailed
from helmhive.runner.adapters.base import AgentAdapter, CancelOrigin, TurnOutcome, TurnResult
from helmhive.runner.jobs.context import PreparedJob, prepare_job
from helmhive.runner.jobs.conversation import Accepted, Ending
from helmhive.runner.jobs.governed import ensure_job_workspace
from helmhive.runner.jobs.journal import JournalPhase
from helmhive.runner.jobs.podsteps import JobPodSteps
from helmhive.runner.jobs.resources import JobResources, disk_paths, ensure_job_resources, measure_disk_hit
from helmhive.runner.jobs.status import (
    CancelCause,
    JobEnding,
    build_running_status,
    decide_queued_seconds,
    view_job,
)
from helmhive.runner.jobs.writes import AGENT_JOBS, ExecutionContext
from helmhive.runner.kube import KubeError
from helmhive.runner.metrics import record_agent_start
from helmhive.runner.sandbox.cgroups import build_cgroup_prefix
from helmhive.runner.sandbox.disk import watch_disk
from helmhive.runner.sandbox.workdir import SandboxPlan, remove_sandbox

__all__ = ["AGENT_JOBS", "ExecutionContext", "JobExecution"]


class JobExecution(JobPodSteps):
    """Runs one job; :meth:`request_cancel` may be called at any time from the job source."""

    # -- the job --------------------------------------------------------------------------
    async def run(self, adapter: AgentAdapter, cancel: asyncio.Event) -> TurnResult:
        """Run the job (the slot's own adapter is not used: each job gets a sandboxed agent, or a job pod)."""
        self.started, self._cancel = True, cancel
        if self.cause is not None:
            cancel.set()
        try:
            return await self._run(cancel)
        except KubeError as exc:
            self._log(logging.ERROR, "job failed on the API", status=exc.status, detail=exc.message)
            why = f"the runner could not read or write what the job needs ({type(exc).__name__}): {exc.message}"
            try:
                await self._finish(JobEnding(succeeded=False, reason=Reason.RUNNER_API_FAILED, message=why[:1000]))
            except KubeError:  # not even that: the job stays Running, and is ended as lost on the next list
                self._log(logging.ERROR, "job could not be ended", status=exc.status)
            return TurnResult(outcome=TurnOutcome.PROTOCOL_ERROR, message=f"API error {exc.status}")
        except (OSError, ValueError) as exc:  # the runner's own trouble (disk, a request it cannot build)
            self._log(logging.ERROR, "job failed in the runner", error=type(exc).__name__, detail=str(exc)[:300])
            why = f"the runner failed to run the job: {type(exc).__name__}: {exc}"[:1000]
            with contextlib.suppress(KubeError):
                await self._finish(
                    JobEnding(succeeded=False, reason=detailed(Reason.AGENT_FAILED, "RunnerError"), message=why)
                )
            return TurnResult(outcome=TurnOutcome.PROTOCOL_ERROR, message=type(exc).__name__)

    async def _run(self, cancel: asyncio.Event) -> TurnResult:
        if self._in_pod:  # its pod is its box: its key comes once the pod's address is known
            self._resources = JobResources()
        else:
            self._resources = await ensure_job_resources(
                egress=self.ctx.egress,
                support=self.ctx.limit_support,
                limits=self.ctx.config.file.job_limits,
                state_dir=self.ctx.config.env.state_dir,
                cgroup_prefix=build_cgroup_prefix(namespace=self.ctx.config.env.namespace, runner=self.ctx.runner),
                uid=self.uid,
            )
        try:
            return await self._run_job(cancel)
        finally:
            await self._resources.close()

    async def _run_job(self, cancel: asyncio.Event) -> TurnResult:
        skipped = TurnResult(outcome=TurnOutcome.CANCELLED, message="not run")
        egress = self._resources.egress
        job = await self._patch(lambda obj: None)
        view = view_job(job) if job is not None else None
        if job is None or view is None or view.finished or view.runner != self.ctx.runner:
            self.ended = True
            return skipped
        if view.cancel or self.cause is not None:
            why = "the job was deleted" if self.cause is CancelCause.DELETED else "spec.cancel was set"
            await self._finish(JobEnding(succeeded=False, reason=Reason.CANCELLED, message=f"{why} before it started"))
            return skipped
        prepared = await prepare_job(
            kube=self.ctx.kube,
            sessions=self.ctx.sessions,
            config=self.ctx.config,
            job=job,
            uid=self.uid,
            landlock_abi=self.ctx.landlock_abi,
            limit_support=self.ctx.limit_support,
            now=self.ctx.now(),
            egress_port=egress.port if egress is not None else self.ctx.egress_port,
            relay_socket=egress.socket if egress is not None else None,
            cgroup=self._resources.cgroup,
            job_pod=self._in_pod,
        )
        if isinstance(prepared, JobEnding):
            await self._finish(prepared)
            return skipped
        spec, plan, session = prepared.spec, prepared.plan, prepared.session
        message = prepared.message
        started = await self._patch(
            lambda obj: (
                None
                if view_job(obj).finished
                else build_running_status(
                    job=obj,
                    runner=self.ctx.runner,
                    message=message,
                    session=session.status,
                    now=self.ctx.now(),
                    memory=prepared.memory.to_wire() if prepared.memory is not None else None,
                )
            )
        )
        if started is None or view_job(started).finished:
            self.ended = True
            return skipped
        self.attempt = view_job(started).attempts
        self._journal(JournalPhase.RUNNING)
        self._log(
            logging.INFO,
            "job running",
            kind=spec.job_kind.value,
            session=session.mode.value,
            binding=session.binding,
            memoryInjected=prepared.injected,
            memoryDropped=len(prepared.dropped),
        )
        self._obj = started
        await self._event(started, Reason.STARTED, f"running on runner {self.ctx.runner}: {message}")
        if prepared.dropped:
            note = f"not injected: {', '.join(prepared.dropped)}"[:1000]
            await self._event(started, Reason.MEMORY_DROPPED, note, warning=True)
        timer = asyncio.create_task(self._deadline(spec.timeout_seconds))
        disk = asyncio.create_task(self._watch_disk(plan))
        try:
            verdict, result, last = await self._execute(prepared, cancel=cancel, job=started)
            verdict, result = await self._judge_disk(plan, verdict, result)
            if self.job_pod is not None:
                result = {**result, "jobPod": self.job_pod}
        finally:
            timer.cancel()
            disk.cancel()
            await asyncio.to_thread(remove_sandbox, plan)
        # The result is on disk before the final write: a restart (or an API server that stays
        # away past the patience) leaves it for the job source to write later, never lost.
        self._journal(JournalPhase.FINISHED, verdict, result)
        try:
            await self._finish(verdict, result)
        except KubeError as exc:
            self._log(
                logging.WARNING,
                "final status not written; the result is kept in the journal",
                status=exc.status,
                reason=verdict.reason,
            )
            self.kept = True
        return last

    async def _execute(self, prepared: PreparedJob, *, cancel: asyncio.Event, job: dict[str, Any]) -> Ending:
        """Prepare the tree, run the agent, and for an implementation make the patch and run the checks."""
        spec, plan = prepared.spec, prepared.plan
        problem = await ensure_job_workspace(
            plan=plan, source=spec.source, patch=prepared.review_patch, config=self.ctx.config
        )
        if problem is not None:
            return problem, {"summary": problem.message[:4096]}, TurnResult(outcome=TurnOutcome.CANCELLED)
        if cancel.is_set():  # cancelled, timed out or stopped while the source was fetched
            return self._failed(TurnResult(outcome=TurnOutcome.CANCELLED, cancel_origin=CancelOrigin.CALLER), prepared)
        if self._in_pod:
            return await self._execute_in_pod(prepared, cancel=cancel, job=job)
        adapter = self.ctx.job_adapter(plan)
        if self._resources.egress is not None:  # its socket serves the process started for this agent only
            self._resources.egress.authorize(lambda pid: pid == _agent_pid(adapter))
        queued = decide_queued_seconds(job, self.ctx.now())
        record_agent_start(config=self.ctx.config, start="in-runner", seconds=queued)
        try:
            outcome = await self._talk(adapter, prepared, cancel=cancel, job=job, cwd=str(plan.workdir))
        finally:  # the agent is gone before the runner reads what it left
            self._resources.revoke()  # its last turn is over: nothing it left running may call the provider
            with contextlib.suppress(Exception):
                await adapter.close()
        if not isinstance(outcome, Accepted):
            return outcome
        return await self._store(outcome, prepared=prepared, cancel=cancel, job=job)

    async def _watch_disk(self, plan: SandboxPlan) -> None:
        def exceeded(message: str) -> None:
            self._disk_hit = message
            self._resources.revoke()
            if self._cancel is not None:
                self._cancel.set()

        await watch_disk(paths=disk_paths(plan), limit=self.ctx.config.file.job_limits.disk_bytes, exceeded=exceeded)

    async def _judge_disk(
        self, plan: SandboxPlan, verdict: JobEnding, result: dict[str, Any]
    ) -> tuple[JobEnding, dict[str, Any]]:
        """A job over its disk limit ends ``ResourceLimitExceeded:disk`` (measured once more now that its
        agent and checks are gone), unless it was cancelled, timed out or deleted first."""
        if self.cause is None:
            limit = self.ctx.config.file.job_limits.disk_bytes
            self._disk_hit = self._disk_hit or await measure_disk_hit(plan=plan, limit=limit)
        if self.cause is not None or self._disk_hit is None:
            return verdict, result
        ending = JobEnding(
            succeeded=False, reason=detailed(Reason.RESOURCE_LIMIT_EXCEEDED, "disk"), message=self._disk_hit[:1000]
        )
        return ending, {"summary": self._disk_hit[:4096]}

    async def _deadline(self, seconds: int) -> None:
        await asyncio.sleep(seconds)
        self.request_cancel(CancelCause.TIMED_OUT)


def _agent_pid(adapter: AgentAdapter) -> int | None:
    """The pid of the process the adapter started for its agent now (the sandbox launcher), if any."""
    pid = getattr(adapter, "process_id", None)
    return pid if isinstance(pid, int) else None

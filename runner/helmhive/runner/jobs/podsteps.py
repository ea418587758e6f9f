"""One job's run in a job pod (``RunnerPool.spec.execution.mode: JobPod``): the steps after its tree is ready.

:class:`JobPodSteps` is a base of :class:`~helmhive.runner.jobs.execution.JobExecution`, which
prepares the job as for any other run (its spec, session, prompt, and its tree: the exact commit
fetched with the pool's git credential and a review's patch applied, by the runner) and then, in
place of a sandboxed agent, runs :meth:`JobPodSteps._execute_in_pod`:

1. a pod for the job: a warm one of the pool claimed, else one created (:mod:`.podclaim`); a
   ``JobPodClaimed`` or ``JobPodCreated`` Event on the job names it;
2. wait (a watch) until it runs; a pod that cannot start or is taken away ends the job with the
   reason its state gives (:func:`~helmhive.policy.jobpods.outcome.decide_job_pod_outcome`), and so
   does one not started within ``execution.startTimeoutSeconds`` (``JobPodFailed:Unschedulable``...);
3. the job's phantom key, its tree and HOME into the pod, the agent driven through
   ``helmhive-jobpod attach`` (:mod:`.jobpod`) for its turns, repair turn and compaction, as in
   the runner (:class:`~helmhive.runner.jobs.conversation.JobConversation`), with the pod watched
   meanwhile: a pod deleted, evicted, disrupted or OOM-killed stops the agent and ends the job
   with the pod's reason at once (:func:`.podclaim.watch_job_pod_loss`);
4. once the agent is gone (its key revoked first): a binding's HOME and an implementation's tree
   taken back, the patch computed by the runner, the checks run in the pod over the link;
5. whatever happened: FINISH, and the pod deleted (a pod the runner could not delete goes with its
   AgentJob, which owns it, and ends at its deadline at the latest).

A failed turn or link is judged from the pod's state, read once: ``ResourceLimitExceeded:memory``
(OOM-killed), ``TimedOut`` (its deadline), ``JobPodLost:<cause>``, ``JobPodFailed:<reason>``; a
pod that says nothing leaves the runner's own verdict (:func:`.jobpod.decide_link_failure` for the
link). A cancel, timeout or deletion of the job names the ending first, as in the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from helmhive.api.common import JobKind
from helmhive.api.reasons import Reason
from helmhive.policy.jobpods.identity import JobRef
from helmhive.policy.jobpods.outcome import JobPodOutcome
from helmhive.runner.adapters.base import CancelOrigin, TurnOutcome, TurnResult
from helmhive.runner.jobpod.frames import LinkError
from helmhive.runner.jobs.context import PreparedJob
from helmhive.runner.jobs.conversation import Accepted, Ending, JobConversation
from helmhive.runner.jobs.jobpod import PodRun, decide_link_failure
from helmhive.runner.jobs.podclaim import (
    ensure_job_pod,
    read_job_pod_outcome,
    remove_job_pod,
    settle_job_pod_outcome,
    wait_job_pod,
    watch_job_pod_loss,
)
from helmhive.runner.jobs.status import JobEnding, decide_queued_seconds
from helmhive.runner.kube import KubeError, RunnerKube
from helmhive.runner.metrics import record_agent_start

__all__ = ["JobPodSteps"]

T = TypeVar("T")


async def _until(work: Awaitable[T], cancel: asyncio.Event) -> T | None:
    """``work``'s result, or None (``work`` cancelled) once ``cancel`` is set first."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


def _stopped() -> TurnResult:
    return TurnResult(outcome=TurnOutcome.CANCELLED, cancel_origin=CancelOrigin.CALLER)


def _ended(verdict: JobEnding, turn: TurnResult | None = None) -> Ending:
    last = turn or TurnResult(outcome=TurnOutcome.AGENT_CRASHED, message=verdict.message[:300])
    return verdict, {"summary": verdict.message[:4096]}, last


def _pod_ending(outcome: JobPodOutcome) -> JobEnding:
    return JobEnding(succeeded=False, reason=outcome.reason, message=outcome.message[:1000])


class JobPodSteps(JobConversation):
    """A run's JobPod path (see the module); the rest of the run is :class:`JobExecution`'s."""

    job_pod: dict[str, Any] | None = None
    """The pod this run used, as ``status.result.jobPod`` records it (name, warm), once it has one."""

    @property
    def _in_pod(self) -> bool:
        return self.ctx.job_pods is not None

    async def _execute_in_pod(self, prepared: PreparedJob, *, cancel: asyncio.Event, job: dict[str, Any]) -> Ending:
        template = self.ctx.config.file.job_pod_template
        assert template is not None  # JobPod mode needs it (load_config)
        acquired = await ensure_job_pod(
            kube=self.ctx.kube,
            template=template,
            pool=self.ctx.config.env.pool,
            job=JobRef(name=self.name, uid=self.uid),
            runner=self.ctx.runner,
            timeout_seconds=prepared.spec.timeout_seconds,
            now=self.ctx.now,
        )
        name = acquired.name
        self.job_pod = {"name": name, "warm": acquired.claimed}
        pod: PodRun | None = None
        try:
            how = "claimed warm pod" if acquired.claimed else "created pod (no warm pod was free)"
            self._log(logging.INFO, "job pod claimed" if acquired.claimed else "job pod created", pod=name)
            reason = Reason.JOB_POD_CLAIMED if acquired.claimed else Reason.JOB_POD_CREATED
            await self._event(job, reason, f"{how} {name} for the job, driven by runner {self.ctx.runner}")
            start_s = self.ctx.config.file.execution.start_timeout
            started = await _until(wait_job_pod(self.ctx.kube, name, timeout_seconds=start_s), cancel)
            if started is None:
                return self._failed(_stopped(), prepared)
            if isinstance(started, JobPodOutcome):
                self._log(logging.WARNING, "job pod cannot run the job", pod=name, reason=started.reason)
                return _ended(_pod_ending(started))
            assert self.ctx.job_pods is not None and self.ctx.egress is not None
            settings = self.ctx.job_pods
            target = settings.target(name=started.name, ip=started.ip)
            pod = PodRun(target=target, settings=settings, job=self.name, job_uid=self.uid, egress=self.ctx.egress)
            return await self._run_in_pod(pod, prepared, cancel=cancel, job=job, claimed=acquired.claimed)
        except LinkError as exc:
            return await self._link_failed(name, exc, prepared)
        finally:
            if pod is not None:
                await pod.close()
            try:
                await remove_job_pod(self.ctx.kube, name)
            except KubeError as exc:  # its AgentJob owns it, and its deadline ends it
                self._log(logging.WARNING, "job pod not deleted", pod=name, status=exc.status, detail=exc.message)

    async def _run_in_pod(
        self, pod: PodRun, prepared: PreparedJob, *, cancel: asyncio.Event, job: dict[str, Any], claimed: bool
    ) -> Ending:
        spec, plan, session = prepared.spec, prepared.plan, prepared.session
        agent = await pod.open(local_cwd=plan.scratch, local_home=plan.home)
        self._resources.pod_egress = pod.egress  # a cancel from now on revokes its key at once
        if self.cause is not None:
            self._resources.revoke()
        assert self.ctx.pod_adapter is not None
        adapter = self.ctx.pod_adapter(agent)
        ran = False
        try:
            if await _until(pod.put_trees(workspace=plan.workdir, home=plan.home), cancel) is None:
                return self._failed(_stopped(), prepared)
            ran = True
            # Queue-to-agent-start: a metric and a log field (the benchmark reads it), not an API write.
            queued = decide_queued_seconds(job, self.ctx.now())
            record_agent_start(config=self.ctx.config, start="warm" if claimed else "cold", seconds=queued)
            self._log(
                logging.INFO,
                "job pod agent starting",
                pod=pod.target.name,
                warm=claimed,
                queuedSeconds=queued,
            )
            watched = _Watched()
            async with watched.pod(self.ctx.kube, pod.target.name, cancel, log=self._log):
                outcome = await self._talk(adapter, prepared, cancel=watched.stop, job=job, cwd=agent.workspace)
        finally:  # the agent is gone before anything is taken back: closing the wrapper drops its link
            self._resources.revoke()
            pod.end_agent()
            with contextlib.suppress(Exception):
                await adapter.close()
        if watched.lost is not None and self.cause is None:  # the pod's word: nothing in it can be taken back
            self._log(logging.WARNING, "job pod failed the job", pod=pod.target.name, reason=watched.lost.reason)
            return _ended(_pod_ending(watched.lost))
        home = session.binding is not None and ran  # the binding's HOME is the pod's copy now
        if not isinstance(outcome, Accepted):
            judged = await self._judge_in_pod(pod, outcome)
            if home and judged is outcome:  # the pod is fine: a session id kept before stays usable with it
                with contextlib.suppress(LinkError):
                    await pod.take_back("home", plan.home)
            return judged
        if home:
            await pod.take_back("home", plan.home)
        if spec.job_kind is JobKind.CHANGE_IMPLEMENTATION:
            await pod.take_back("workspace", plan.workdir)
        return await self._store(outcome, prepared=prepared, cancel=cancel, job=job, checks=pod.run_checks)

    async def _judge_in_pod(self, pod: PodRun, failed: Ending) -> Ending:
        """A failed run's ending: the pod's word when its state explains a failed turn, else ``failed`` itself."""
        turn = failed[2]
        if self.cause is not None or turn.ok:  # cancelled, timed out, deleted; or an answer that broke its contract
            return failed
        outcome = await settle_job_pod_outcome(self.ctx.kube, pod.target.name)
        if outcome is None:
            return failed
        self._log(logging.WARNING, "job pod failed the job", pod=pod.target.name, reason=outcome.reason)
        return _ended(_pod_ending(outcome), turn)

    async def _link_failed(self, name: str, error: LinkError, prepared: PreparedJob) -> Ending:
        """The link failed (the pod gone, unreachable, or refusing): the pod's state says why, if it can."""
        self._log(logging.WARNING, "job pod link failed", pod=name, reason=str(error.reason))
        if self.cause is not None:
            return self._failed(_stopped(), prepared)
        outcome = await read_job_pod_outcome(self.ctx.kube, name)
        return _ended(_pod_ending(outcome) if outcome is not None else decide_link_failure(error, pod=name))


class _Watched:
    """The pod watched while the agent runs: ``stop`` is set by the job's own cancel or by the pod's
    failure (``lost``), whichever comes first."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.lost: JobPodOutcome | None = None

    @contextlib.asynccontextmanager
    async def pod(
        self, kube: RunnerKube, name: str, cancel: asyncio.Event, *, log: Callable[..., None]
    ) -> AsyncIterator[None]:
        async def follow_cancel() -> None:
            await cancel.wait()
            self.stop.set()

        async def follow_pod() -> None:
            try:
                self.lost = await watch_job_pod_loss(kube, name)
            except KubeError as exc:  # the link still notices a lost pod; the watch is the faster way
                log(logging.WARNING, "job pod not watched", pod=name, status=exc.status, detail=exc.message)
                return
            self.stop.set()

        tasks = [asyncio.ensure_future(follow_cancel()), asyncio.ensure_future(follow_pod())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

"""The agent's part of one job run, wherever the agent runs: its turns, its session, its ending.

:class:`JobConversation` is a base of :class:`~helmhive.runner.jobs.execution.JobExecution` (after
:class:`~helmhive.runner.jobs.writes.JobWrites`) and holds what the runner does with a job's agent
whether it runs in the runner's sandbox or in a job pod (:mod:`helmhive.runner.jobs.podsteps`):
the turn and at most one repair turn in the same session against the output contract
(:meth:`_converse`), the native session id kept in the runner's Secret (:meth:`_keep`), compaction
past the pool's watermark (:meth:`_compact`), the verdict of a failed turn (:meth:`_failed`) and,
once the agent is gone, an implementation's patch and checks and the stored result (:meth:`_store`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from helmhive.api.common import JobKind
from helmhive.api.envelope import OutputFormat
from helmhive.api.reasons import Reason, detailed
from helmhive.policy.agentjob.prompts import MAX_REPAIR_TURNS, build_repair_prompt, check_output
from helmhive.policy.agentjob.results import build_bounded_result
from helmhive.policy.sessions.continuity import SessionIntent
from helmhive.runner.adapters.base import AgentAdapter, CancelOrigin, TurnOutcome, TurnRequest, TurnResult
from helmhive.runner.jobs.context import JobSession, PreparedJob
from helmhive.runner.jobs.governed import ChecksRunner, ImplementationSteps, run_implementation_steps
from helmhive.runner.jobs.result import ensure_job_result
from helmhive.runner.jobs.status import JobEnding, decide_turn_failure
from helmhive.runner.jobs.writes import JobWrites
from helmhive.runner.metrics import record_turn
from helmhive.runner.sandbox.cgroups import decide_cgroup_hit, read_events
from helmhive.runner.sessions.compaction import ensure_compacted

__all__ = ["Accepted", "Ending", "JobConversation"]

Ending = tuple[JobEnding, dict[str, Any], TurnResult]
"""A run's end: the verdict, the result to write, and the last turn."""


@dataclass(frozen=True, kw_only=True)
class Accepted:
    """A turn whose answer met the output contract."""

    turn: TurnResult
    document: dict[str, Any] | None
    turns: int


class JobConversation(JobWrites):
    """A run's agent: its turns, session and ending (see the module)."""

    async def _talk(
        self, adapter: AgentAdapter, prepared: PreparedJob, *, cancel: asyncio.Event, job: dict[str, Any], cwd: str
    ) -> Ending | Accepted:
        """The turn, a repair turn and compaction with the job's agent; ``cwd`` is the session's as it sees it."""
        session = prepared.session
        base = TurnRequest(
            prompt=prepared.prompt,
            cwd=cwd,
            session_id=session.stored_id,
            fork=session.intent is SessionIntent.FORK,
            model=prepared.assignment.model,
            effort=prepared.assignment.reasoning_effort.value if prepared.assignment.reasoning_effort else None,
            allowed_tools=prepared.plan.allowed_tools,
        )
        outcome = await self._converse(
            adapter=adapter, request=base, cancel=cancel, job=job, session=session, prepared=prepared
        )
        last = outcome.turn if isinstance(outcome, Accepted) else outcome[2]
        if self._kept and last.ok and not cancel.is_set():
            await self._compact(adapter=adapter, request=base, turn=last, session=session, prepared=prepared)
        return outcome

    async def _converse(
        self,
        *,
        adapter: AgentAdapter,
        request: TurnRequest,
        cancel: asyncio.Event,
        job: dict[str, Any],
        session: JobSession,
        prepared: PreparedJob,
    ) -> Ending | Accepted:
        """The turn (and at most one repair turn): a failure's (verdict, result, turn), or the accepted answer."""
        contract = prepared.binding.snapshot.output_contract
        turn = await adapter.run_turn(request, cancel)
        record_turn(config=self.ctx.config, result=turn)
        await self._keep(turn, session, new_chain=session.intent is SessionIntent.FRESH, job=self.name)
        turns = 1
        if not turn.ok:
            return self._failed(turn, prepared)
        check = check_output(text=turn.text, contract=contract)
        if not check.ok and contract.format is OutputFormat.STRUCTURED and MAX_REPAIR_TURNS > 0:
            if self.cause is not None:
                return self._failed(turn, prepared)
            repair = request.model_copy(
                update={
                    "prompt": build_repair_prompt(check=check, contract=contract),
                    "session_id": turn.native_session_id,
                    "fork": False,
                }
            )
            turn = await adapter.run_turn(repair, cancel)
            record_turn(config=self.ctx.config, result=turn)
            await self._keep(turn, session, new_chain=False, job=self.name)
            turns += 1
            if not turn.ok:
                return self._failed(turn, prepared)
            check = check_output(text=turn.text, contract=contract)
        if not check.ok:
            bounded = build_bounded_result(job=job, text=turn.text, output=None)
            message = (
                f"the answer broke the output contract after {turns - 1} repair turn(s): {'; '.join(check.errors)}"
            )[:1000]
            failed = {"summary": bounded.summary, "validationErrors": list(check.errors)[:20]}
            return JobEnding(succeeded=False, reason=Reason.OUTPUT_CONTRACT_VIOLATED, message=message), failed, turn
        return Accepted(turn=turn, document=check.document, turns=turns)

    async def _keep(self, turn: TurnResult, session: JobSession, *, new_chain: bool, job: str) -> None:
        """Store the turn's native session id for the binding (never for a fork: a fork is a branch)."""
        self._kept = False
        if not turn.ok or session.binding is None or turn.native_session_id is None:
            return
        if session.intent is SessionIntent.FORK:
            return
        problem = await self.ctx.sessions.store(
            binding=session.binding,
            session_id=turn.native_session_id,
            turns=1,
            new_chain=new_chain,
            job=job,
            now=self.ctx.now(),
        )
        self._kept = problem is None
        if problem is not None:
            self._log(logging.WARNING, "session not stored", binding=session.binding, detail=problem)
            if self._obj is not None:
                await self._event(self._obj, Reason.SESSION_NOT_STORED, problem[:1000], warning=True)

    async def _compact(
        self,
        *,
        adapter: AgentAdapter,
        request: TurnRequest,
        turn: TurnResult,
        session: JobSession,
        prepared: PreparedJob,
    ) -> None:
        """Compact the bound session if the turn left it past the watermark (:mod:`.sessions.compaction`)."""
        if session.binding is None or self._cancel is None:
            return
        found = await ensure_compacted(
            adapter=adapter,
            request=request,
            turn=turn,
            settings=self.ctx.config.file.compaction,
            instructions=prepared.binding.snapshot.instructions,
            cancel=self._cancel,
            sessions=self.ctx.sessions,
            binding=session.binding,
            job=self.name,
            now=self.ctx.now,
        )
        if found is None:
            return
        done, problem = found
        method = done.method.value if done.method is not None else "none"
        level = logging.INFO if problem is None else logging.WARNING
        self._log(level, "session compaction", binding=session.binding, method=method, **done.figures())
        if self._obj is None:
            return
        if problem is None:
            await self._event(
                self._obj, Reason.SESSION_COMPACTED, f"session binding {session.binding} {done.describe()}"
            )
        else:
            note = f"session binding {session.binding}: {problem}"[:1000]
            await self._event(self._obj, Reason.COMPACTION_FAILED, note, warning=True)

    async def _store(
        self,
        accepted: Accepted,
        *,
        prepared: PreparedJob,
        cancel: asyncio.Event,
        job: dict[str, Any],
        checks: ChecksRunner | None = None,
    ) -> Ending:
        """With the agent gone: an implementation's patch and checks (``checks``: where they run, the
        runner's sandbox by default), then the bounded result written (large parts in a ConfigMap)."""
        spec, plan = prepared.spec, prepared.plan
        turn, document, turns = accepted.turn, accepted.document, accepted.turns
        steps: ImplementationSteps | None = None
        if spec.job_kind is JobKind.CHANGE_IMPLEMENTATION:
            found = await run_implementation_steps(
                plan=plan, spec=spec, landlock_abi=self.ctx.landlock_abi, cancel=cancel, checks=checks
            )
            if isinstance(found, JobEnding):
                return found, {"summary": found.message[:4096]}, turn
            if found.checks.cancelled:
                stopped = TurnResult(outcome=TurnOutcome.CANCELLED, cancel_origin=CancelOrigin.CALLER)
                verdict, failed, _ = self._failed(stopped, prepared)
                return verdict, failed, turn
            steps = found
        stored = await ensure_job_result(
            kube=self.ctx.kube, job=job, text=turn.text, document=document, turns=turns, steps=steps
        )
        if stored.checks_event is not None:
            reason, note = stored.checks_event
            await self._event(job, reason, note, warning=reason is Reason.CHECKS_FAILED)
        return stored.verdict, stored.result, turn

    def _failed(self, turn: TurnResult, prepared: PreparedJob) -> Ending:
        cgroup = self._resources.cgroup
        hit = None  # a job total the kernel enforced names the failure, unless the runner stopped the turn
        if cgroup is not None and self.cause is None and turn.cancel_origin is None:
            hit = decide_cgroup_hit(events=read_events(cgroup), cgroup=cgroup)
        verdict = (
            JobEnding(succeeded=False, reason=detailed(Reason.RESOURCE_LIMIT_EXCEEDED, hit[0]), message=hit[1])
            if hit is not None
            else decide_turn_failure(
                result=turn, cause=self.cause, timeout_s=prepared.spec.timeout_seconds, limits=prepared.plan.limits
            )
        )
        return verdict, {"summary": verdict.message[:4096]}, turn

"""One pure step per move of an AgentJob's life: each returns the :class:`StatusPatch` it writes.

``bind``, ``wait``, ``fail`` (queue step), ``start``, ``finish`` (runner),
``lost``, ``requeue``, ``close`` (operator), and :func:`decide_lost`, which picks ``lost`` or
``requeue`` for a job whose runner was lost. The router's step, ``route``, is
:func:`helmhive.policy.routing.step.route`. Who writes which field, and when:
the table in :mod:`helmhive.policy.agentjob.life`'s docstring (that module re-exports this one).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.agentjob.patch import StatusPatch, Step, build_step_patch
from helmhive.policy.agentjob.retry import NOT_RERUN, RetryDecision, decide_job_retry, decide_retry_window
from helmhive.policy.agentjob.state import AgentJob
from helmhive.policy.conditions import set_condition
from helmhive.policy.timestamps import format_timestamp
from helmhive.policy.waiting import build_bound_conditions, build_unbound_conditions

__all__ = [
    "NOT_RERUN",
    "LostOutcome",
    "bind",
    "close",
    "decide_lost",
    "fail",
    "finish",
    "lost",
    "requeue",
    "start",
    "wait",
]


def _set_conditions(
    job: AgentJob, updates: Sequence[tuple[str, bool | None, str, str]], *, now: dt.datetime
) -> list[dict[str, Any]]:
    current = [dict(c) for c in job.conditions]
    for ctype, value, reason, message in updates:
        current = set_condition(
            current, type=ctype, status=value, reason=reason, message=message, generation=job.generation, now=now
        ).conditions
    return current


def bind(job: AgentJob, *, binding: Mapping[str, Any], now: dt.datetime) -> StatusPatch:
    """Bound at queue time: ``status.profile``; a job that waited for a reference sheds its waiting conditions."""
    status: dict[str, Any] = {"profile": dict(binding)}
    cleared = build_bound_conditions(job.conditions)
    if cleared is not None:
        status["conditions"] = cleared
    return build_step_patch(Step.BIND, job, status, now=now)


def wait(job: AgentJob, *, reason: Reason, message: str, now: dt.datetime) -> StatusPatch | None:
    """Waiting for a reference: ``Routed=False``/``Ready=False`` with the waiting reason; None if already so."""
    return _unbound(Step.WAIT, job, reason=reason, message=message, now=now)


def fail(job: AgentJob, *, reason: Reason, message: str, now: dt.datetime) -> StatusPatch | None:
    """Failed closed at queue time: ``Routed=False``/``Ready=False`` with ``reason``; None if already so."""
    return _unbound(Step.FAIL, job, reason=reason, message=message, now=now)


def _unbound(step: Step, job: AgentJob, *, reason: Reason, message: str, now: dt.datetime) -> StatusPatch | None:
    update = build_unbound_conditions(
        job.conditions, reason=reason, message=message, generation=job.generation, now=now
    )
    return build_step_patch(step, job, {"conditions": update.conditions}, now=now) if update.changed else None


_CLEARED_RESULT = {
    "summary": None,
    "output": None,
    "artifacts": None,
    "validationErrors": None,
    "patch": None,
    "checks": None,
}


def start(
    job: AgentJob,
    *,
    runner: str,
    message: str,
    session: Mapping[str, Any] | None,
    now: dt.datetime,
    memory: Mapping[str, Any] | None = None,
) -> StatusPatch:
    """The runner started the job: ``Running=True``/``Ready=Unknown`` (``Started``), ``result`` reset but ``startedAt``.

    ``memory`` is the run-time memory report (``status.result.memory``); None clears an earlier one.
    """
    text = f"running on runner {runner}: {message}"
    status: dict[str, Any] = {
        "conditions": _set_conditions(
            job,
            [(ConditionType.RUNNING, True, Reason.STARTED, text), (ConditionType.READY, None, Reason.STARTED, text)],
            now=now,
        ),
        "result": {
            "outcome": Reason.STARTED.value,
            "startedAt": format_timestamp(now),
            **_CLEARED_RESULT,
            "completedAt": None,
            "memory": dict(memory) if memory is not None else None,
        },
    }
    if session is not None:
        status["session"] = dict(session)
    return build_step_patch(Step.START, job, status, now=now)


def finish(
    job: AgentJob, *, succeeded: bool, reason: str, message: str, result: Mapping[str, Any], now: dt.datetime
) -> StatusPatch:
    """The runner ended the job: ``Running=False``, ``Succeeded`` and ``Ready`` with ``reason``, and ``result``."""
    conditions = _set_conditions(
        job,
        [
            (ConditionType.RUNNING, False, reason, message),
            (ConditionType.SUCCEEDED, succeeded, reason, message),
            (ConditionType.READY, succeeded, reason, message),
        ],
        now=now,
    )
    previous = job.raw_status.get("result")
    started = previous.get("startedAt") if isinstance(previous, Mapping) else None
    body: dict[str, Any] = {**_CLEARED_RESULT, **dict(result), "outcome": reason, "completedAt": format_timestamp(now)}
    if started and "startedAt" not in result:
        body["startedAt"] = started
    return build_step_patch(Step.FINISH, job, {"conditions": conditions, "result": body}, now=now)


def _lost_conditions(job: AgentJob, *, message: str, now: dt.datetime) -> list[dict[str, Any]]:
    updates: list[tuple[str, bool | None, str, str]] = [
        (ConditionType.SUCCEEDED, False, Reason.RUNNER_LOST, message),
        (ConditionType.READY, False, Reason.RUNNER_LOST, message),
    ]
    if ConditionType.RUNNING in job.condition_status:
        updates.append((ConditionType.RUNNING, False, Reason.RUNNER_LOST, message))
    return _set_conditions(job, updates, now=now)


def _lost_result(job: AgentJob, now: dt.datetime) -> dict[str, Any]:
    previous = job.raw_status.get("result")
    summary = previous.get("summary") if isinstance(previous, Mapping) else None
    return {"outcome": Reason.RUNNER_LOST.value, "completedAt": format_timestamp(now), "summary": summary or ""}


def lost(job: AgentJob, *, message: str, why_not_rerun: str, now: dt.datetime) -> StatusPatch:
    """Its runner was lost and it is not run again: ``Succeeded=False``/``Ready=False`` (and ``Running=False``
    if it had started) with ``RunnerLost``; ``result.outcome = RunnerLost`` and ``completedAt``.

    The assignment and the rest of the result stay (a job that may have written keeps its history).
    """
    conditions = _with_verdict(_lost_conditions(job, message=message, now=now), message, why_not_rerun)
    return build_step_patch(Step.LOST, job, {"conditions": conditions, "result": _lost_result(job, now)}, now=now)


_MESSAGE_MAX = 1024


def _with_verdict(conditions: list[dict[str, Any]], message: str, why: str) -> list[dict[str, Any]]:
    """``Succeeded`` and ``Ready`` say ``<message>; not re-run: <why>``; the message is shortened first,
    so the verdict (which later events look for) always fits."""
    verdict = f"{NOT_RERUN}{why}"[: _MESSAGE_MAX // 2]
    text = message[: _MESSAGE_MAX - len(verdict)] + verdict
    for cond in conditions:
        if cond["type"] in (ConditionType.SUCCEEDED, ConditionType.READY):
            cond["message"] = text
    return conditions


def close(job: AgentJob, *, why_not_rerun: str, now: dt.datetime) -> StatusPatch:
    """Its runner ended it with an infrastructure reason and it is not run again: the verdict is added to
    the ``Succeeded`` and ``Ready`` messages (status, reason and times stay the runner's)."""
    succeeded = job.condition(ConditionType.SUCCEEDED) or {}
    message = str(succeeded.get("message") or "")
    conditions = _with_verdict([dict(c) for c in job.conditions], message, why_not_rerun)
    return build_step_patch(Step.CLOSE, job, {"conditions": conditions}, now=now)


_KEPT_ON_REQUEUE = frozenset({"profile", "observedGeneration"})


def requeue(
    job: AgentJob, *, message: str, retry_message: str, now: dt.datetime, reason: Reason = Reason.RUNNER_LOST
) -> StatusPatch:
    """It failed for the infrastructure (``reason``: its runner was lost, by default) and may run again:
    every status field but the binding and ``observedGeneration`` is deleted, ``attempts`` grows by one,
    ``Routed=Unknown`` with ``reason`` says why.
    """
    conditions = set_condition(
        [],
        type=ConditionType.ROUTED,
        status=None,
        reason=reason,
        message=f"{message}; re-queued: {retry_message}",
        generation=job.generation,
        now=now,
    ).conditions
    status: dict[str, Any] = {k: None for k in job.raw_status if k not in _KEPT_ON_REQUEUE}
    status.update({"attempts": job.attempts + 1, "conditions": conditions})
    return build_step_patch(Step.REQUEUE, job, status, now=now)


@dataclass(frozen=True, kw_only=True)
class LostOutcome:
    """What the lost step decided for a job: the patch (``lost`` or ``requeue``) and the retry decision."""

    patch: StatusPatch
    retry: RetryDecision | None

    @property
    def requeued(self) -> bool:
        return self.patch.step is Step.REQUEUE


def decide_lost(
    job: AgentJob,
    *,
    message: str,
    now: dt.datetime,
    lost_since: dt.datetime | None = None,
    window: dt.timedelta | None = None,
) -> LostOutcome:
    """End a job whose runner was lost, or re-queue it when :func:`decide_job_retry` allows it.

    The retry decision reads the job as it would be once ended (``Succeeded=False/RunnerLost``).
    ``lost_since`` (the runner's last heartbeat) more than ``window`` before ``now`` turns an
    allowed re-run into ``RetryWindowPassed``, as for any other failure: an operator that was down
    for hours does not re-run, at its start, the jobs of runners that died long ago. Without a
    known time the loss counts as seen now (a Runner deleted while the operator watches).
    """
    ended_status = {
        **job.raw_status,
        "conditions": _lost_conditions(job, message=message, now=now),
        "result": {**(job.raw_status.get("result") or {}), **_lost_result(job, now)},
    }
    decision = decide_job_retry(job=job.with_status(ended_status))
    if decision is not None and decision.retry and lost_since is not None and window is not None:
        what = "its runner last renewed its Lease"
        decision = decide_retry_window(lost_since, now=now, window=window, what=what) or decision
    if decision is not None and decision.retry:
        return LostOutcome(patch=requeue(job, message=message, retry_message=decision.message, now=now), retry=decision)
    why = decision.message if decision is not None else "not re-run"
    return LostOutcome(patch=lost(job, message=message, why_not_rerun=why, now=now), retry=decision)

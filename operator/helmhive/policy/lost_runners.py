"""Jobs whose runner was lost: which runner holds a job, when a runner counts as lost, the ended status. Pure.

A runner that dies cannot say so; the operator learns it from the runner's own object: the
runner controller derives ``status.reportedStatus = Offline`` once its Lease expires, or the
Runner is deleted. That is a per-*runner* event. The controller (``helmhive.controller.lost``)
keeps every held job in an index by runner, so one runner's transition finds its jobs at once,
and each job's own watch event is checked against the runner's last known state (a job
assigned to a runner that was already lost). This module decides; it reads and writes nothing.

* :func:`decide_held_runner`: the runner an assigned, unfinished job is held on (``Succeeded``
  absent or ``Unknown``), whether it started or not;
* :func:`build_runner_liveness` / :func:`decide_runner_lost`: a Runner as the decision needs it,
  and why it counts as lost (a message), or None;
* :func:`build_lost_job_status`: the whole job with the status to PUT: ended
  ``Succeeded=False``/``RunnerLost``, or re-queued when :func:`helmhive.policy.retry.decide_job_retry`
  allows it. The caller writes it conditionally on the job's ``resourceVersion``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.conditions import find_condition, set_condition
from helmhive.policy.retry import decide_job_retry

__all__ = [
    "JobKey",
    "LostJobUpdate",
    "LostVerdict",
    "RunnerKey",
    "RunnerLiveness",
    "build_lost_job_status",
    "build_runner_liveness",
    "decide_held_runner",
    "decide_runner_lost",
]

RunnerKey = tuple[str, str]
"""(namespace, name) of a Runner."""

JobKey = tuple[str, str]
"""(namespace, name) of an AgentJob."""

OFFLINE = "Offline"


@dataclass(frozen=True, kw_only=True)
class RunnerLiveness:
    """What the lost-runner decision needs of a Runner: its name and the operator's derived status."""

    namespace: str
    name: str
    reported_status: str | None

    @property
    def key(self) -> RunnerKey:
        return (self.namespace, self.name)


class LostVerdict(StrEnum):
    """What happened to a job whose runner was lost."""

    REQUEUED = "re-queued"
    ENDED = "ended"


@dataclass(frozen=True, kw_only=True)
class LostJobUpdate:
    """The job to PUT to its status subresource (``metadata.resourceVersion`` as read) and the verdict."""

    body: dict[str, Any]
    verdict: LostVerdict


def _unfinished(status: Mapping[str, Any]) -> bool:
    succeeded = find_condition(status.get("conditions"), ConditionType.SUCCEEDED)
    return succeeded is None or succeeded.get("status") == "Unknown"


def decide_held_runner(job: Mapping[str, Any]) -> RunnerKey | None:
    """The runner an assigned job is held on while it is not finished; None otherwise.

    The runner's namespace is ``status.assignment.runnerNamespace``, else the job's own.
    """
    status = job.get("status") or {}
    assignment = status.get("assignment")
    if not assignment or not _unfinished(status):
        return None
    runner = assignment.get("runner")
    if not runner:
        return None
    namespace = assignment.get("runnerNamespace") or (job.get("metadata") or {}).get("namespace") or ""
    return (str(namespace), str(runner))


def build_runner_liveness(body: Mapping[str, Any]) -> RunnerLiveness:
    """A Runner object as :func:`decide_runner_lost` reads it (any spec or report: only the status counts)."""
    meta = body.get("metadata") or {}
    reported = (body.get("status") or {}).get("reportedStatus")
    return RunnerLiveness(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        reported_status=str(reported) if reported is not None else None,
    )


def decide_runner_lost(runner: RunnerLiveness | None) -> str | None:
    """Why a job held on ``runner`` counts as lost (a message), or None while it is not.

    ``None`` means the Runner does not exist (deleted, or absent when the job was seen).
    """
    if runner is None:
        return "its runner no longer exists"
    if runner.reported_status == OFFLINE:
        return f"runner {runner.name} went Offline (its Lease expired) while the job was assigned to it"
    return None


def _with_conditions(
    conditions: Sequence[dict[str, Any]] | None,
    updates: Sequence[tuple[str, bool | None, str, str]],
    *,
    generation: int | None,
    now: dt.datetime,
) -> list[dict[str, Any]]:
    current = list(conditions or [])
    for ctype, value, reason, message in updates:
        current = set_condition(
            current, type=ctype, status=value, reason=reason, message=message, generation=generation, now=now
        ).conditions
    return current


def build_lost_job_status(*, job: Mapping[str, Any], message: str, now: dt.datetime) -> LostJobUpdate:
    """The job, ended ``RunnerLost`` or re-queued, ready to PUT to its status subresource.

    Ended: ``Succeeded=False`` and ``Ready=False`` (and ``Running=False`` if it had started) with
    reason ``RunnerLost``, ``result.outcome = RunnerLost`` and ``completedAt``; the messages say
    ``not re-run: <why>``. Re-queued (only when :func:`decide_job_retry` allows it): the status
    keeps only the profile binding and ``observedGeneration``, ``attempts`` grows by one and
    ``Routed=Unknown``/``RunnerLost`` says why, so the router places the job again.
    """
    generation = (job.get("metadata") or {}).get("generation")
    status = dict(job.get("status") or {})
    updates: list[tuple[str, bool | None, str, str]] = [
        (ConditionType.SUCCEEDED, False, Reason.RUNNER_LOST, message),
        (ConditionType.READY, False, Reason.RUNNER_LOST, message),
    ]
    if find_condition(status.get("conditions"), ConditionType.RUNNING) is not None:
        updates.append((ConditionType.RUNNING, False, Reason.RUNNER_LOST, message))
    status["conditions"] = _with_conditions(status.get("conditions"), updates, generation=generation, now=now)
    result = dict(status.get("result") or {})
    result.update({"outcome": Reason.RUNNER_LOST.value, "completedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ")})
    result.setdefault("summary", "")
    status["result"] = result
    ended = {**job, "status": status}
    decision = decide_job_retry(job=ended)
    if decision is not None and decision.retry:
        requeued: dict[str, Any] = {k: v for k, v in status.items() if k in ("profile", "observedGeneration")}
        requeued["attempts"] = int(status.get("attempts") or 0) + 1
        requeued["conditions"] = _with_conditions(
            [],
            [(ConditionType.ROUTED, None, Reason.RUNNER_LOST, f"{message}; re-queued: {decision.message}")],
            generation=generation,
            now=now,
        )
        return LostJobUpdate(body={**job, "status": requeued}, verdict=LostVerdict.REQUEUED)
    why = decision.message if decision is not None else "not re-run"
    for cond in status["conditions"]:
        if cond["type"] in (ConditionType.SUCCEEDED, ConditionType.READY):
            cond["message"] = f"{message}; not re-run: {why}"[:1024]
    return LostJobUpdate(body=ended, verdict=LostVerdict.ENDED)

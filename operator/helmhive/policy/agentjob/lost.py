"""Jobs whose runner was lost: which runner holds a job, when a runner counts as lost, the ended status. Pure.

A runner that dies cannot say so; the operator learns it from the runner's own object: the
runner controller derives ``status.reportedStatus = Offline`` once its Lease expires, or the
Runner is deleted. That is a per-*runner* event. The controller (``helmhive.controller.jobs.lost``)
keeps every held job in an index by runner, so one runner's transition finds its jobs at once,
and each job's own watch event is checked against the runner's last known state (a job
assigned to a runner that was already lost). This module decides; it reads and writes nothing.

* the runner an assigned, unfinished job is held on, started or not, is
  :attr:`helmhive.policy.agentjob.life.AgentJob.held_runner` (``decide_held_runner`` there);
* :func:`build_runner_liveness` / :func:`decide_runner_lost`: a Runner as the decision needs it,
  and why it counts as lost (a message), or None;
* :func:`build_lost_job_status`: the lost step's merge patch of the job's status, built by
  :func:`helmhive.policy.agentjob.life.decide_lost`: ended ``Succeeded=False``/``RunnerLost``, or
  re-queued when :func:`helmhive.policy.agentjob.retry.decide_job_retry` allows it. The caller writes it
  conditionally on the job's ``resourceVersion``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from helmhive.policy.agentjob.life import apply_merge_patch, decide_lost, parse_agent_job
from helmhive.policy.waiting import parse_timestamp

__all__ = [
    "JobKey",
    "LostJobUpdate",
    "LostVerdict",
    "RunnerKey",
    "RunnerLiveness",
    "build_lost_job_status",
    "build_runner_liveness",
    "decide_runner_lost",
]

RunnerKey = tuple[str, str]
"""(namespace, name) of a Runner."""

JobKey = tuple[str, str]
"""(namespace, name) of an AgentJob."""

OFFLINE = "Offline"


@dataclass(frozen=True, kw_only=True)
class RunnerLiveness:
    """What the lost-runner decision needs of a Runner: its name, the operator's derived status and
    its last heartbeat (``status.lastHeartbeatTime``, the Lease's renewTime the operator last wrote)."""

    namespace: str
    name: str
    reported_status: str | None
    last_heartbeat: dt.datetime | None = None

    @property
    def key(self) -> RunnerKey:
        return (self.namespace, self.name)


class LostVerdict(StrEnum):
    """What happened to a job whose runner was lost."""

    REQUEUED = "re-queued"
    ENDED = "ended"


@dataclass(frozen=True, kw_only=True)
class LostJobUpdate:
    """The lost step's write: the merge patch (conditional on the job as read), the job after it, the verdict."""

    patch: dict[str, Any]
    body: dict[str, Any]
    verdict: LostVerdict
    why_not_rerun: str | None = None
    """For an ended job: why it is not re-run (the retry decision's message)."""

    @property
    def summary(self) -> str:
        """The verdict as the Warning Event says it: ``re-queued``, or ``ended; not re-run: <why>``."""
        if self.verdict is LostVerdict.ENDED and self.why_not_rerun:
            return f"{self.verdict.value}; not re-run: {self.why_not_rerun}"
        return self.verdict.value


def build_runner_liveness(body: Mapping[str, Any]) -> RunnerLiveness:
    """A Runner object as :func:`decide_runner_lost` reads it (any spec or report: only the status counts)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    reported = status.get("reportedStatus")
    return RunnerLiveness(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        reported_status=str(reported) if reported is not None else None,
        last_heartbeat=parse_timestamp(status.get("lastHeartbeatTime")),
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


def build_lost_job_status(
    *,
    job: Mapping[str, Any],
    message: str,
    now: dt.datetime,
    runner: RunnerLiveness | None = None,
    window: dt.timedelta | None = None,
) -> LostJobUpdate:
    """The lost step for ``job``: ended ``RunnerLost``, or re-queued.

    See :func:`helmhive.policy.agentjob.life.decide_lost`.

    ``runner`` (None: deleted) gives the loss its time, its last heartbeat; a loss older than
    ``window`` is not re-run (``RetryWindowPassed``).

    ``patch`` is the conditional merge patch to write (only what the step owns, conditional on the
    ``resourceVersion`` read); ``body`` is the job as it will be once the patch is applied.
    """
    state = parse_agent_job(job)
    lost_since = runner.last_heartbeat if runner is not None else None
    outcome = decide_lost(state, message=message, now=now, lost_since=lost_since, window=window)
    body = {**job, "status": apply_merge_patch(job.get("status") or {}, outcome.patch.status)}
    return LostJobUpdate(
        patch=outcome.patch.conditional(state.resource_version),
        body=body,
        verdict=LostVerdict.REQUEUED if outcome.requeued else LostVerdict.ENDED,
        why_not_rerun=None if outcome.requeued or outcome.retry is None else outcome.retry.message,
    )

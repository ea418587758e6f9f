"""The router's step of an AgentJob's life: the routing decision written into the job's status. Pure.

It is one of the steps in :mod:`helmhive.policy.agentjob.life`'s table of writers, kept here so
that the job's life does not depend on routing: routing reads jobs, never the other way round.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from helmhive.policy.agentjob.patch import StatusPatch, Step, build_step_patch
from helmhive.policy.agentjob.state import AgentJob
from helmhive.policy.routing.route import RouteOutcome, RoutingDecision, build_status_patch

__all__ = ["route"]


def route(
    job: AgentJob,
    *,
    decision: RoutingDecision,
    memory_ids: Sequence[str] = (),
    binding: Mapping[str, Any] | None = None,
    now: dt.datetime,
) -> StatusPatch:
    """The router's decision: routing, conditions, the assignment when routed, and the binding when given.

    ``routing.attempts`` counts the capacity waits written: one more for a wait.
    """
    waiting = decision.outcome is RouteOutcome.WAITING
    status = build_status_patch(
        decision=decision,
        conditions=job.conditions,
        generation=job.generation,
        attempts=job.routing_attempts + 1 if waiting else job.routing_attempts,
        memory_ids=memory_ids,
        now=now,
    )
    if binding is not None:
        status["profile"] = dict(binding)
    return build_step_patch(Step.ROUTE, job, status, now=now)

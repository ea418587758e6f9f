"""Routing's status builders: the wire form of a decision in the job's status. Pure.

``status.routing``, ``status.assignment`` and the Routed/Ready conditions; re-exported by
:mod:`helmhive.policy.routing.route`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from helmhive.api.job import Candidate, RoutingStatus
from helmhive.api.reasons import ConditionType
from helmhive.policy.conditions import set_condition
from helmhive.policy.routing.model import RouteChoice, RouteOutcome, RoutingDecision
from helmhive.policy.timestamps import format_timestamp

__all__ = [
    "build_assignment",
    "build_candidate_groups",
    "build_candidate_rows",
    "build_routing_status",
    "build_status_patch",
]


def build_candidate_groups(candidates: Sequence[Candidate]) -> list[dict[str, Any]]:
    """The candidate table's wire form (:class:`~helmhive.api.job.CandidateGroup`): the rows that
    differ only in their runner become one group listing its runners in table order, the groups
    in the order of their first (closest) row. Every row is kept: expanding the groups gives the
    table's rows, each group's together.

    The table orders rows by closeness, then by name, so rows of one reason interleave with
    another's of the same closeness (``NotPreferred:MoreLoaded`` and ``NotPreferred:NameOrder``
    by runner name); grouping them wherever they sit keeps a full table of like runners to a few
    groups, and the stored job small (docs/performance.md).
    """
    groups: dict[tuple[object, ...], dict[str, Any]] = {}
    for row in candidates:
        key = (row.namespace, row.provider, row.mapping_index, row.model, row.reason)
        group = groups.get(key)
        if group is not None:
            group["runners"].append(row.runner)
            continue
        group = {"runners": [row.runner]}
        for field, value in (
            ("namespace", row.namespace),
            ("provider", row.provider),
            ("mappingIndex", row.mapping_index),
            ("model", row.model),
        ):
            if value is not None:
                group[field] = value
        group["reason"] = row.reason
        groups[key] = group
    return list(groups.values())


def build_candidate_rows(groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of :func:`build_candidate_groups`'s groups on the wire form: one per runner, group by group.

    Read through :meth:`~helmhive.api.job.RoutingStatus.rows`, so a row stored before groups
    existed (``runner``, no ``runners``) is a group of one here too.
    """
    return [row.to_wire() for row in RoutingStatus.model_validate({"candidates": groups}).rows()]


def build_routing_status(*, decision: RoutingDecision, attempts: int, now: dt.datetime) -> dict[str, Any]:
    """``status.routing`` (wire form) for ``decision``."""
    status: dict[str, Any] = {
        "consideredRunners": decision.considered_runners,
        "candidates": build_candidate_groups(decision.candidates),
        "attempts": attempts,
        "decidedAt": format_timestamp(now),
    }
    if decision.retry_after is not None:
        status["nextAttemptAt"] = format_timestamp(now + dt.timedelta(seconds=decision.retry_after))
    if decision.capacity_deadline is not None:
        status["capacityDeadline"] = format_timestamp(decision.capacity_deadline)
    if decision.avoided_provider is not None:
        status["avoidedProvider"] = decision.avoided_provider
    return status


def build_assignment(*, choice: RouteChoice, memory_ids: Sequence[str], now: dt.datetime | None) -> dict[str, Any]:
    """``status.assignment`` (wire form of :class:`~helmhive.api.job.Assignment`): the choice plus the
    injected memory ids (at most 20). The one builder of that form: the router writes it, and
    ``explain-routing`` prints it with ``now=None`` (a dry run assigns nothing, so no ``assignedAt``).
    """
    assignment: dict[str, Any] = {
        "runner": choice.runner,
        "pool": choice.pool,
        "runnerNamespace": choice.runner_namespace,
        "provider": choice.provider,
        "model": choice.model,
        "modelSource": choice.model_source.value,
        "mappingIndex": choice.mapping_index,
        "memoryIds": list(memory_ids)[:20],
        "credentialGeneration": choice.credential_generation,
    }
    if now is not None:
        assignment["assignedAt"] = format_timestamp(now)
    if choice.effort is not None:
        assignment["reasoningEffort"] = choice.effort.value
    return assignment


def build_status_patch(
    *,
    decision: RoutingDecision,
    conditions: Sequence[dict[str, Any]] | None,
    generation: int | None,
    attempts: int,
    memory_ids: Sequence[str] = (),
    now: dt.datetime,
) -> dict[str, Any]:
    """The job's ``status`` fields for ``decision``: routing, conditions and (when routed) the assignment.

    Routed: ``Routed=True/Assigned`` and ``Ready=Unknown/Assigned`` (the job has not run yet).
    Waiting: ``Routed=False`` and ``Ready=Unknown``, reason ``WaitingForCapacity``.
    Failed: ``Routed=False`` and ``Ready=False`` with the decision's reason.
    """
    routed = decision.outcome is RouteOutcome.ASSIGNED
    ready: bool | None = False if decision.outcome is RouteOutcome.FAILED else None
    current = list(conditions or [])
    for ctype, status in ((ConditionType.ROUTED, routed), (ConditionType.READY, ready)):
        current = set_condition(
            current,
            type=ctype,
            status=status,
            reason=decision.reason.value,
            message=decision.message,
            generation=generation,
            now=now,
        ).conditions
    patch: dict[str, Any] = {
        "routing": build_routing_status(decision=decision, attempts=attempts, now=now),
        "conditions": current,
    }
    if decision.choice is not None:
        patch["assignment"] = build_assignment(choice=decision.choice, memory_ids=memory_ids, now=now)
    return patch

"""Routing: which runner runs a queued job, with which model, or the named reason why none can. Pure.

:func:`decide_route` is a function of (job, profile binding, runners, active jobs per runner,
session bindings, now) that returns a :class:`RoutingDecision`. It reads no clock, does no
I/O and never sees a credential. The operator's router and ``helmhive explain-routing`` both
call it, so a dry run and the real decision are the same computation.

The algorithm (``docs/routing.md`` explains each choice):

1. A model override (``spec.model``) the profile does not allow fails closed,
   ``ModelOverrideForbidden``.
2. The profile's mappings become an ordered list of *options* (provider, model, source,
   effort): mappings in the profile's order; within a mapping the primary model, then its
   fallbacks; a mapping without a model uses each runner's reported default. An allowed
   override narrows the mappings to its provider and replaces their models with its one
   model (never a fallback: an explicit model is honoured or refused, not swapped). For a
   change review (``avoid_provider``) the options of other providers come first.
3. Every runner is checked, in this order, and the first failure is its rejection:
   ``NotSchedulable/<reason>``, ``NamespaceNotServed``, ``ProviderNotInMappings``,
   ``MissingCapability:<name>`` (a capability the runner does not offer, or a session capability
   its agent did not advertise: ``session-load`` for a resuming profile, ``session-fork`` for a
   forking one), ``MissingLabel:<k=v>``; then per option of its provider
   ``ModelNotAdvertised:<model>``, ``NoDefaultModel`` or ``EffortNotOffered:<model>/<effort>``
   (the option's effort is not in the catalogue's efforts of that model); then ``NoFreeConcurrency``.
4. The first option with at least one eligible runner wins. Among its eligible runners:
   the one holding the job's session binding (resume/fork only), then the least loaded
   (active / concurrency), then by namespace and name.
5. No option eligible: if some runner failed *only* on concurrency the job waits
   (``WaitingForCapacity``, retried with exponential backoff) until its capacity deadline,
   then fails ``CapacityDeadlineExceeded``. If no runner of its providers serving its
   namespace is schedulable (none registered yet, none schedulable yet, none of its providers
   or serving its namespace yet), it waits for one (``WaitingForCapacity``, no backoff: the
   router re-decides it when a runner becomes eligible) until the same deadline, then fails
   ``NoEligibleRunner``. Otherwise it fails closed with ``ModelNotAdvertised``,
   ``EffortNotOffered``, ``NoDefaultModel`` or ``NoEligibleRunner``.

The candidate table has one row per runner, closest first, bounded to 20.

This module owns the decision's loop over the runners; its parts live beside it and every
public name is re-exported here: the data (:mod:`~helmhive.policy.routing.model`), the options,
per-runner checks and the table's rows (:mod:`~helmhive.policy.routing.candidates`), the
outcomes once every runner is checked (:mod:`~helmhive.policy.routing.outcomes`) and the status
builders (:mod:`~helmhive.policy.routing.status`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from helmhive.api.job import ProfileBinding
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import is_governed
from helmhive.policy.routing.candidates import (
    _override,
    _Result,
    _table,
    build_options,
    decide_backoff,
    decide_session_scope,
)
from helmhive.policy.routing.model import (
    MAX_CANDIDATES,
    RouteChoice,
    RouteOption,
    RouteOutcome,
    RoutingDecision,
    RoutingJob,
    RoutingPolicy,
    RunnerKey,
    RunnerView,
    SessionBindingView,
)
from helmhive.policy.routing.outcomes import _assigned, _failed, _wait_for_held
from helmhive.policy.routing.prepared import RunnerSet, build_static_checks
from helmhive.policy.routing.status import build_assignment, build_routing_status, build_status_patch
from helmhive.policy.runners.capabilities import decide_session_requirements
from helmhive.policy.timestamps import format_timestamp

__all__ = [
    "MAX_CANDIDATES",
    "RouteChoice",
    "RouteOption",
    "RouteOutcome",
    "RoutingDecision",
    "RoutingJob",
    "RoutingPolicy",
    "RunnerKey",
    "RunnerView",
    "SessionBindingView",
    "build_assignment",
    "build_options",
    "build_routing_status",
    "build_status_patch",
    "decide_backoff",
    "decide_route",
    "decide_session_scope",
]

_DEFAULT_POLICY = RoutingPolicy()


def decide_route(
    *,
    job: RoutingJob,
    binding: ProfileBinding,
    runners: Sequence[RunnerView],
    active_jobs: Mapping[RunnerKey, int],
    bindings: Sequence[SessionBindingView] = (),
    now: dt.datetime,
    avoid_provider: str | None = None,
    attempts: int = 0,
    policy: RoutingPolicy = _DEFAULT_POLICY,
) -> RoutingDecision:
    """Decide where ``job`` runs, or why it cannot; see the module docstring for the rules.

    ``active_jobs`` counts, per runner, the jobs assigned to it and not finished (counted by
    the caller from the jobs themselves). ``attempts`` is how many times the job already
    waited for capacity (for the backoff). ``binding.bound_at`` is the queue time the
    capacity deadline counts from. The order of ``runners`` does not matter.
    """
    profile = binding.snapshot
    considered = len(runners)
    override = _override(job.spec)
    if override is not None and not profile.allow_model_override:
        asked = ", ".join(
            f"{k}={v}"
            for k, v in (
                ("provider", override.provider),
                ("model", override.model),
                ("reasoningEffort", override.reasoning_effort.value if override.reasoning_effort else None),
            )
            if v
        )
        return RoutingDecision(
            outcome=RouteOutcome.FAILED,
            reason=Reason.MODEL_OVERRIDE_FORBIDDEN,
            message=f"spec.model ({asked}) is an override, and profile {binding.name} does not allow model "
            "overrides (allowModelOverride: false)",
            considered_runners=considered,
            avoided_provider=avoid_provider,
        )
    options = build_options(mappings=profile.provider_mappings, override=override, avoid_provider=avoid_provider)
    resumable = not is_governed(job.spec.job_kind)
    requirement = (
        tuple(options),
        tuple(profile.required_capabilities),
        tuple(sorted(profile.required_labels.items())),
        decide_session_requirements(policy=profile.session.policy, resumable=resumable),
    )
    checks = (
        runners.static_checks(requirement)
        if isinstance(runners, RunnerSet)
        else build_static_checks(runners, requirement)
    )

    # The passing runners in table order (see StaticChecks): a free one's first allowed position is
    # its smallest, so the first free runner holds the winning position, and among the free runners
    # at that position the first of least load is the winner when no session binding counts
    # (namespace and name break ties, and the list is already in that order). Only free
    # concurrency is checked here; the rest is static.
    free_rows: list[_Result] = []
    full_rows: list[_Result] = []
    contenders: list[RunnerView] = []  # the free runners at the winning position
    blocked: set[RunnerKey] = set()
    active = active_jobs.get
    position = -1
    least: RunnerView | None = None
    least_load = 2.0  # above any free runner's load (active < concurrency)
    for key, runner, positions, free, full in checks.passing:
        concurrency = runner.concurrency
        busy = active(key, 0)
        if busy < concurrency:
            free_rows.append(free)
            if position < 0:
                position = positions[0]
            if positions[0] == position:
                contenders.append(runner)
                load = busy / concurrency
                if load < least_load:
                    least, least_load = runner, load
        else:
            if concurrency > 0:
                blocked.add(key)
            full_rows.append(full)
    held = checks.held

    if contenders:
        return _assigned(
            job=job,
            binding=binding,
            option=options[position],
            contenders=contenders,
            least=least,
            others=(free_rows, full_rows, checks.fixed),
            active_jobs=active_jobs,
            bindings=bindings,
            avoid_provider=avoid_provider,
            policy=policy,
            considered=considered,
        )
    results = [*full_rows, *checks.fixed]  # no runner is free
    table = _table(results, policy)
    if held and not blocked:
        return _wait_for_held(
            binding=binding,
            held=held,
            table=table,
            considered=considered,
            avoid_provider=avoid_provider,
            attempts=attempts,
            policy=policy,
            now=now,
        )
    if blocked:
        deadline = binding.bound_at + dt.timedelta(seconds=policy.capacity_deadline_seconds)
        busy = len(blocked)
        if now >= deadline:
            return RoutingDecision(
                outcome=RouteOutcome.FAILED,
                reason=Reason.CAPACITY_DEADLINE_EXCEEDED,
                message=f"waited for a free slot on {busy} eligible runner{'s' if busy != 1 else ''} "
                f"from {format_timestamp(binding.bound_at)} until the deadline {format_timestamp(deadline)}",
                candidates=table,
                considered_runners=considered,
                capacity_blocked=frozenset(blocked),
                capacity_deadline=deadline,
                avoided_provider=avoid_provider,
            )
        retry = min(decide_backoff(attempts=attempts, policy=policy), max(0.0, (deadline - now).total_seconds()))
        return RoutingDecision(
            outcome=RouteOutcome.WAITING,
            reason=Reason.WAITING_FOR_CAPACITY,
            message=f"every eligible runner is busy ({busy} at full concurrency); waiting for a free slot "
            f"until {format_timestamp(deadline)}",
            candidates=table,
            considered_runners=considered,
            capacity_blocked=frozenset(blocked),
            retry_after=retry,
            capacity_deadline=deadline,
            avoided_provider=avoid_provider,
        )
    return _failed(
        job=job,
        binding=binding,
        options=options,
        results=results,
        later=checks.later,
        table=table,
        considered_runners=considered,
        avoided_provider=avoid_provider,
        policy=policy,
        now=now,
    )

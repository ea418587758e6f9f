"""Routing's outcomes: the assigned decision (winner, table, message), waiting for held runners, failing closed. Pure.

Called by :func:`helmhive.policy.routing.route.decide_route` once every runner is checked.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from helmhive.api.common import SessionPolicy
from helmhive.api.job import Candidate, ModelSource, ProfileBinding
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import is_governed
from helmhive.policy.routing.candidates import (
    _ELIGIBLE,
    _MODEL,
    _PROVIDER,
    _SELECTED,
    _SELECTED_REASON,
    _candidates,
    _first,
    _load,
    _override,
    _Rank,
    _Result,
    _truncate,
    _why_not_preferred,
    decide_backoff,
    decide_session_scope,
)
from helmhive.policy.routing.model import (
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
from helmhive.policy.timestamps import format_timestamp


def _assigned(
    *,
    job: RoutingJob,
    binding: ProfileBinding,
    option: RouteOption,
    contenders: Sequence[RunnerView],
    least: RunnerView | None,
    others: tuple[Sequence[_Result], Sequence[_Result], Sequence[_Result]],
    active_jobs: Mapping[RunnerKey, int],
    bindings: Sequence[SessionBindingView],
    avoid_provider: str | None,
    policy: RoutingPolicy,
    considered: int,
) -> RoutingDecision:
    """The assigned decision: ``option`` wins, run by one of ``contenders`` (its free runners).

    ``least`` is the first contender of least load (in namespace, name order): the winner unless
    a contender holds the job's session binding. ``others`` is every runner's row in table order
    (the free rows, the full rows, the fixed rows), the winner's free row among them.
    """
    profile = binding.snapshot
    resumable = profile.session.policy in (SessionPolicy.RESUME, SessionPolicy.FORK) and not is_governed(
        job.spec.job_kind
    )
    scope = decide_session_scope(spec=job.spec, scope=profile.session.scope)

    # The session bindings that would let a runner resume this job: (namespace, name, provider, generation).
    held = (
        {
            (b.runner_namespace, b.runner, b.provider, b.credential_generation)
            for b in bindings
            if b.workspace == job.spec.workspace and b.profile == binding.name and b.scope == scope
        }
        if resumable
        else set()
    )

    def rank(runner: RunnerView) -> _Rank:
        holds = (runner.namespace, runner.name, runner.provider, runner.credential_generation) in held
        return (0 if holds else 1, _load(runner, active_jobs.get(runner.key, 0)), runner.namespace, runner.name)

    if held:
        # Ranks are unique per runner key, so min() over the tuples never compares two runners.
        win_rank, winner = min(((rank(r), r) for r in contenders), key=_first)
    else:
        # No runner holds a binding: every rank is (1, load, namespace, name), and the caller
        # found the least one while checking loads.
        assert least is not None  # contenders is not empty
        winner = least
        win_rank = rank(winner)
    model = option.model if option.model is not None else winner.default_model
    assert model is not None  # eligibility checked the runner's default
    choice = RouteChoice(
        runner_namespace=winner.namespace,
        runner=winner.name,
        pool=winner.pool,
        provider=option.provider,
        model=model,
        model_source=option.source,
        effort=option.effort,
        mapping_index=option.mapping_index,
        credential_generation=winner.credential_generation,
        resumes_session=win_rank[0] == 0,
    )
    # The table: the winner first (rank Selected), then the closest others; only the rows shown
    # get their NotPreferred reason.
    rows: list[_Result] = []
    limit = policy.max_candidates
    if limit > 0:
        rows.append(
            (_SELECTED, option.position, winner.namespace, winner.name, _SELECTED_REASON, option, model, winner)
        )
        winner_key = winner.key
        wanted = limit - 1
        for result in itertools.chain.from_iterable(others):
            if not wanted:
                break
            closeness, at, namespace, name, _, chosen, chosen_model, runner = result
            if runner.key == winner_key and closeness == _ELIGIBLE:
                continue
            wanted -= 1
            if closeness == _ELIGIBLE and chosen is not None:
                why = _why_not_preferred(chosen, option, rank(runner), win_rank, avoid_provider)
                rows.append((_ELIGIBLE, at, namespace, name, why, chosen, chosen_model, runner))
            else:
                rows.append(result)
    source = {
        ModelSource.MAPPING: "the mapping's model",
        ModelSource.FALLBACK: "a fallback model",
        ModelSource.OVERRIDE: "the job's model override",
        ModelSource.RUNNER_DEFAULT: "the runner's default model",
    }[option.source]
    message = (
        f"runner {winner.namespace}/{winner.name} (pool {winner.pool}) runs it with {option.provider} model "
        f"{model} ({source}, mapping {option.mapping_index})"
    )
    if avoid_provider is not None:
        message += (
            f"; review provider differs from the implementation's ({avoid_provider})"
            if option.provider != avoid_provider
            else f"; no other provider was eligible, so the implementation's provider ({avoid_provider}) "
            "runs it in a fresh context"
        )
    if choice.resumes_session:
        message += "; it holds the job's session binding"
    return RoutingDecision(
        outcome=RouteOutcome.ASSIGNED,
        reason=Reason.ASSIGNED,
        message=_truncate(message, 1024),
        choice=choice,
        candidates=_candidates(rows),
        considered_runners=considered,
        avoided_provider=avoid_provider,
    )


def _wait_for_held(
    *,
    binding: ProfileBinding,
    held: AbstractSet[RunnerKey],
    table: tuple[Candidate, ...],
    considered: int,
    avoid_provider: str | None,
    attempts: int,
    policy: RoutingPolicy,
    now: dt.datetime,
) -> RoutingDecision:
    """No runner is eligible, and some are only held (``HeartbeatHeld``): wait for them, as for capacity.

    The operator lost the API server and cannot yet tell these runners from dead ones; failing
    the job closed for them would be final. It waits (``WaitingForCapacity``, the message names
    the hold) until a runner turns schedulable, its backoff or its capacity deadline, as for
    capacity; if the held runners turn out to be Offline, the next decision fails it closed.
    """
    deadline = binding.bound_at + dt.timedelta(seconds=policy.capacity_deadline_seconds)
    names = ", ".join(sorted(name for _, name in held)[:8])
    count = len(held)
    retry = min(decide_backoff(attempts=attempts, policy=policy), max(0.0, (deadline - now).total_seconds()))
    return RoutingDecision(
        outcome=RouteOutcome.WAITING if now < deadline else RouteOutcome.FAILED,
        reason=Reason.WAITING_FOR_CAPACITY if now < deadline else Reason.CAPACITY_DEADLINE_EXCEEDED,
        message=_truncate(
            f"no runner is eligible now; {count} runner{'s' if count != 1 else ''} ({names}) "
            f"{'are' if count != 1 else 'is'} held (HeartbeatHeld: the operator lost contact with the API "
            f"server and waits for {'their' if count != 1 else 'its'} heartbeat); "
            f"waiting until {format_timestamp(deadline)}",
            1024,
        ),
        candidates=table,
        considered_runners=considered,
        capacity_blocked=frozenset(held),
        retry_after=retry if now < deadline else None,
        capacity_deadline=deadline,
        avoided_provider=avoid_provider,
    )


def _failed(
    *,
    job: RoutingJob,
    binding: ProfileBinding,
    options: Sequence[RouteOption],
    results: Sequence[_Result],
    later: frozenset[RunnerKey] = frozenset(),
    table: tuple[Candidate, ...],
    considered_runners: int,
    avoided_provider: str | None,
    policy: RoutingPolicy,
    now: dt.datetime,
) -> RoutingDecision:
    """No runner is eligible, busy or held: wait for one that can serve the job, or fail closed.

    The job **waits** (:func:`_wait_for_runner`) while no runner of one of its providers that serves
    its namespace is schedulable: no runner at all, or every runner's closest rejection is
    ``NotSchedulable/…``, ``NamespaceNotServed`` or ``ProviderNotInMappings``. Those are runners
    and pools that are not there *yet* (applied together with the job, registering, coming back)
    as much as misconfiguration, which only the deadline tells apart; so GitOps order does not
    matter. It also waits while a runner that is not schedulable now would pass every other
    runner-level check (``later``: a pool rolling out a new configuration, a runner restarting
    or drained), whatever other runners lack. Otherwise a live runner of its provider found
    wanting (a capability, a label, the model) fails it closed at once, as does a job or profile
    no runner could ever serve (no options).
    """
    common: dict[str, Any] = {
        "considered_runners": considered_runners,
        "avoided_provider": avoided_provider,
        "candidates": table,
        "outcome": RouteOutcome.FAILED,
    }
    if options and (not results or min(r[0] for r in results) >= _PROVIDER):
        return _wait_for_runner(binding=binding, results=results, common=common, policy=policy, now=now)
    if options and later:  # others were found wanting, but these would not be
        return _wait_for_runner(binding=binding, results=results, later=later, common=common, policy=policy, now=now)
    if not options:
        override = _override(job.spec)
        wanted = override.provider if override is not None and override.provider else None
        mapped = ", ".join(m.provider for m in binding.snapshot.provider_mappings) or "none"
        text = (
            f"the override's provider {wanted} is not one of profile {binding.name}'s mappings ({mapped})"
            if wanted
            else f"profile {binding.name} has no provider mappings"
        )
        return RoutingDecision(reason=Reason.NO_ELIGIBLE_RUNNER, message=text, **common)
    if not results:
        return RoutingDecision(
            reason=Reason.NO_ELIGIBLE_RUNNER, message="no runner is registered; nothing can run the job", **common
        )
    closest = min(r[0] for r in results)
    nearest = [r[4] for r in results if r[0] == closest]  # their reasons
    if closest == _MODEL:
        missing = sorted({r.partition(":")[2] for r in nearest if r.startswith("ModelNotAdvertised")})
        if missing:
            return RoutingDecision(
                reason=Reason.MODEL_NOT_ADVERTISED,
                message=_truncate(
                    f"no compatible runner advertises {', '.join(missing)}; an explicit model is refused, "
                    f"never swapped ({len(nearest)} runner{'s' if len(nearest) != 1 else ''} met every other "
                    "requirement)",
                    1024,
                ),
                **common,
            )
        efforts = sorted({r.partition(":")[2] for r in nearest if r.startswith("EffortNotOffered")})
        if efforts:
            return RoutingDecision(
                reason=Reason.EFFORT_NOT_OFFERED,
                message=_truncate(
                    f"no compatible runner offers the reasoning effort with the model ({', '.join(efforts)}, as "
                    "model/effort); an effort is refused, never swapped",
                    1024,
                ),
                **common,
            )
        return RoutingDecision(
            reason=Reason.NO_DEFAULT_MODEL,
            message="the mapping asks for the runner's default model and no compatible runner reports one",
            **common,
        )
    summary = ", ".join(sorted(set(nearest)))
    return RoutingDecision(
        reason=Reason.NO_ELIGIBLE_RUNNER,
        message=_truncate(
            f"no mapping of profile {binding.name} is eligible on any of {len(results)} runner"
            f"{'s' if len(results) != 1 else ''}; closest: {summary}",
            1024,
        ),
        **common,
    )


def _wait_for_runner(
    *,
    binding: ProfileBinding,
    results: Sequence[_Result],
    later: frozenset[RunnerKey] = frozenset(),
    common: dict[str, Any],
    policy: RoutingPolicy,
    now: dt.datetime,
) -> RoutingDecision:
    """No runner can serve the job yet (see :func:`_failed`): wait until the capacity deadline, then fail closed.

    The wait has no backoff (``retry_after`` None: :attr:`RoutingDecision.waits_for_runner`);
    the router re-decides it when a runner becomes schedulable or the fleet changes, and at the
    deadline, counted from queue time as for capacity. After it the job fails ``NoEligibleRunner``.
    """
    deadline = binding.bound_at + dt.timedelta(seconds=policy.capacity_deadline_seconds)
    if not results:
        why = "no runner is registered"
    elif later:
        waiting = sorted((r[2], r[3], r[4]) for r in results if (r[2], r[3]) in later)
        named = ", ".join(f"{name} ({reason})" for _, name, reason in waiting[:8])
        more = f" and {len(waiting) - 8} more" if len(waiting) > 8 else ""
        count = len(waiting)
        why = (
            f"{count} runner{'s' if count != 1 else ''} that could take it {'are' if count != 1 else 'is'} "
            f"not schedulable now: {named}{more}"
        )
    else:
        count = len(results)
        closest = min(r[0] for r in results)
        summary = ", ".join(sorted({r[4] for r in results if r[0] == closest}))
        why = f"none of {count} runner{'s' if count != 1 else ''} can take it (closest: {summary})"
    if now >= deadline:
        return RoutingDecision(
            reason=Reason.NO_ELIGIBLE_RUNNER,
            message=_truncate(
                f"{why}; nothing can run the job: no runner became eligible from "
                f"{format_timestamp(binding.bound_at)} until the deadline {format_timestamp(deadline)}",
                1024,
            ),
            capacity_deadline=deadline,
            **common,
        )
    return RoutingDecision(
        **{**common, "outcome": RouteOutcome.WAITING},
        reason=Reason.WAITING_FOR_CAPACITY,
        message=_truncate(
            f"no runner is eligible yet: {why}; waiting for one until {format_timestamp(deadline)}", 1024
        ),
        capacity_deadline=deadline,
    )

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
   ``MissingCapability:<name>``, ``MissingLabel:<k=v>``; then per option of its provider
   ``ModelNotAdvertised:<model>`` or ``NoDefaultModel``; then ``NoFreeConcurrency``.
4. The first option with at least one eligible runner wins. Among its eligible runners:
   the one holding the job's session binding (resume/fork only), then the least loaded
   (active / concurrency), then by namespace and name.
5. No option eligible: if some runner failed *only* on concurrency the job waits
   (``WaitingForCapacity``, retried with exponential backoff) until its capacity deadline,
   then fails ``CapacityDeadlineExceeded``; otherwise it fails closed with
   ``ModelNotAdvertised``, ``NoDefaultModel`` or ``NoEligibleRunner``.

The candidate table has one row per runner, closest first, bounded to 20.
"""

from __future__ import annotations

import datetime as dt
import enum
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from helmhive.api.common import ReasoningEffort, SessionPolicy
from helmhive.api.job import AgentJobSpec, Candidate, ModelOverride, ModelSource, ProfileBinding
from helmhive.api.profile import ProviderMapping, SessionScope
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.conditions import set_condition
from helmhive.policy.envelopes import is_governed
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

MAX_CANDIDATES = 20
"""The candidate table in status is bounded; ``consideredRunners`` says how many there were."""

RunnerKey = tuple[str, str]
"""A runner's identity: (namespace, name)."""


class RouteOutcome(enum.StrEnum):
    ASSIGNED = "Assigned"
    WAITING = "WaitingForCapacity"
    FAILED = "Failed"


@dataclass(frozen=True, kw_only=True)
class RunnerView:
    """One runner as routing sees it: its report, its pool's facts and what the operator derived.

    Built by :func:`helmhive.policy.routing_inputs.build_runner_view`; ``serves_namespace``
    is precomputed for the job's namespace from the pool's selector.
    """

    namespace: str
    name: str
    pool: str
    provider: str | None
    schedulable: bool
    schedulable_reason: str = Reason.SCHEDULABLE.value
    default_model: str | None = None
    models: frozenset[str] = frozenset()
    capabilities: frozenset[str] = frozenset()
    labels: Mapping[str, str] = field(default_factory=dict)
    concurrency: int = 1
    credential_generation: int = 0
    serves_namespace: bool = True
    key: RunnerKey = field(init=False, repr=False, compare=False)
    """(namespace, name), computed once: routing reads it for every runner of every decision."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.namespace, self.name))

    def advertises(self, model: str) -> bool:
        """The runner offers ``model``: it is in the catalogue, or it is the reported default."""
        return model in self.models or model == self.default_model


@dataclass(frozen=True, kw_only=True)
class RoutingJob:
    """The job being routed: where it lives and its (immutable) request."""

    namespace: str
    name: str
    spec: AgentJobSpec


@dataclass(frozen=True, kw_only=True)
class SessionBindingView:
    """A session binding with a stored session: continuity for one key on one runner.

    The key is workspace, profile, provider, runner and its credential generation, and scope
    (``workspace`` or ``service:<name>``, see :func:`decide_session_scope`); a different
    runner, or a rotated credential, starts its own chain.
    """

    workspace: str
    profile: str
    provider: str
    runner_namespace: str
    runner: str
    credential_generation: int
    scope: str


@dataclass(frozen=True, kw_only=True)
class RoutingPolicy:
    """Tunables of the capacity wait; the defaults are what the operator uses."""

    capacity_deadline_seconds: float = 900.0
    backoff_initial_seconds: float = 2.0
    backoff_max_seconds: float = 60.0
    max_candidates: int = MAX_CANDIDATES


@dataclass(frozen=True, kw_only=True)
class RouteOption:
    """One (mapping, model) the job may run with, in preference order.

    ``model`` is None for automatic selection (the runner's reported default).
    """

    position: int
    mapping_index: int
    provider: str
    model: str | None
    source: ModelSource
    effort: ReasoningEffort | None


@dataclass(frozen=True, kw_only=True)
class RouteChoice:
    """Where the job runs and with what: the decision's assignment, before memory is added."""

    runner_namespace: str
    runner: str
    pool: str
    provider: str
    model: str
    model_source: ModelSource
    effort: ReasoningEffort | None
    mapping_index: int
    credential_generation: int
    resumes_session: bool

    @property
    def runner_key(self) -> RunnerKey:
        return (self.runner_namespace, self.runner)


@dataclass(frozen=True, kw_only=True)
class RoutingDecision:
    """The outcome of :func:`decide_route`.

    ``capacity_blocked`` lists (unbounded, for the router's wake-ups) the runners that
    failed only on free concurrency; ``candidates`` is the bounded table for status.
    """

    outcome: RouteOutcome
    reason: Reason
    message: str
    choice: RouteChoice | None = None
    candidates: tuple[Candidate, ...] = ()
    considered_runners: int = 0
    capacity_blocked: frozenset[RunnerKey] = frozenset()
    retry_after: float | None = None
    capacity_deadline: dt.datetime | None = None
    avoided_provider: str | None = None

    @property
    def routed(self) -> bool:
        return self.outcome is RouteOutcome.ASSIGNED


# Closeness ranks of a runner's result; lower is closer to running the job.
_SELECTED, _ELIGIBLE, _CAPACITY, _MODEL, _REQUIREMENT, _PROVIDER, _NAMESPACE, _UNSCHEDULABLE = range(8)
_NO_POSITION = 1 << 20
# Reason strings, read once: an enum member's ``.value`` is a descriptor call in the hot loop.
_NOT_SCHEDULABLE = Reason.NOT_SCHEDULABLE.value
_NAMESPACE_NOT_SERVED = Reason.NAMESPACE_NOT_SERVED.value
_PROVIDER_NOT_IN_MAPPINGS = Reason.PROVIDER_NOT_IN_MAPPINGS.value
_MISSING_CAPABILITY = Reason.MISSING_CAPABILITY.value
_MISSING_LABEL = Reason.MISSING_LABEL.value
_MODEL_NOT_ADVERTISED = Reason.MODEL_NOT_ADVERTISED.value
_NO_DEFAULT_MODEL = Reason.NO_DEFAULT_MODEL.value
_NO_FREE_CONCURRENCY = Reason.NO_FREE_CONCURRENCY.value

_Result = tuple[int, int, str, str, str, "RouteOption | None", "str | None", RunnerView]
"""One runner's closest result: (rank, option position, namespace, name, reason, option, model, runner).

A plain tuple so the candidate table is ordered by C comparisons: (rank, position, namespace,
name) is unique per runner, so the comparison never reaches the later fields.
"""
_Rank = tuple[int, float, str, str]
"""How an eligible runner ranks for the winning option: (holds no session binding, load, namespace, name)."""
_SELECTED_REASON = Reason.SELECTED.value
_NOT_PREFERRED = Reason.NOT_PREFERRED.value


def _override(spec: AgentJobSpec) -> ModelOverride | None:
    """The job's override, or None when absent or empty."""
    model = spec.model
    if model is None or (model.provider is None and model.model is None and model.reasoning_effort is None):
        return None
    return model


def build_options(
    *, mappings: Sequence[ProviderMapping], override: ModelOverride | None, avoid_provider: str | None = None
) -> list[RouteOption]:
    """The ordered options of a profile's mappings, narrowed by an (allowed) override.

    For a change review the options of providers other than ``avoid_provider`` come first,
    each group in the profile's order.
    """
    raw: list[tuple[int, str, str | None, ModelSource, ReasoningEffort | None]] = []
    for index, mapping in enumerate(mappings):
        if override is not None and override.provider is not None and mapping.provider != override.provider:
            continue
        effort = (override.reasoning_effort if override else None) or mapping.reasoning_effort
        if override is not None and override.model is not None:
            raw.append((index, mapping.provider, override.model, ModelSource.OVERRIDE, effort))
            continue
        if mapping.model is not None:
            raw.append((index, mapping.provider, mapping.model, ModelSource.MAPPING, effort))
        else:
            raw.append((index, mapping.provider, None, ModelSource.RUNNER_DEFAULT, effort))
        raw.extend((index, mapping.provider, fb, ModelSource.FALLBACK, effort) for fb in mapping.fallback_models)
    if avoid_provider is not None:
        raw = [r for r in raw if r[1] != avoid_provider] + [r for r in raw if r[1] == avoid_provider]
    return [
        RouteOption(position=pos, mapping_index=i, provider=p, model=m, source=s, effort=e)
        for pos, (i, p, m, s, e) in enumerate(raw)
    ]


def decide_session_scope(*, spec: AgentJobSpec, scope: SessionScope) -> str:
    """The scope part of a session key: ``service:<name>`` for a service-scoped job, else ``workspace``."""
    if scope is SessionScope.SERVICE and spec.service:
        return f"service:{spec.service}"
    return "workspace"


def _runner_check(
    runner: RunnerView,
    *,
    providers: set[str],
    capabilities: Sequence[str],
    required: frozenset[str],
    labels: Sequence[tuple[str, str]],
) -> tuple[int, str] | None:
    """The first runner-level requirement ``runner`` fails, as (rank, reason); None if it passes all."""
    if not runner.schedulable:
        return _UNSCHEDULABLE, f"{_NOT_SCHEDULABLE}/{runner.schedulable_reason}"
    if not runner.serves_namespace:
        return _NAMESPACE, _NAMESPACE_NOT_SERVED
    if runner.provider is None or runner.provider not in providers:
        return _PROVIDER, _PROVIDER_NOT_IN_MAPPINGS
    if not required <= runner.capabilities:
        for capability in capabilities:
            if capability not in runner.capabilities:
                return _REQUIREMENT, f"{_MISSING_CAPABILITY}:{capability}"
    if labels:
        runner_labels = runner.labels
        for key, value in labels:
            if runner_labels.get(key) != value:
                return _REQUIREMENT, f"{_MISSING_LABEL}:{key}={value}"
    return None


def _option_check(runner: RunnerView, option: RouteOption, *, active: int) -> tuple[int, str, str | None]:
    """(rank, reason, model) of ``runner`` for one option of its provider."""
    model = option.model
    if model is not None:
        if model not in runner.models and model != runner.default_model:
            return _MODEL, f"{_MODEL_NOT_ADVERTISED}:{model}", model
    elif runner.default_model is None:
        return _MODEL, _NO_DEFAULT_MODEL, None
    else:
        model = runner.default_model
    if active >= runner.concurrency:
        return _CAPACITY, _NO_FREE_CONCURRENCY, model
    return _ELIGIBLE, "", model


def _load(runner: RunnerView, active: int) -> float:
    """active / concurrency. A float orders these exactly: both are at most 64, and equal ratios
    divide to the same correctly rounded float."""
    return active / runner.concurrency if runner.concurrency > 0 else 1.0


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def decide_backoff(*, attempts: int, policy: RoutingPolicy) -> float:
    """Seconds before re-deciding a waiting job after ``attempts`` earlier waits: 2, 4, 8 … capped."""
    exponent = min(max(attempts, 0), 30)
    return float(min(policy.backoff_max_seconds, policy.backoff_initial_seconds * (2**exponent)))


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
    policy: RoutingPolicy = RoutingPolicy(),
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
    providers = {o.provider for o in options}
    by_provider: dict[str, list[RouteOption]] = {}
    for option in options:
        by_provider.setdefault(option.provider, []).append(option)
    capabilities = list(profile.required_capabilities)
    required = frozenset(capabilities)
    labels = sorted(profile.required_labels.items())
    required_labels = frozenset(labels)

    # One result per runner key (the input order does not matter: every ordering below ends on
    # the runner's namespace and name).
    results: dict[RunnerKey, _Result] = {}
    eligible: dict[int, list[RunnerView]] = {}
    blocked: set[RunnerKey] = set()
    held: set[RunnerKey] = set()
    for runner in runners:
        key = runner.key
        if (
            runner.schedulable
            and runner.serves_namespace
            and runner.provider in providers
            and required <= runner.capabilities
            and required_labels <= runner.labels.items()
        ):
            failed = None  # the common case, in C comparisons; _runner_check names the first failure
        else:
            failed = _runner_check(
                runner, providers=providers, capabilities=capabilities, required=required, labels=labels
            )
        if failed is not None:
            results[key] = (failed[0], _NO_POSITION, runner.namespace, runner.name, failed[1], None, None, runner)
            if runner.schedulable_reason == Reason.HEARTBEAT_HELD:
                held.add(key)  # maybe alive: the operator only lost sight of it (policy.runners)
            continue
        active = active_jobs.get(key, 0)
        best: tuple[int, int, str, str | None, RouteOption] | None = None
        for option in by_provider[runner.provider or ""]:
            rank, reason, model = _option_check(runner, option, active=active)
            if rank == _ELIGIBLE:
                eligible.setdefault(option.position, []).append(runner)
            elif rank == _CAPACITY and runner.concurrency > 0:
                blocked.add(key)
            if best is None or (rank, option.position) < best[:2]:
                best = (rank, option.position, reason, model, option)
        assert best is not None  # the runner's provider has at least one option
        rank, position, reason, model, option = best
        results[key] = (rank, position, runner.namespace, runner.name, reason, option, model, runner)

    if eligible:
        return _assigned(
            job=job,
            binding=binding,
            options=options,
            eligible=eligible,
            results=results,
            active_jobs=active_jobs,
            bindings=bindings,
            avoid_provider=avoid_provider,
            policy=policy,
            considered=considered,
        )
    table = _table(results.values(), policy)
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
        results=list(results.values()),
        table=table,
        considered_runners=considered,
        avoided_provider=avoid_provider,
    )


def _assigned(
    *,
    job: RoutingJob,
    binding: ProfileBinding,
    options: Sequence[RouteOption],
    eligible: Mapping[int, list[RunnerView]],
    results: dict[RunnerKey, _Result],
    active_jobs: Mapping[RunnerKey, int],
    bindings: Sequence[SessionBindingView],
    avoid_provider: str | None,
    policy: RoutingPolicy,
    considered: int,
) -> RoutingDecision:
    position = min(eligible)
    option = options[position]
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

    # Ranks are unique per runner key, so min() over the tuples never compares two runners.
    win_rank, winner = min(((rank(r), r) for r in eligible[position]), key=_first)
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
        others = (result for key, result in results.items() if key != winner_key)
        for result in heapq.nsmallest(limit - 1, others):
            closeness, at, namespace, name, _, chosen, chosen_model, runner = result
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
    held: set[RunnerKey],
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


def _first(pair: tuple[_Rank, RunnerView]) -> _Rank:
    return pair[0]


def _why_not_preferred(
    option: RouteOption, winning: RouteOption, mine: _Rank, theirs: _Rank, avoid_provider: str | None
) -> str:
    prefix = _NOT_PREFERRED
    if option.position != winning.position:
        if avoid_provider is not None and option.provider == avoid_provider != winning.provider:
            return f"{prefix}:SameProviderAsImplementation"
        if option.mapping_index != winning.mapping_index:
            return f"{prefix}:LaterMapping"
        return f"{prefix}:LaterModel"
    if mine[0] != theirs[0]:
        return f"{prefix}:NoSessionBinding"
    if mine[1] != theirs[1]:
        return f"{prefix}:MoreLoaded"
    return f"{prefix}:NameOrder"


def _failed(
    *,
    job: RoutingJob,
    binding: ProfileBinding,
    options: Sequence[RouteOption],
    results: Sequence[_Result],
    table: tuple[Candidate, ...],
    considered_runners: int,
    avoided_provider: str | None,
) -> RoutingDecision:
    common: dict[str, Any] = {
        "considered_runners": considered_runners,
        "avoided_provider": avoided_provider,
        "candidates": table,
        "outcome": RouteOutcome.FAILED,
    }
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


def _table(rows: Iterable[_Result], policy: RoutingPolicy) -> tuple[Candidate, ...]:
    """The closest ``policy.max_candidates`` rows as the candidate table."""
    limit = policy.max_candidates
    return _candidates(heapq.nsmallest(limit, rows)) if limit > 0 else ()


def _candidates(ordered: Iterable[_Result]) -> tuple[Candidate, ...]:
    rows = []
    for _, _, namespace, name, reason, option, model, runner in ordered:
        rows.append(
            Candidate(
                runner=name,
                namespace=namespace,
                provider=option.provider if option else runner.provider,
                mapping_index=option.mapping_index if option else None,
                model=model if option else None,
                reason=_truncate(reason, 160),
            )
        )
    return tuple(rows)


# Status builders ----------------------------------------------------------------------


def build_routing_status(*, decision: RoutingDecision, attempts: int, now: dt.datetime) -> dict[str, Any]:
    """``status.routing`` (wire form) for ``decision``."""
    status: dict[str, Any] = {
        "consideredRunners": decision.considered_runners,
        "candidates": [c.to_wire() for c in decision.candidates],
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

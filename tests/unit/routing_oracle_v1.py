"""The routing decision as implemented at commit ce56994, kept as a test oracle. Do not optimise.

``decide_route`` in :mod:`helmhive.policy.routing.route` was rewritten for speed (issue 9: at most
1 ms over 1,000 runners). This is the earlier, straightforward implementation, copied
unchanged but for its imports and later rules: a runner's catalogue must offer the option's
reasoning effort with its model (``EffortNotOffered``), and a resuming (forking) profile needs an
agent that advertised ``session-load`` (``session-fork``), and waits for a runner whose agent was not
probed yet (issue 39); and a job that no runner can serve *yet* waits for
a runner until its deadline instead of failing closed at once (:func:`_wait_for_runner`, as
``docs/routing.md`` says), and so does one that a runner not schedulable now would pass every
other runner-level check of (a pool rolling out, a runner restarting), whatever other runners
lack; ``test_routing_fast_path.py`` checks that both return the same decision, candidate table
included, on generated inputs. Tests only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from helmhive.api.common import SessionPolicy
from helmhive.api.job import AgentJobSpec, Candidate, ModelOverride, ModelSource, ProfileBinding
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import is_governed
from helmhive.policy.routing.route import (
    RouteChoice,
    RouteOption,
    RouteOutcome,
    RoutingDecision,
    RoutingJob,
    RoutingPolicy,
    RunnerKey,
    RunnerView,
    SessionBindingView,
    build_options,
    decide_backoff,
    decide_session_scope,
)

# Closeness ranks of a runner's result; lower is closer to running the job.
_SELECTED, _ELIGIBLE, _CAPACITY, _MODEL, _REQUIREMENT, _PROVIDER, _NAMESPACE, _UNSCHEDULABLE = range(8)
_NO_POSITION = 1 << 20


@dataclass(slots=True, kw_only=True)
class _Result:
    """One runner's closest result: its rank, the option it reached (if any) and the reason."""

    runner: RunnerView
    rank: int
    reason: str
    option: RouteOption | None = None
    model: str | None = None

    @property
    def sort_key(self) -> tuple[int, int, str, str]:
        position = self.option.position if self.option else _NO_POSITION
        return (self.rank, position, self.runner.namespace, self.runner.name)


def _override(spec: AgentJobSpec) -> ModelOverride | None:
    """The job's override, or None when absent or empty."""
    model = spec.model
    if model is None or (model.provider is None and model.model is None and model.reasoning_effort is None):
        return None
    return model


def _runner_check(
    runner: RunnerView,
    *,
    providers: set[str],
    capabilities: Sequence[str],
    labels: Sequence[tuple[str, str]],
    agent: Sequence[str] = (),
) -> tuple[int, str] | None:
    """The first runner-level requirement ``runner`` fails, as (rank, reason); None if it passes all."""
    if not runner.schedulable:
        return _UNSCHEDULABLE, f"{Reason.NOT_SCHEDULABLE.value}/{runner.schedulable_reason}"
    if not runner.serves_namespace:
        return _NAMESPACE, Reason.NAMESPACE_NOT_SERVED.value
    if runner.provider is None or runner.provider not in providers:
        return _PROVIDER, Reason.PROVIDER_NOT_IN_MAPPINGS.value
    for capability in capabilities:
        if capability not in runner.capabilities:
            return _REQUIREMENT, f"{Reason.MISSING_CAPABILITY.value}:{capability}"
    for capability in agent:
        if runner.agent_capabilities is None:
            return _REQUIREMENT, f"{Reason.MISSING_CAPABILITY.value}:{capability}/{Reason.AGENT_NOT_PROBED.value}"
        if capability not in runner.agent_capabilities:
            return _REQUIREMENT, f"{Reason.MISSING_CAPABILITY.value}:{capability}"
    for key, value in labels:
        if runner.labels.get(key) != value:
            return _REQUIREMENT, f"{Reason.MISSING_LABEL.value}:{key}={value}"
    return None


def _option_check(runner: RunnerView, option: RouteOption, *, active: int) -> tuple[int, str, str | None]:
    """(rank, reason, model) of ``runner`` for one option of its provider."""
    if option.model is not None:
        if not runner.advertises(option.model):
            return _MODEL, f"{Reason.MODEL_NOT_ADVERTISED.value}:{option.model}", option.model
        model = option.model
    elif runner.default_model is None:
        return _MODEL, Reason.NO_DEFAULT_MODEL.value, None
    else:
        model = runner.default_model
    if option.effort is not None and not runner.offers_effort(model, option.effort.value):
        return _MODEL, f"{Reason.EFFORT_NOT_OFFERED.value}:{model}/{option.effort.value}", model
    if active >= runner.concurrency:
        return _CAPACITY, Reason.NO_FREE_CONCURRENCY.value, model
    return _ELIGIBLE, "", model


def _load(runner: RunnerView, active: int) -> Fraction:
    return Fraction(active, runner.concurrency) if runner.concurrency > 0 else Fraction(1)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    policy: RoutingPolicy = RoutingPolicy(),  # noqa: B008
) -> RoutingDecision:
    """Decide where ``job`` runs, or why it cannot; see the module docstring for the rules.

    ``active_jobs`` counts, per runner, the jobs assigned to it and not finished (counted by
    the caller from the jobs themselves). ``attempts`` is how many times the job already
    waited for capacity (for the backoff). ``binding.bound_at`` is the queue time the
    capacity deadline counts from.
    """
    profile = binding.snapshot
    ordered = sorted(runners, key=lambda r: (r.namespace, r.name))
    considered = len(ordered)
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
    labels = sorted(profile.required_labels.items())
    agent: tuple[str, ...] = ()
    if not is_governed(job.spec.job_kind):
        agent = {SessionPolicy.RESUME: ("session-load",), SessionPolicy.FORK: ("session-fork",)}.get(
            profile.session.policy, ()
        )

    results: dict[RunnerKey, _Result] = {}
    eligible: dict[int, list[RunnerView]] = {}
    blocked: set[RunnerKey] = set()
    for runner in ordered:
        failed = _runner_check(runner, providers=providers, capabilities=capabilities, labels=labels, agent=agent)
        if failed is not None:
            results[runner.key] = _Result(runner=runner, rank=failed[0], reason=failed[1])
            continue
        active = active_jobs.get(runner.key, 0)
        best: tuple[int, int, str, str | None, RouteOption] | None = None
        for option in by_provider[runner.provider or ""]:
            rank, reason, model = _option_check(runner, option, active=active)
            if rank == _ELIGIBLE:
                eligible.setdefault(option.position, []).append(runner)
            elif rank == _CAPACITY and runner.concurrency > 0:
                blocked.add(runner.key)
            if best is None or (rank, option.position) < best[:2]:
                best = (rank, option.position, reason, model, option)
        assert best is not None  # the runner's provider has at least one option
        rank, _, reason, model, option = best
        results[runner.key] = _Result(runner=runner, rank=rank, reason=reason, option=option, model=model)

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
    if blocked:
        deadline = binding.bound_at + dt.timedelta(seconds=policy.capacity_deadline_seconds)
        busy = len(blocked)
        if now >= deadline:
            return RoutingDecision(
                outcome=RouteOutcome.FAILED,
                reason=Reason.CAPACITY_DEADLINE_EXCEEDED,
                message=f"waited for a free slot on {busy} eligible runner{'s' if busy != 1 else ''} "
                f"from {_iso(binding.bound_at)} until the deadline {_iso(deadline)}",
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
            f"until {_iso(deadline)}",
            candidates=table,
            considered_runners=considered,
            capacity_blocked=frozenset(blocked),
            retry_after=retry,
            capacity_deadline=deadline,
            avoided_provider=avoid_provider,
        )
    if options and all(r.rank in (_PROVIDER, _NAMESPACE, _UNSCHEDULABLE) for r in results.values()):
        return _wait_for_runner(
            binding=binding,
            results=list(results.values()),
            table=table,
            considered_runners=considered,
            avoided_provider=avoid_provider,
            policy=policy,
            now=now,
        )
    # Not schedulable now, or its agent not probed yet, and would pass every other runner-level check.
    unprobed = "/" + Reason.AGENT_NOT_PROBED.value
    later = [
        r
        for r in results.values()
        if (r.rank == _UNSCHEDULABLE or r.reason.endswith(unprobed))
        and _runner_check(
            dataclasses.replace(
                r.runner,
                schedulable=True,
                agent_capabilities=r.runner.agent_capabilities if r.runner.agent_capabilities is not None
                else frozenset(agent),
            ),
            providers=providers, capabilities=capabilities, labels=labels, agent=agent,
        ) is None
    ]  # fmt: skip
    if options and later:
        return _wait_for_runner(
            binding=binding,
            results=list(results.values()),
            later=later,
            table=table,
            considered_runners=considered,
            avoided_provider=avoid_provider,
            policy=policy,
            now=now,
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


def _wait_for_runner(
    *,
    binding: ProfileBinding,
    results: Sequence[_Result],
    later: Sequence[_Result] = (),
    table: tuple[Candidate, ...],
    considered_runners: int,
    avoided_provider: str | None,
    policy: RoutingPolicy,
    now: dt.datetime,
) -> RoutingDecision:
    """No runner of the job's providers serving its namespace is schedulable: wait, then fail at the deadline."""
    deadline = binding.bound_at + dt.timedelta(seconds=policy.capacity_deadline_seconds)
    if later:
        waiting = sorted((r.runner.namespace, r.runner.name, r.reason) for r in later)
        named = ", ".join(f"{name} ({reason})" for _, name, reason in waiting[:8])
        more = f" and {len(waiting) - 8} more" if len(waiting) > 8 else ""
        count = len(waiting)
        why = (
            f"{count} runner{'s' if count != 1 else ''} that could take it {'are' if count != 1 else 'is'} "
            f"not schedulable now: {named}{more}"
        )
    elif results:
        closest = min(r.rank for r in results)
        summary = ", ".join(sorted({r.reason for r in results if r.rank == closest}))
        count = len(results)
        why = f"none of {count} runner{'s' if count != 1 else ''} can take it (closest: {summary})"
    else:
        why = "no runner is registered"
    common: dict[str, Any] = {
        "candidates": table,
        "considered_runners": considered_runners,
        "avoided_provider": avoided_provider,
        "capacity_deadline": deadline,
    }
    if now < deadline:
        return RoutingDecision(
            outcome=RouteOutcome.WAITING,
            reason=Reason.WAITING_FOR_CAPACITY,
            message=_truncate(f"no runner is eligible yet: {why}; waiting for one until {_iso(deadline)}", 1024),
            **common,
        )
    return RoutingDecision(
        outcome=RouteOutcome.FAILED,
        reason=Reason.NO_ELIGIBLE_RUNNER,
        message=_truncate(
            f"{why}; nothing can run the job: no runner became eligible from {_iso(binding.bound_at)} "
            f"until the deadline {_iso(deadline)}",
            1024,
        ),
        **common,
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

    def holds_session(runner: RunnerView) -> bool:
        return resumable and any(
            b.runner_namespace == runner.namespace
            and b.runner == runner.name
            and b.provider == runner.provider
            and b.credential_generation == runner.credential_generation
            and b.workspace == job.spec.workspace
            and b.profile == binding.name
            and b.scope == scope
            for b in bindings
        )

    ranks: dict[RunnerKey, tuple[int, Fraction, str, str]] = {}

    def rank(runner: RunnerView) -> tuple[int, Fraction, str, str]:
        key = runner.key
        found = ranks.get(key)
        if found is None:
            load = _load(runner, active_jobs.get(key, 0))
            found = ranks[key] = (0 if holds_session(runner) else 1, load, runner.namespace, runner.name)
        return found

    winner = min(eligible[position], key=rank)
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
    rows: list[_Result] = []
    for key, result in results.items():
        if key == winner.key:
            rows.append(
                _Result(runner=winner, rank=_SELECTED, reason=Reason.SELECTED.value, option=option, model=model)
            )
        elif result.rank == _ELIGIBLE and result.option is not None:
            why = _why_not_preferred(result, option, rank(result.runner), win_rank, avoid_provider)
            rows.append(
                _Result(runner=result.runner, rank=_ELIGIBLE, reason=why, option=result.option, model=result.model)
            )
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
        candidates=_table(rows, policy),
        considered_runners=considered,
        avoided_provider=avoid_provider,
    )


def _why_not_preferred(
    result: _Result,
    winning: RouteOption,
    mine: tuple[int, Fraction, str, str],
    theirs: tuple[int, Fraction, str, str],
    avoid_provider: str | None,
) -> str:
    option = result.option
    assert option is not None
    prefix = Reason.NOT_PREFERRED.value
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
    closest = min(r.rank for r in results)
    nearest = [r for r in results if r.rank == closest]
    if closest == _MODEL:
        missing = sorted({r.reason.partition(":")[2] for r in nearest if r.reason.startswith("ModelNotAdvertised")})
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
        efforts = sorted({r.reason.partition(":")[2] for r in nearest if r.reason.startswith("EffortNotOffered")})
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
    summary = ", ".join(sorted({r.reason for r in nearest}))
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
    ordered = sorted(rows, key=lambda r: r.sort_key)[: policy.max_candidates]
    return tuple(
        Candidate(
            runner=r.runner.name,
            namespace=r.runner.namespace,
            provider=r.option.provider if r.option else r.runner.provider,
            mapping_index=r.option.mapping_index if r.option else None,
            model=r.model if r.option else None,
            reason=_truncate(r.reason, 160),
        )
        for r in ordered
    )


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

"""Routing's candidate filtering and table: options, per-runner checks, ranks and the table's rows. Pure.

The pieces :func:`helmhive.policy.routing.route.decide_route` is built from: the ordered options of
a profile (:func:`build_options`), the first requirement a runner fails
(:func:`runner_check`) or its result for one option (:func:`option_check`), the closeness
ranks that order the candidate table, and the table's rows (:func:`candidates`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from helmhive.api.common import ReasoningEffort
from helmhive.api.job import AgentJobSpec, Candidate, ModelOverride, ModelSource
from helmhive.api.profile import ProviderMapping, SessionScope
from helmhive.api.reasons import Reason
from helmhive.policy.routing.model import RouteOption, RoutingPolicy, RunnerView

__all__ = ["build_options", "decide_backoff", "decide_session_scope"]

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
_EFFORT_NOT_OFFERED = Reason.EFFORT_NOT_OFFERED.value
_AGENT_NOT_PROBED = Reason.AGENT_NOT_PROBED.value

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
    agent: Sequence[str] = (),
) -> tuple[int, str] | None:
    """The first runner-level requirement ``runner`` fails, as (rank, reason); None if it passes all.

    ``agent``: what the job's session policy needs its agent to have advertised (``session-load``…).
    """
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
    advertised = runner.agent_capabilities
    for capability in agent:
        if advertised is None:
            return _REQUIREMENT, f"{_MISSING_CAPABILITY}:{capability}/{_AGENT_NOT_PROBED}"
        if capability not in advertised:
            return _REQUIREMENT, f"{_MISSING_CAPABILITY}:{capability}"
    if labels:
        runner_labels = runner.labels
        for key, value in labels:
            if runner_labels.get(key) != value:
                return _REQUIREMENT, f"{_MISSING_LABEL}:{key}={value}"
    return None


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


def _table(rows: Iterable[_Result], policy: RoutingPolicy) -> tuple[Candidate, ...]:
    """The closest ``policy.max_candidates`` rows as the candidate table."""
    limit = policy.max_candidates
    return _candidates(heapq.nsmallest(limit, rows)) if limit > 0 else ()


_ROWS: dict[tuple[str, str, str | None, int | None, str | None, str], Candidate] = {}
"""Table rows already built, by their fields: a row is a value, so equal rows are one object."""
_ROWS_KEPT = 8192  # a fleet's runners times the few reasons a row of theirs takes; cleared when full


def _candidates(ordered: Iterable[_Result]) -> tuple[Candidate, ...]:
    """The table's rows as :class:`Candidate` objects, shared between decisions: never modify one.

    Every field comes from validated objects (the runners' parsed views, the profile's options),
    so a row is constructed without validating it again, and only the first time it is seen: a
    burst over one fleet builds the same rows decision after decision.
    """
    rows = []
    memo = _ROWS
    key: tuple[str, str, str | None, int | None, str | None, str]
    for _, _, namespace, name, reason, option, model, runner in ordered:
        if option is not None:
            key = (name, namespace, option.provider, option.mapping_index, model, reason)
        else:
            key = (name, namespace, runner.provider, None, None, reason)
        row = memo.get(key)
        if row is None:
            if len(memo) >= _ROWS_KEPT:
                memo.clear()
            row = memo[key] = Candidate.model_construct(
                runner=name,
                namespace=namespace,
                provider=key[2],
                mapping_index=key[3],
                model=key[4],
                reason=_truncate(reason, 160),
            )
        rows.append(row)
    return tuple(rows)

"""What routing reads of the fleet: runners and their pools, as one job's namespace sees them. Pure.

Owns, for :mod:`helmhive.policy.routing.inputs` (which re-exports them) and so for the operator's
router and ``helmhive explain-routing`` alike:

- :class:`RunnerFacts`, :func:`parse_runner`; :class:`PoolServing`, :func:`parse_pool`: the parts of
  a Runner and a RunnerPool routing reads;
- :func:`match_label_selector`, :func:`decide_pool_serves`: which namespaces a pool serves;
- :func:`build_runner_view`, :func:`build_runner_views`: one
  :class:`~helmhive.policy.routing.route.RunnerView` per runner, schedulable only when its condition and
  the facts behind it agree.

Nothing here does I/O or reads the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from helmhive.api.common import ControlState, LabelSelector
from helmhive.api.reasons import ConditionType, Reason
from helmhive.api.runner import AuthState, ReportedStatus, RunnerReport, RunnerSpec, RunnerStatus
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.policy.conditions import find_condition
from helmhive.policy.routing.route import RunnerKey, RunnerView

__all__ = [
    "PoolKey",
    "PoolServing",
    "RunnerFacts",
    "build_runner_view",
    "build_runner_views",
    "decide_pool_serves",
    "match_label_selector",
    "parse_pool",
    "parse_runner",
]

PoolKey = tuple[str, str]


@dataclass(frozen=True, kw_only=True)
class RunnerFacts:
    """The parts of a Runner routing reads: its pool, its report and what the operator derived."""

    namespace: str
    name: str
    pool: str
    report: RunnerReport | None
    schedulable: bool | None
    schedulable_reason: str | None
    reported_status: ReportedStatus | None
    control_state: ControlState | None

    @property
    def key(self) -> RunnerKey:
        return (self.namespace, self.name)

    @property
    def pool_key(self) -> PoolKey:
        return (self.namespace, self.pool)


@dataclass(frozen=True, kw_only=True)
class PoolServing:
    """The parts of a RunnerPool routing reads."""

    namespace: str
    name: str
    provider: str
    concurrency: int
    serves: LabelSelector
    credential_generation: int

    @property
    def key(self) -> PoolKey:
        return (self.namespace, self.name)


def parse_runner(body: Mapping[str, Any]) -> RunnerFacts | None:
    """Parse a Runner; None when its spec is unusable. An unparsable report counts as none."""
    meta = body.get("metadata") or {}
    try:
        spec = RunnerSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None
    raw = dict(body.get("status") or {})
    try:
        status = RunnerStatus.model_validate(raw)
    except ValidationError:
        raw.pop("report", None)
        try:
            status = RunnerStatus.model_validate(raw)
        except ValidationError:
            status = RunnerStatus()
    condition = find_condition([c.to_wire() for c in status.conditions], ConditionType.SCHEDULABLE)
    schedulable = None if condition is None else {"True": True, "False": False}.get(str(condition.get("status")))
    return RunnerFacts(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        pool=spec.pool_ref.name,
        report=status.report,
        schedulable=schedulable,
        schedulable_reason=str(condition.get("reason")) if condition else None,
        reported_status=status.reported_status,
        control_state=status.effective_control_state,
    )


def parse_pool(body: Mapping[str, Any]) -> PoolServing | None:
    """Parse a RunnerPool; None when its spec is unusable (its runners then have no pool)."""
    meta = body.get("metadata") or {}
    try:
        spec = RunnerPoolSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None
    status = body.get("status") or {}
    try:
        generation = int(status.get("credentialGeneration") or 0)
    except (TypeError, ValueError):
        generation = 0
    return PoolServing(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        provider=spec.provider,
        concurrency=spec.concurrency,
        serves=spec.serves_namespaces,
        credential_generation=generation,
    )


def match_label_selector(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics: every ``matchLabels`` pair and every expression holds.

    ``In``: the key is present with one of the values; ``NotIn``: absent, or present with none
    of them; ``Exists`` / ``DoesNotExist``: the key's presence. An empty selector matches all.
    """
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for expression in selector.match_expressions:
        present = expression.key in labels
        actual = labels.get(expression.key)
        match expression.operator:
            case "In":
                ok = present and actual in expression.values
            case "NotIn":
                ok = not present or actual not in expression.values
            case "Exists":
                ok = present
            case "DoesNotExist":
                ok = not present
            case _:
                ok = False
        if not ok:
            return False
    return True


def decide_pool_serves(*, pool: PoolServing, namespace: str, labels: Mapping[str, str] | None) -> bool:
    """Whether ``pool`` serves jobs in ``namespace`` (whose labels are ``labels``; None if unknown).

    A pool always serves its own namespace. Another namespace is served only when the pool's
    ``servesNamespaces`` is non-empty and matches its labels: an empty selector does not lend
    a pool's provider login to the whole cluster (fail closed).
    """
    if namespace == pool.namespace:
        return True
    if not pool.serves.match_labels and not pool.serves.match_expressions:
        return False
    if labels is None:
        return False
    return match_label_selector(pool.serves, labels)


def _not_schedulable(runner: RunnerFacts, pool: PoolServing | None) -> str | None:
    """The reason ``runner`` may not take work, or None. Re-checks what the Schedulable condition says."""
    if pool is None:
        return Reason.POOL_NOT_FOUND.value
    if runner.schedulable is not True:
        return runner.schedulable_reason or Reason.PENDING.value
    control = runner.control_state or ControlState.ACTIVE
    if control is not ControlState.ACTIVE:
        return control.value
    report = runner.report
    if report is None:
        return Reason.NEVER_REPORTED.value
    if runner.reported_status is not ReportedStatus.ONLINE:
        return (runner.reported_status or ReportedStatus.OFFLINE).value
    if report.authentication.state is not AuthState.AUTHENTICATED:
        return report.authentication.state.value
    if report.credential_generation != pool.credential_generation:
        return Reason.CREDENTIAL_ROTATED.value
    return None


def _advertised(report: RunnerReport | None) -> frozenset[str] | None:
    """What the runner's agent advertised; None until a probe reached it (``AgentNotProbed``)."""
    if report is None or report.agent_capabilities is None:
        return None
    return frozenset(report.agent_capabilities)


def _efforts(report: RunnerReport | None) -> dict[str, frozenset[str] | None]:
    """Each model's efforts, as learnt. A report without the agent's advertisement (a runner that
    has not probed its agent, or one older than per-model efforts) has learnt none of them."""
    if report is None or report.agent_capabilities is None:
        return {}
    return {m.id: frozenset(m.efforts) if m.efforts is not None else None for m in report.catalogue.models}


def build_runner_view(*, runner: RunnerFacts, pool: PoolServing | None, serves_namespace: bool) -> RunnerView:
    """One runner as :func:`decide_route` sees it.

    Schedulable needs the operator's ``Schedulable=True`` condition *and* agreement of the
    facts behind it (Active, Online, Authenticated, the pool's current credential
    generation), so a condition written before a change does not schedule a job. The
    runner's concurrency is its reported value, capped by its pool's.
    """
    report = runner.report
    why = _not_schedulable(runner, pool)
    concurrency = report.concurrency if report is not None else 0
    if pool is not None:
        concurrency = min(concurrency, pool.concurrency)
    return RunnerView(
        namespace=runner.namespace,
        name=runner.name,
        pool=runner.pool,
        provider=report.provider if report is not None else (pool.provider if pool is not None else None),
        schedulable=why is None,
        schedulable_reason=why or Reason.SCHEDULABLE.value,
        default_model=report.catalogue.default if report is not None else None,
        models=frozenset(m.id for m in report.catalogue.models) if report is not None else frozenset(),
        capabilities=frozenset(report.capabilities) if report is not None else frozenset(),
        agent_capabilities=(
            frozenset(report.agent_capabilities)
            if report is not None and report.agent_capabilities is not None
            else None
        ),
        efforts=_efforts(report),
        labels=dict(report.placement_labels) if report is not None else {},
        concurrency=concurrency,
        credential_generation=report.credential_generation if report is not None else 0,
        serves_namespace=serves_namespace,
    )


def build_runner_views(
    *,
    runners: Iterable[RunnerFacts],
    pools: Mapping[PoolKey, PoolServing],
    job_namespace: str,
    namespace_labels: Mapping[str, str] | None,
) -> list[RunnerView]:
    """Every runner as a :class:`RunnerView` for a job in ``job_namespace``."""
    views: list[RunnerView] = []
    serves: dict[PoolKey, bool] = {}
    for runner in runners:
        pool = pools.get(runner.pool_key)
        if pool is not None and pool.key not in serves:
            serves[pool.key] = decide_pool_serves(pool=pool, namespace=job_namespace, labels=namespace_labels)
        views.append(
            build_runner_view(
                runner=runner,
                pool=pool,
                serves_namespace=serves.get(runner.pool_key, runner.namespace == job_namespace),
            )
        )
    return views

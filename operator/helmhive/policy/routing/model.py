"""Routing's data: a runner and a job as routing sees them, the options, the choice and the decision. Pure.

The types :func:`helmhive.policy.routing.route.decide_route` reads and returns; no logic beyond
trivial properties. Everything here is re-exported by :mod:`helmhive.policy.routing.route`.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from helmhive.api.common import ReasoningEffort
from helmhive.api.job import AgentJobSpec, Candidate, ModelSource
from helmhive.api.reasons import Reason

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

    Built by :func:`helmhive.policy.routing.fleet.build_runner_view`; ``serves_namespace``
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
    """What the runner offers: its pool's declaration less what its agent did not advertise."""
    agent_capabilities: frozenset[str] | None = frozenset()
    """What its agent advertised (``session-load``, ``session-fork``…), which a session policy needs;
    None until a probe of the runner initialised its agent (a job needing one then waits)."""
    efforts: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    """The reasoning efforts its catalogue offers, per model id; None (or a model not named): not
    learnt, so routing does not refuse an effort with it and the runner's own check decides."""
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

    def offers_effort(self, model: str, effort: str) -> bool:
        """The runner's catalogue offers ``effort`` with ``model``, or has not learnt that model's efforts."""
        known = self.efforts.get(model)
        return known is None or effort in known


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
    ``retry_after`` is the backoff of a wait for capacity (or for held runners); a wait for a
    runner (:attr:`waits_for_runner`) has none: only events and its deadline end it.
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

    @property
    def waits_for_runner(self) -> bool:
        """Waits for a runner that can serve the job at all (none is eligible *yet*), not for a free slot.

        No backoff: the router re-decides it when a runner becomes schedulable or the fleet changes
        (an event), and at ``capacity_deadline``, when it fails closed ``NoEligibleRunner``.
        """
        return self.outcome is RouteOutcome.WAITING and self.retry_after is None

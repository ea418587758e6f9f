"""Routing's per-runner checks that do not depend on load, computed once per fleet and requirement. Pure.

A runner's rejection for a job (not schedulable, namespace not served, provider, capability,
label) and which of the job's options its models (and their efforts) allow depend only on the runner and on the
job's options and requirements; only its free concurrency changes from one decision to the
next. :func:`build_static_checks` computes the former once (a :class:`StaticChecks`), and
:func:`helmhive.policy.routing.route.decide_route` adds the load per decision.

A :class:`RunnerSet` is an immutable sequence of runner views that keeps those checks per
requirement (a small bounded memo), so the operator's router, which decides thousands of jobs
over the same fleet and profile, checks each runner once per fleet change instead of once per
decision. A plain sequence of views is checked afresh on every call: the decision is the same.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import overload

from helmhive.api.reasons import Reason
from helmhive.policy.routing.candidates import (
    _CAPACITY,
    _EFFORT_NOT_OFFERED,
    _ELIGIBLE,
    _MODEL,
    _MODEL_NOT_ADVERTISED,
    _NO_DEFAULT_MODEL,
    _NO_FREE_CONCURRENCY,
    _NO_POSITION,
    _Result,
    _runner_check,
)
from helmhive.policy.routing.model import RouteOption, RunnerKey, RunnerView

__all__ = ["RunnerSet", "StaticChecks", "build_static_checks"]

_HEARTBEAT_HELD = Reason.HEARTBEAT_HELD.value
_KEPT = 16  # requirements remembered per fleet (a burst usually has one or two profiles)

Requirement = tuple[tuple[RouteOption, ...], tuple[str, ...], tuple[tuple[str, str], ...], tuple[str, ...]]
"""(the job's options in order, its required capabilities in order, its required labels sorted, the agent
capabilities its session policy needs)."""

Passing = tuple[RunnerKey, RunnerView, tuple[int, ...], _Result, _Result]
"""A runner that passes every runner-level check and whose models allow an option: (key, view,
the positions of the options its models allow, ascending; then its table row with a free slot
and its row without one, built once here since only the load decides between them)."""


class StaticChecks:
    """Every runner's load-independent check for one requirement, each list in table order.

    ``passing``: the runners that pass every runner-level check and whose models allow at least
    one option, ordered by (first allowed position, namespace, name), which is the table's order
    both of their free rows and of their full rows. ``fixed``: every other runner's row (a
    rejection, or the closest model it lacks), sorted. Rows compare first on their rank, and
    free < full < fixed ranks, so a decision reads its candidate table off these lists in order
    instead of sorting every runner's row. A runner key given twice counts once (the last view).
    """

    __slots__ = ("fixed", "held", "later", "passing")

    def __init__(
        self,
        passing: list[Passing],
        fixed: list[_Result],
        held: frozenset[RunnerKey],
        later: frozenset[RunnerKey] = frozenset(),
    ) -> None:
        self.passing = passing
        self.fixed = fixed
        self.held = held
        """Runners rejected only because the operator holds them (``HeartbeatHeld``)."""
        self.later = later
        """Runners not schedulable now that pass every other runner-level check: restarting, rolling
        out a new configuration, drained or held, they could take the job once schedulable."""


def build_static_checks(runners: Sequence[RunnerView], requirement: Requirement) -> StaticChecks:
    """The load-independent part of every runner's check for one requirement (see the module docstring)."""
    options, capabilities, labels, agent = requirement
    providers = {o.provider for o in options}
    by_provider: dict[str, list[RouteOption]] = {}
    for option in options:
        by_provider.setdefault(option.provider, []).append(option)
    required = frozenset(capabilities)
    required_agent = frozenset(agent)
    required_labels = frozenset(labels)
    entries: dict[RunnerKey, _Result | Passing] = {}  # by key: a key given twice counts once
    held: set[RunnerKey] = set()
    later: set[RunnerKey] = set()
    for runner in runners:
        key = runner.key
        held.discard(key)  # a key given twice: its last view decides
        later.discard(key)
        advertised = runner.agent_capabilities
        unprobed = bool(required_agent) and advertised is None  # not known yet: may fit once probed
        fits = (
            runner.serves_namespace
            and runner.provider in providers
            and required <= runner.capabilities
            and (advertised is None or required_agent <= advertised)
            and required_labels <= runner.labels.items()
        )
        if runner.schedulable and fits and not unprobed:
            failed = None
        else:
            failed = _runner_check(
                runner,
                providers=providers,
                capabilities=capabilities,
                required=required,
                labels=list(labels),
                agent=agent,
            )
        if failed is not None:
            entries[key] = (failed[0], _NO_POSITION, runner.namespace, runner.name, failed[1], None, None, runner)
            if runner.schedulable_reason == _HEARTBEAT_HELD:
                held.add(key)  # maybe alive: the operator only lost sight of it (policy.runners)
            if fits and (unprobed or not runner.schedulable):
                later.add(key)
            continue
        entries[key] = _model_entry(key, runner, by_provider[runner.provider or ""])
    passing: list[Passing] = []
    fixed: list[_Result] = []
    for entry in entries.values():
        if len(entry) == 5:
            passing.append(entry)
        else:
            fixed.append(entry)
    passing.sort(key=_table_order)
    fixed.sort(key=_row_order)
    return StaticChecks(passing, fixed, frozenset(held), frozenset(later))


def _model_entry(key: RunnerKey, runner: RunnerView, options: Sequence[RouteOption]) -> _Result | Passing:
    """A runner that passed every runner-level check: its passing entry if its models allow one of
    ``options`` (its provider's, in position order), else its row naming the closest model it lacks."""
    allowed: list[tuple[RouteOption, str]] = []
    closest: _Result | None = None
    for option in options:
        model = option.model
        if model is not None:
            if not (model in runner.models or model == runner.default_model):
                if closest is None:
                    reason = f"{_MODEL_NOT_ADVERTISED}:{model}"
                    closest = (_MODEL, option.position, runner.namespace, runner.name, reason, option, model, runner)
                continue
        elif runner.default_model is not None:
            model = runner.default_model
        else:
            if closest is None:
                reason = _NO_DEFAULT_MODEL
                closest = (_MODEL, option.position, runner.namespace, runner.name, reason, option, None, runner)
            continue
        effort = option.effort
        if effort is not None and not runner.offers_effort(model, effort.value):
            if closest is None:
                reason = f"{_EFFORT_NOT_OFFERED}:{model}/{effort.value}"
                closest = (_MODEL, option.position, runner.namespace, runner.name, reason, option, model, runner)
            continue
        allowed.append((option, model))
    if not allowed:
        assert closest is not None  # each option of the runner's provider was allowed or set it
        return closest
    first, model = allowed[0]
    free = (_ELIGIBLE, first.position, runner.namespace, runner.name, "", first, model, runner)
    full = (_CAPACITY, first.position, runner.namespace, runner.name, _NO_FREE_CONCURRENCY, first, model, runner)
    return (key, runner, tuple(option.position for option, _ in allowed), free, full)


def _table_order(entry: Passing) -> tuple[int, str, str]:
    """A passing runner's place in the table: (first allowed position, namespace, name) of its rows."""
    free = entry[3]
    return free[1], free[2], free[3]


def _row_order(row: _Result) -> tuple[int, int, str, str]:
    """(rank, position, namespace, name): unique per runner, so later fields are never compared."""
    return row[0], row[1], row[2], row[3]


class RunnerSet(Sequence[RunnerView]):
    """An immutable sequence of runner views that remembers their static checks per requirement."""

    __slots__ = ("_checks", "_views")

    def __init__(self, views: Sequence[RunnerView]) -> None:
        self._views = tuple(views)
        self._checks: OrderedDict[Requirement, StaticChecks] = OrderedDict()

    def __len__(self) -> int:
        return len(self._views)

    def __iter__(self) -> Iterator[RunnerView]:
        return iter(self._views)

    @overload
    def __getitem__(self, index: int) -> RunnerView: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[RunnerView]: ...
    def __getitem__(self, index: int | slice) -> RunnerView | Sequence[RunnerView]:
        return self._views[index]

    def static_checks(self, requirement: Requirement) -> StaticChecks:
        checks = self._checks.get(requirement)
        if checks is None:
            checks = self._checks[requirement] = build_static_checks(self._views, requirement)
            while len(self._checks) > _KEPT:
                self._checks.popitem(last=False)
        return checks

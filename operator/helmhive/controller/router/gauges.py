"""The router's scrape-time gauges: what :class:`~helmhive.controller.metrics.OperatorState` shows, read on the loop.

The metrics collector does not import the router; the operator's startup registers
:func:`build_state_snapshot` with it (``metrics.STATE.bind(read=...)``).
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import TYPE_CHECKING

from helmhive.controller.metrics import StateSnapshot

if TYPE_CHECKING:
    from helmhive.controller.router.handlers import Router

__all__ = ["build_state_snapshot"]


def build_state_snapshot(router: Router, *, waiting_for_reference: int = 0) -> StateSnapshot:
    """Read the router's indexes, work queue and waiting jobs (call on the event loop).

    ``waiting_for_reference`` is the queue step's count of jobs waiting for a reference.
    """
    pool_providers = {pool.key: pool.provider for store in router.pools.values() for pool in store}
    facts = [runner for store in router.runners.values() for runner in store]
    runners: Tally[tuple[str, str, str, str]] = Tally()
    slots: Tally[str] = Tally()
    busy: Tally[str] = Tally()
    schedulable_keys = []
    provider_of: dict[tuple[str, str], str] = {}
    for runner in facts:
        report = runner.report
        provider = (report.provider if report is not None else None) or pool_providers.get(runner.pool_key) or ""
        control = runner.control_state.value if runner.control_state is not None else "Unknown"
        reported = runner.reported_status.value if runner.reported_status is not None else "Unknown"
        schedulable = runner.schedulable is True
        runners[(provider, control, reported, "true" if schedulable else "false")] += 1
        if schedulable:
            slots[provider] += report.concurrency if report is not None else 1
            schedulable_keys.append(runner.key)
            provider_of[runner.key] = provider
    for key, active in router.active_jobs(schedulable_keys).items():
        busy[provider_of[key]] += active
    providers = frozenset(p for p in [*pool_providers.values(), *(k[0] for k in runners)] if p)
    return StateSnapshot(
        queue_depth=len(router.queued),
        waiting_for_capacity=len(router.waiting),
        waiting_for_reference=waiting_for_reference,
        runners=dict(runners),
        providers=providers,
        slots=dict(slots),
        busy_slots=dict(busy),
    )

"""The router's tunables, its client-side rate limit and its counters.

:class:`RouterSettings` (each from ``HELMHIVE_ROUTING_*`` in the environment), the
:class:`RateLimiter` that paces the router's mutating API calls (it reads an injected monotonic
clock), and :class:`RouterStats` (for logs, the liveness probe and the benchmark). Used by
:mod:`helmhive.controller.router.engine`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from helmhive.policy.routing.route import RoutingPolicy

__all__ = ["RateLimiter", "RouterSettings", "RouterStats"]


@dataclass(frozen=True, kw_only=True)
class RouterSettings:
    """Router tunables; each can be set from the environment (``HELMHIVE_ROUTING_*``)."""

    workers: int = 8
    """Jobs routed concurrently (each worker has at most one write in flight)."""
    qps: float = 200.0
    """Sustained mutating API calls per second (status writes, audit batches, events): a routed job
    costs one status write plus a share of a batch record and of its runner's Event, so the
    default lets a burst be routed at some 180 jobs a second."""
    burst: int = 400
    """Calls allowed at once before the sustained rate applies."""
    retry_seconds: float = 2.0
    """Delay before retrying a job whose write failed for a reason other than a conflict."""
    audit_recovery_seconds: float = 600.0
    """At startup, decisions younger than this are checked for their audit records (a crash may have cut them)."""
    audit_linger_seconds: float = 0.3
    """How long the first queued decision waits for others to share its audit batch (none when idle)."""
    event_interval_seconds: float = 30.0
    """A runner's aggregated ``JobsRouted`` Event is updated at most this often."""
    policy: RoutingPolicy = field(default_factory=RoutingPolicy)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RouterSettings:
        values = os.environ if env is None else env

        def number(name: str, default: float) -> float:
            raw = values.get(name)
            return float(raw) if raw else default

        policy = RoutingPolicy(
            capacity_deadline_seconds=number("HELMHIVE_ROUTING_CAPACITY_DEADLINE_SECONDS", 900.0),
            backoff_initial_seconds=number("HELMHIVE_ROUTING_BACKOFF_INITIAL_SECONDS", 2.0),
            backoff_max_seconds=number("HELMHIVE_ROUTING_BACKOFF_MAX_SECONDS", 60.0),
        )
        return cls(
            workers=max(1, int(number("HELMHIVE_ROUTING_WORKERS", 8))),
            qps=max(0.1, number("HELMHIVE_ROUTING_QPS", 200.0)),
            burst=max(1, int(number("HELMHIVE_ROUTING_BURST", 400))),
            retry_seconds=number("HELMHIVE_ROUTING_RETRY_SECONDS", 2.0),
            audit_linger_seconds=max(0.0, number("HELMHIVE_ROUTING_AUDIT_LINGER_SECONDS", 0.3)),
            event_interval_seconds=max(1.0, number("HELMHIVE_ROUTING_EVENT_INTERVAL_SECONDS", 30.0)),
            policy=policy,
        )


class RateLimiter:
    """A client-side rate limit, a token bucket as client-go's: ``rate`` tokens a second, at most
    ``burst`` saved up. (The runner's egress proxy has a bucket of its own that refuses instead of
    waiting: :class:`helmhive.runner.egress.limits.TokenBucket`.)

    ``take()`` waits for a token; waiters are served in arrival order.
    """

    def __init__(self, *, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.clock = clock
        self.stamp = clock()
        self.lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    async def take(self) -> None:
        async with self.lock:
            self._refill()
            while self.tokens < 1.0:
                await asyncio.sleep((1.0 - self.tokens) / self.rate)
                self._refill()
            self.tokens -= 1.0


@dataclass
class RouterStats:
    """Counters for logs, the liveness probe and the benchmark."""

    decisions: int = 0
    assigned: int = 0
    waiting: int = 0
    failed: int = 0
    conflicts: int = 0
    writes: int = 0

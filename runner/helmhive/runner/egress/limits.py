"""What the egress proxy lets one job do with the provider's API: which paths, how often, how many at once.

The proxy (:mod:`helmhive.runner.egress.proxy`) keeps the key out of the agent, but through it an agent
can spend the key. These bounds make that spending the agent's tools' ordinary use:

- **Paths.** A request for the upstream (the one the credential is added to) must name a path
  beneath one of the allowed prefixes (``egress.allowedPaths``, default per provider:
  :data:`helmhive.api.egress.PROVIDER_EGRESS`), segment by segment (``/v1/messages`` allows
  ``/v1/messages/count_tokens``, not ``/v1/messagesX``). A path with ``.``/``..`` segments, an
  empty segment, a backslash or an encoded ``/``, ``\\`` or ``.`` is refused whatever the prefixes:
  the upstream might normalise it into another path.
- **Rate.** A token bucket per job: ``egress.requestsPerMinute`` refilled continuously, holding at
  most ``egress.burst``; a request that finds it empty is refused (429).
- **Concurrency.** At most ``egress.maxConcurrentRequests`` requests of one job in flight (the
  response streamed to its end); one more is refused (429), never queued.

"Per job" is per listener: each job reaches the proxy on a listener of its own (its UNIX socket in
a network namespace, its own port otherwise), so one job's use never counts against another's.
Everything here is pure but :class:`JobLimiter`'s counters; the clock is injected.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["Admission", "JobLimiter", "LimitRefusal", "PathRefusal", "RequestLimits", "TokenBucket", "decide_path"]

_BAD_PATH = re.compile(r"(^|/)\.{1,2}(/|$)|//|\\|%(2f|5c|2e)", re.IGNORECASE)


class PathRefusal(enum.StrEnum):
    SUSPICIOUS = "path-suspicious"
    """Dot segments, empty segments, backslashes or encoded separators: refused whatever is allowed."""
    NOT_ALLOWED = "path"
    """Not beneath any allowed prefix."""


def decide_path(*, target: str, allowed: Sequence[str]) -> PathRefusal | None:
    """Whether an origin-form target (``/v1/messages?beta=true``) may go to the upstream (pure)."""
    path = target.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/") or _BAD_PATH.search(path):
        return PathRefusal.SUSPICIOUS
    for prefix in allowed:
        base = prefix.rstrip("/")
        if base in ("", path) or path.startswith(base + "/"):
            return None
    return PathRefusal.NOT_ALLOWED


@dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """One job's bounds (from the pool's ``egress``)."""

    requests_per_minute: int
    burst: int
    max_concurrent: int


@dataclass(kw_only=True)
class TokenBucket:
    """``rate`` tokens per second, at most ``capacity``; starts full."""

    rate: float
    capacity: float
    tokens: float = field(default=-1.0)
    at: float | None = None

    def take(self, now: float) -> bool:
        """Take one token at time ``now`` (seconds, monotonic); False if there is none."""
        if self.tokens < 0:
            self.tokens = self.capacity
        if self.at is not None and now > self.at:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now if self.at is None else max(self.at, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class LimitRefusal(enum.StrEnum):
    RATE = "rate"
    """The job's token bucket is empty (``requestsPerMinute``, ``burst``)."""
    CONCURRENCY = "concurrency"
    """The job already has ``maxConcurrentRequests`` requests in flight."""


@dataclass(frozen=True, slots=True)
class Admission:
    """A request let through: release it when its response has ended."""

    limiter: JobLimiter

    def release(self) -> None:
        self.limiter.in_flight -= 1


class JobLimiter:
    """The rate and concurrency of one job's requests (one per listener; the proxy's event loop only)."""

    def __init__(self, limits: RequestLimits, *, clock: Callable[[], float]) -> None:
        self.limits = limits
        self._clock = clock
        self._bucket = TokenBucket(rate=limits.requests_per_minute / 60.0, capacity=float(limits.burst))
        self.in_flight = 0

    def admit(self) -> Admission | LimitRefusal:
        """Count one request in, or say why not (a refused request takes no token)."""
        if self.in_flight >= self.limits.max_concurrent:
            return LimitRefusal.CONCURRENCY
        if not self._bucket.take(self._clock()):
            return LimitRefusal.RATE
        self.in_flight += 1
        return Admission(self)

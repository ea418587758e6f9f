"""Waiting out an unreachable API server: retry with a capped, jittered backoff, for a bounded time.

A runner whose API server is away (restarting, etcd down, the network cut) keeps its running
jobs going; only the calls it makes about them wait. :func:`with_patience` retries one call
while it fails with :class:`~helmhive.runner.kube.Unavailable` (429, 5xx, timeouts, refused or
reset connections) and gives up -- re-raising the last error -- once ``budget_s`` has passed.
Every other error (NotFound, Conflict, Forbidden, Invalid) is an answer and is raised at once.

The delays are "full jitter" (a random fraction of an exponentially growing, capped step), so
runners that lost the same API server do not all come back in the same instant.
:func:`decide_retry_delay` is the pure rule; the caller injects the randomness and the sleep.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from helmhive.policy.backoff import decide_jittered_delay
from helmhive.runner.kube import RunnerKube, Unavailable
from helmhive.runner.logs import fields

__all__ = ["BASE_DELAY_S", "MAX_DELAY_S", "PatientKube", "decide_retry_delay", "with_patience"]

BASE_DELAY_S = 0.5
"""The first retry's step (the delay is a random fraction of it)."""
MAX_DELAY_S = 10.0
"""The step stops doubling here: an API server that is back is seen within about this long."""

T = TypeVar("T")
log = logging.getLogger("helmhive.runner.patience")


def decide_retry_delay(
    *, attempt: int, fraction: float, base_s: float = BASE_DELAY_S, cap_s: float = MAX_DELAY_S
) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): :func:`~helmhive.policy.backoff.decide_jittered_delay`
    with the runner's base and cap (``fraction`` of the doubling step, never below a tenth of it)."""
    return decide_jittered_delay(attempt=attempt, fraction=fraction, base_s=base_s, cap_s=cap_s)


async def with_patience(
    call: Callable[[], Awaitable[T]],
    *,
    budget_s: float,
    what: str,
    context: dict[str, str] | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    rand: Callable[[], float] = random.random,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """``await call()``, retried while it raises :class:`Unavailable`, for at most ``budget_s`` seconds."""
    deadline = monotonic() + budget_s
    attempt = 0
    while True:
        try:
            result = await call()
        except Unavailable as exc:
            delay = decide_retry_delay(attempt=attempt, fraction=rand())
            left = deadline - monotonic()
            if left <= 0:
                log.warning(
                    "the API server stayed unreachable; giving up for now",
                    extra=fields(what=what, attempts=attempt + 1, budgetSeconds=budget_s, **(context or {})),
                )
                raise
            if attempt == 0:
                log.warning(
                    "the API server is unreachable; retrying",
                    extra=fields(what=what, status=exc.status, detail=exc.message[:300], **(context or {})),
                )
            await sleep(min(delay, left))
            attempt += 1
            continue
        if attempt:
            log.info("the API server answered again", extra=fields(what=what, retries=attempt, **(context or {})))
        return result


class PatientKube(RunnerKube):
    """The same API calls, each waiting out an unreachable API server for up to ``budget_s`` seconds.

    What a running job needs (its status, its artifacts, its session binding) goes through this;
    the runner's own loops (Lease, report, watches) do not, as they retry on their own schedule.
    Events stay best effort: one that cannot be posted is dropped at once, never waited for.
    """

    def __init__(self, plain: RunnerKube, *, budget_s: float) -> None:
        super().__init__(plain.api_client, namespace=plain.namespace)
        self.plain = plain
        self.budget_s = budget_s

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        parent = super()._call
        return await with_patience(
            lambda: parent(fn, *args, **kwargs), budget_s=self.budget_s, what=getattr(fn, "__name__", "an API call")
        )

    async def post_event(self, **kwargs: Any) -> bool:
        return await self.plain.post_event(**kwargs)

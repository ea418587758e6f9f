"""Which runners changed since their pool's loop last derived them, and how to wake that loop.

Fed by the watch events :mod:`helmhive.controller.runners.derived` registers (and the job-pod
events of :mod:`helmhive.controller.runners.jobpods`, which only wake). No I/O, no Kopf: plain
dicts and sets, used only on Kopf's event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helmhive.policy.runners.freshness import LeaseView

__all__ = ["PoolKey", "RunnerWakes"]

PoolKey = tuple[str, str]
"""``(namespace, pool name)``."""


class RunnerWakes:
    """Which runners changed since their pool's loop last derived them, and how to wake that loop.

    Fed by watch events: a Runner event marks that runner; a Lease event marks its runner only
    when something besides ``renewTime`` changed (or the Lease went away), or when the runner's
    last derivation found its heartbeat stale (:meth:`wake_on_renewal`): then a renewal is news.
    Plain dicts and sets: everything runs on Kopf's event loop.
    """

    def __init__(self) -> None:
        self._dirty: dict[PoolKey, set[str]] = {}
        self._wake: dict[PoolKey, Callable[[], None]] = {}
        self._pool_of: dict[tuple[str, str], str] = {}
        self._lease_seen: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._on_renewal: set[tuple[str, str]] = set()
        self._on_free_slot: set[tuple[str, str]] = set()

    def attach(self, pool: PoolKey, wake: Callable[[], None]) -> None:
        self._wake[pool] = wake

    def detach(self, pool: PoolKey) -> None:
        self._wake.pop(pool, None)
        self._dirty.pop(pool, None)

    def take(self, pool: PoolKey) -> set[str]:
        """The runners of ``pool`` marked since the last call (and forget them)."""
        return self._dirty.pop(pool, set())

    def mark(self, pool: PoolKey, runner: str) -> None:
        self._dirty.setdefault(pool, set()).add(runner)
        wake = self._wake.get(pool)
        if wake is not None:
            wake()

    def wake(self, pool: PoolKey) -> None:
        """Wake the pool's loop without marking a runner (its warm job pods changed)."""
        wake = self._wake.get(pool)
        if wake is not None:
            wake()

    def mark_all(self) -> None:
        """Mark every known runner (contact with the API server returned: derive them all again)."""
        for (namespace, name), pool in list(self._pool_of.items()):
            self.mark((namespace, pool), name)

    def wake_on_renewal(self, *, namespace: str, name: str) -> None:
        """Mark this runner at its Lease's next renewal (it was derived with a stale heartbeat)."""
        self._on_renewal.add((namespace, name))

    def wake_on_free_slot(self, *, namespace: str, name: str, wanted: bool = True) -> None:
        """Mark this runner when a job stops holding a slot on it (a qualification probe waits for one)."""
        if wanted:
            self._on_free_slot.add((namespace, name))
        else:
            self._on_free_slot.discard((namespace, name))

    def slot_freed(self, runner: tuple[str, str]) -> None:
        """A job stopped holding a slot on ``runner`` (from the AgentJob store)."""
        if runner in self._on_free_slot:
            self._on_free_slot.discard(runner)
            self.touched(runner)

    def touched(self, runner: tuple[str, str]) -> None:
        """Mark ``runner`` (one of its qualification jobs changed), if its pool is known."""
        pool = self._pool_of.get(runner)
        if pool is not None:
            self.mark((runner[0], pool), runner[1])

    def runner_changed(self, *, namespace: str, name: str, pool: str | None) -> None:
        key = (namespace, name)
        previous = self._pool_of.get(key)
        if pool is None:
            self._pool_of.pop(key, None)
            self._lease_seen.pop(key, None)
            self._on_renewal.discard(key)
            self._on_free_slot.discard(key)
        else:
            self._pool_of[key] = pool
            self.mark((namespace, pool), name)
        if previous is not None and previous != pool:
            self.mark((namespace, previous), name)

    def lease_changed(self, *, namespace: str, name: str, view: LeaseView | None) -> None:
        key = (namespace, name)
        if view is None:
            self._lease_seen.pop(key, None)
        else:
            seen = (view.holder, view.duration_seconds, view.digest)
            if self._lease_seen.get(key) == seen and key not in self._on_renewal:
                return  # a renewal: its only news is a later expiry, which the scheduled review covers
            self._lease_seen[key] = seen
        self._on_renewal.discard(key)
        pool = self._pool_of.get(key)
        if pool is not None:
            self.mark((namespace, pool), name)

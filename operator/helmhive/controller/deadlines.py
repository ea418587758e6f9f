"""One scheduler for the whole operator: run an action per object at its next deadline.

Objects that must be looked at again at a moment in time (a job waiting for its Workspace
until its deadline, a memory record at its ``expiresAt``) each hold **one entry** in a
:class:`~helmhive.policy.waiting.DeadlineHeap`; a single asyncio task sleeps until the
earliest entry and runs the actions that are due. That is one task and one heap whatever
the number of objects: no timer, daemon or poll per object. Setting a key again replaces
its entry, so "look at it now" (an event woke it) and "look at it at its deadline" share
the key and the action.

Entries live in memory only. After a restart the handlers that decide an object (Kopf's
resume and initial-listing events) set them again from the objects themselves, and every
deadline is computed from the object (its ``creationTimestamp``, its ``expiresAt``), so a
restart neither loses nor moves one.

:class:`KeyedLocks` serialises the work on one object when an event, a wake-up and a
deadline arrive together.

Actions run concurrently (bounded); one that raises is logged and tried again after
``retry_seconds``, unless something set the key again meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable

from helmhive.policy.waiting import DeadlineHeap

__all__ = ["Action", "DeadlineScheduler", "KeyedLocks"]

Action = Callable[[], Awaitable[None]]
log = logging.getLogger("helmhive.controller.deadlines")


class DeadlineScheduler:
    """A heap of (time, key) with one action per key, driven by one asyncio task (started on first use)."""

    def __init__(
        self,
        *,
        clock: Callable[[], dt.datetime],
        concurrency: int = 8,
        retry_seconds: float = 5.0,
        max_sleep_seconds: float = 60.0,
    ) -> None:
        self._clock = clock
        self._heap: DeadlineHeap[Hashable] = DeadlineHeap()
        self._actions: dict[Hashable, Action] = {}
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(concurrency)
        self._retry = dt.timedelta(seconds=retry_seconds)
        self._max_sleep = max_sleep_seconds
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._heap)

    def when(self, key: Hashable) -> dt.datetime | None:
        """The time ``key`` is due, or None."""
        return self._heap.when(key)

    def at(self, key: Hashable, when: dt.datetime, action: Action) -> None:
        """Run ``action`` at ``when`` (at once if that has passed), replacing ``key``'s entry."""
        self._heap.set(key, when)
        self._actions[key] = action
        self._ensure_started()
        self._wake.set()

    def soon(self, key: Hashable, action: Action) -> None:
        """Run ``action`` as soon as a slot is free, replacing ``key``'s entry."""
        self.at(key, self._clock(), action)

    def cancel(self, key: Hashable) -> None:
        """Drop ``key``'s entry, if any (an action already running finishes)."""
        self._heap.discard(key)
        self._actions.pop(key, None)

    def poke(self) -> None:
        """Re-read the clock now (tests with a clock they move by hand)."""
        self._wake.set()

    async def stop(self) -> None:
        """Cancel the loop and any running action."""
        tasks = [t for t in (self._task, *self._running) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None
        self._running.clear()

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="helmhive-deadlines")

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            now = self._clock()
            for key in self._heap.pop_due(now):
                action = self._actions.pop(key, None)
                if action is not None:
                    task = asyncio.create_task(self._run(key, action))
                    self._running.add(task)
                    task.add_done_callback(self._running.discard)
            upcoming = self._heap.next_at()
            if upcoming is None:
                await self._wake.wait()
                continue
            delay = min(self._max_sleep, max(0.0, (upcoming - self._clock()).total_seconds()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def _run(self, key: Hashable, action: Action) -> None:
        async with self._slots:
            try:
                await action()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("deadline action for %s failed (%s: %s); retrying", key, type(err).__name__, err)
                if key not in self._heap:
                    self.at(key, self._clock() + self._retry, action)


class KeyedLocks:
    """One asyncio lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the block."""
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

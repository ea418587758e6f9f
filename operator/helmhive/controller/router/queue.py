"""The router's work queue: each job key handled by one worker at a time, like client-go's workqueue.

Keys wait in arrival order (:attr:`WorkQueue.queued`, with the trigger that queued them); a key
being handled is in :attr:`WorkQueue.processing`, and an event for it meanwhile marks it
:attr:`WorkQueue.dirty`, so it is handled again once, after the current pass. A ``backoff``
trigger is never downgraded by a later one (it is the attempt whose status is written).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

__all__ = ["WorkQueue"]

JobKey = tuple[str, str]


class WorkQueue:
    """Queued, processing and dirty keys; :meth:`_next` hands a key to a worker, :meth:`_done` takes it back."""

    def __init__(self) -> None:
        # Queued keys in order, keys being processed, keys to redo after processing.
        self.queued: OrderedDict[JobKey, str] = OrderedDict()
        self.processing: set[JobKey] = set()
        self.dirty: dict[JobKey, str] = {}
        self.ready = asyncio.Event()

    def enqueue(self, key: JobKey, trigger: str) -> None:
        if key in self.processing:
            if self.dirty.get(key) != "backoff":
                self.dirty[key] = trigger
            return
        if key in self.queued:
            if trigger == "backoff":
                self.queued[key] = trigger
            return
        self.queued[key] = trigger
        self.ready.set()

    async def _next(self) -> tuple[JobKey, str]:
        while not self.queued:
            self.ready.clear()
            await self.ready.wait()
        key, trigger = self.queued.popitem(last=False)
        self.processing.add(key)
        return key, trigger

    def _done(self, key: JobKey) -> None:
        self.processing.discard(key)
        trigger = self.dirty.pop(key, None)
        if trigger is not None:
            self.enqueue(key, trigger)

    def _later(self, key: JobKey, delay: float, trigger: str) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(max(0.0, delay), self.enqueue, key, trigger)

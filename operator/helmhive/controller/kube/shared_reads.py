"""Reads of one object shared by concurrent callers, never older than each caller's request.

Owns :class:`SharedReads`. The queue step reads a job's Workspace and Profile from the API
server (not from a watch cache: a job created just after its profile changed must bind the new
revision, and a cache may not have seen the change yet). In a burst, every job on one profile
sent its own GET of the same object. Here a caller **joins the next GET that starts after it
asked**, never one already in flight: the answer is at least as new as the API server's state
when the caller asked, which is what its own GET would have guaranteed. While one GET of an
object is in flight, every caller that asks waits for the next one, which then answers them all.

The answer is one dict handed to every caller of that read: callers must not change it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from helmhive.api.kinds import KindDef

__all__ = ["Fetch", "SharedReads"]

Fetch = Callable[[KindDef, str, str], Awaitable[dict[str, Any]]]
"""``(kind, name, namespace)``: one GET of the object (raises ``KubeError``, ``NotFound`` too)."""

_Key = tuple[str, str, str]


def _retrieve(future: asyncio.Future[dict[str, Any]]) -> None:
    # A read whose callers were all cancelled must not log "exception was never retrieved".
    if not future.cancelled():
        future.exception()


class SharedReads:
    """Coalesced GETs of single objects (see the module docstring)."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._next: dict[_Key, asyncio.Future[dict[str, Any]]] = {}
        self._running: set[_Key] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.asked = 0
        """Reads asked for."""
        self.sent = 0
        """GETs sent: ``asked - sent`` were answered by a GET another caller also waited for."""

    async def get(self, kind: KindDef, name: str, namespace: str) -> dict[str, Any]:
        """The object as the API server has it now (a GET that started after this call); raises as the GET does."""
        key: _Key = (kind.plural, namespace, name)
        future = self._next.get(key)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieve)
            self._next[key] = future
            if key not in self._running:
                task = asyncio.create_task(self._run(kind, key), name=f"read {kind.plural} {namespace}/{name}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        self.asked += 1
        # shield: one caller's cancellation must not cancel the read the others wait for.
        return await asyncio.shield(future)

    async def _run(self, kind: KindDef, key: _Key) -> None:
        """Send GETs for ``key`` while callers wait for one; each GET answers those who asked before it started."""
        self._running.add(key)
        future: asyncio.Future[dict[str, Any]] | None = None
        try:
            while (future := self._next.pop(key, None)) is not None:
                self.sent += 1
                try:
                    result = await self._fetch(kind, key[2], key[1])
                except Exception as exc:  # NotFound included: every caller of this read sees it
                    future.set_exception(exc)
                else:
                    future.set_result(result)
        finally:
            self._running.discard(key)
            if future is not None and not future.done():  # cancelled mid-read (the operator stops)
                future.cancel()

    async def close(self) -> None:
        """Cancel the reads in flight (their callers see ``CancelledError``)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for future in self._next.values():
            future.cancel()
        self._next.clear()

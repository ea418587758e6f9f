"""The runner's work items and where they come from: :class:`Job`, :class:`JobSource`, the clock.

Plain types shared by the main loop (:mod:`helmhive.runner.program.main`) and the job sources
(:mod:`helmhive.runner.program.cluster_jobs`); nothing here does I/O.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from helmhive.runner.adapters.base import AgentAdapter, TurnRequest, TurnResult

__all__ = ["Clock", "Job", "JobRun", "JobSource", "SystemClock", "WatchingJobSource"]


class Clock(Protocol):
    def now(self) -> dt.datetime: ...


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


JobRun = Callable[[AgentAdapter, asyncio.Event], Awaitable[TurnResult]]


@dataclass
class Job:
    """One unit of work. ``result`` is set when it ends.

    Either a single turn (``request``, run on the slot's adapter) or a whole job (``run``, given
    the slot's adapter and the cancel event; an AgentJob brings its own sandboxed agent).
    """

    id: str
    request: TurnRequest | None = None
    result: TurnResult | None = None
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    key: str | None = None
    run: JobRun | None = None


class JobSource(Protocol):
    """Where jobs come from. ``take`` waits for one; ``finish`` hands the result back."""

    async def take(self) -> Job: ...

    def finish(self, job: Job) -> None: ...


@runtime_checkable
class WatchingJobSource(JobSource, Protocol):
    """A job source with a watch of its own, started once the runner is registered."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the watch's thread to end (after :meth:`stop`); True once it has."""
        ...

"""The runner's control loop: watch its own Runner, apply the control state, stop the watches.

:class:`ControlLoop` is a part of :class:`~helmhive.runner.program.main.RunnerProcess` (one of its
bases), kept apart as :class:`~helmhive.runner.program.reporting.Reporting` is:

- a watch thread on the runner's own Runner hands each object to the event loop; a change of
  the effective control state (:func:`~helmhive.runner.program.control.decide_control_state`) is
  logged, applied to the running jobs (Disabled and Revoked cancel them, Revoked also ends the
  process) and posted as a ``Control<State>`` Event;
- the Runner deleted sets the process's deregistration (it stops and exits 5);
- :meth:`ControlLoop._stop_watches` stops and joins every watch thread (the Runner's, the job
  source's) before ``run()`` returns: none may outlive it (docs/runners.md, "Stopping").

The attributes it reads are the process's own, declared here for the type checker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from helmhive.api.common import ControlState
from helmhive.runner.config import RunnerConfig
from helmhive.runner.jobs.work import Job, JobSource, WatchingJobSource
from helmhive.runner.kube import WATCH_JOIN_S, KubeError, RunnerKube, WatchThread
from helmhive.runner.program.control import (
    ControlAction,
    decide_control_action,
    decide_control_state,
    read_control_fields,
)

__all__ = ["ControlLoop"]


class ControlLoop:
    """The Runner watch and the control state of one runner process (see the module docstring)."""

    name: str
    config: RunnerConfig
    kube: RunnerKube
    state: ControlState
    jobs: JobSource | None
    _runner: dict[str, Any]
    _active: dict[str, Job]
    _wake_jobs: asyncio.Event
    _revoke: asyncio.Event
    _deregistered: asyncio.Event
    _watch_stop: threading.Event
    _runner_watch: WatchThread | None

    def _log(self, level: int, message: str, **extra: Any) -> None:
        raise NotImplementedError

    async def _event(self, reason: str, message: str, *, warning: bool = False) -> None:
        raise NotImplementedError

    def _start_watch(self) -> None:
        loop = asyncio.get_running_loop()

        def on_object(obj: dict[str, Any] | None) -> None:
            loop.call_soon_threadsafe(self._on_runner, obj)

        def on_error(exc: KubeError) -> None:
            loop.call_soon_threadsafe(
                lambda: self._log(
                    logging.WARNING, "watching the Runner failed; retrying", status=exc.status, detail=exc.message
                )
            )

        self._runner_watch = self.kube.watch_runner(
            self.name,
            on_object=on_object,
            on_error=on_error,
            stop=self._watch_stop,
            timeout_s=self.config.env.watch_round_seconds,
        )

    async def _stop_watches(self) -> None:
        """Stop the watch threads (the Runner's, the job source's) and wait for them to end.

        None may outlive ``run()``: a thread still reading from the API server while the
        interpreter finalizes can crash the process after a clean stop (docs/runners.md,
        "Stopping"). A list in flight cannot be interrupted, hence the bounded wait.
        """
        self._watch_stop.set()
        joins: list[tuple[str, Callable[[float], bool]]] = []
        if self._runner_watch is not None:
            self._runner_watch.stop()
            joins.append((self._runner_watch.name, self._runner_watch.join))
        if isinstance(self.jobs, WatchingJobSource):
            self.jobs.stop()
            joins.append(("jobs", self.jobs.join))

        def join_all() -> list[str]:
            deadline = time.monotonic() + WATCH_JOIN_S
            return [name for name, join in joins if not join(max(0.0, deadline - time.monotonic()))]

        left = await asyncio.to_thread(join_all) if joins else []
        if left:
            self._log(logging.WARNING, "watch threads did not stop in time", threads=left, waitedSeconds=WATCH_JOIN_S)

    def _on_runner(self, obj: dict[str, Any] | None) -> None:
        if obj is None:
            self._log(logging.WARNING, "the Runner was deleted; shutting down to register anew")
            self._deregistered.set()
            return
        self._runner = obj
        state = decide_control_state(view=read_control_fields(obj))
        if state is not self.state:
            previous, self.state = self.state, state
            self._log(logging.INFO, "control state changed", previous=previous.value, state=state.value)
            self._apply_control(initial=False)

    def _apply_control(self, *, initial: bool) -> None:
        action = decide_control_action(state=self.state)
        self._wake_jobs.set()
        if action in (ControlAction.HOLD, ControlAction.REVOKE):
            for job in self._active.values():
                job.cancel.set()
        if action is ControlAction.REVOKE:
            self._revoke.set()
        if not initial or action is not ControlAction.RUN:
            message = {
                ControlAction.RUN: "Active: accepting jobs",
                ControlAction.DRAIN: "Draining: no new jobs; running jobs finish",
                ControlAction.HOLD: "Disabled: no jobs; running jobs cancelled; still registered",
                ControlAction.REVOKE: "Revoked: stopping work, wiping the credential, releasing the Lease",
            }[action]
            task = asyncio.ensure_future(self._event(f"Control{self.state.value}", message))
            task.add_done_callback(lambda t: t.exception())

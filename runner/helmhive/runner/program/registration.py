"""Registration: the runner creates or adopts its Runner object and publishes its report.

- :func:`ensure_runner` GETs ``runners/<name>``; if it is absent it CREATEs it with
  ``spec.poolRef`` (a 409 from a race with the operator means: adopt the one that exists).
- :class:`ReportPublisher` writes ``status.report`` -- and nothing else -- by server-side apply
  as field manager ``helmhive-runner``, and remembers what it wrote and when, which is what
  :func:`helmhive.runner.program.report.decide_report_write` needs.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from helmhive.api.kinds import API_VERSION
from helmhive.api.runner import RunnerReport
from helmhive.runner.kube import Conflict, NotFound, RunnerKube

__all__ = ["POOL_LABEL", "ReportPublisher", "build_runner", "ensure_runner"]

POOL_LABEL = "helmhive.dev/pool"


def build_runner(*, name: str, pool: str) -> dict[str, Any]:
    """A new Runner object for this runner, as the runner creates it (control state left to admins)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Runner",
        "metadata": {
            "name": name,
            "labels": {POOL_LABEL: pool, "app.kubernetes.io/name": "helmhive-runner"},
        },
        "spec": {"poolRef": {"name": pool}},
    }


async def ensure_runner(*, kube: RunnerKube, name: str, pool: str) -> tuple[dict[str, Any], bool]:
    """Return the runner's Runner object and whether this call created it."""
    try:
        return await kube.get_runner(name), False
    except NotFound:
        pass
    try:
        return await kube.create_runner(build_runner(name=name, pool=pool)), True
    except Conflict:
        return await kube.get_runner(name), False


class ReportPublisher:
    """Writes ``status.report`` by server-side apply and remembers the last write."""

    def __init__(self, *, kube: RunnerKube, name: str) -> None:
        self._kube = kube
        self._name = name
        self.last_report: RunnerReport | None = None
        self.last_written_at: dt.datetime | None = None
        self.writes = 0

    async def publish(self, report: RunnerReport, *, now: dt.datetime) -> dict[str, Any]:
        result = await self._kube.apply_runner_status(self._name, {"report": report.to_wire()})
        self.last_report = report
        self.last_written_at = now
        self.writes += 1
        return result

"""Simulated runners for ``bench_runners.py``: N runners on one event loop, each writing as its own Pod.

Each runner writes exactly what ``docs/runners.md`` says a runner writes, with a TokenRequest
token bound to its own Pod: it creates its Runner, applies its report (field manager
``helmhive-runner``) and renews its Lease by server-side apply. ``baseline`` makes every
runner also write its report on every heartbeat; a runner named in ``dead`` stops renewing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from helmhive.api.runner import REPORT_DIGEST_ANNOTATION, RunnerReport, build_report_digest

__all__ = ["Fleet", "SimRunner", "Tally", "leases_path", "micro_time", "runners_path"]

APPLY = {"Content-Type": "application/apply-patch+yaml"}
APPLY_PARAMS = {"fieldManager": "helmhive-runner", "force": "true"}


def runners_path(namespace: str) -> str:
    return f"/apis/helmhive.dev/v1alpha1/namespaces/{namespace}/runners"


def leases_path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def micro_time(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class SimRunner:
    name: str
    pool: str
    token: str
    registered_at: str = field(default_factory=lambda: micro_time(dt.datetime.now(dt.UTC)))
    last_renewal: float = 0.0  # wall clock
    last_report: float = 0.0  # monotonic
    verified_at: str = field(default_factory=lambda: micro_time(dt.datetime.now(dt.UTC)))
    digest: str | None = None  # what the Lease carries: the last report's digest, as a runner's does


@dataclass
class Tally:
    """What the simulated runners sent."""

    lease: int = 0
    report: int = 0
    lease_bytes: int = 0
    report_bytes: int = 0
    errors: Counter[int] = field(default_factory=Counter)


class Fleet:
    """N simulated runners on one event loop, each writing as its own Pod."""

    def __init__(self, http: httpx.AsyncClient, namespace: str, *, renew: float, lease: int, refresh: float) -> None:
        self.http, self.renew_s, self.lease_s, self.refresh_s = http, renew, lease, refresh
        self.runners_path, self.leases_path = runners_path(namespace), leases_path(namespace)
        self.tally = Tally()
        self.baseline = False
        self.dead: set[str] = set()
        self.stop = asyncio.Event()

    async def _send(self, method: str, url: str, runner: SimRunner, body: dict[str, Any], **kw: Any) -> int:
        data = json.dumps(body)
        headers = {"Authorization": f"Bearer {runner.token}", **kw.pop("headers", {})}
        response = await self.http.request(method, url, content=data, headers=headers, **kw)
        if response.status_code >= 300 and response.status_code != 409:
            self.tally.errors[response.status_code] += 1
        return len(data)

    async def report(self, runner: SimRunner) -> None:
        report = {
            "provider": "anthropic",
            "adapter": {"type": "claude-cli", "name": "claude", "version": "2.0.14"},
            "authentication": {"state": "Authenticated", "reason": "SessionCreated", "verifiedAt": runner.verified_at},
            "placementLabels": {"domain": "code", "region": "eu"},
            "capabilities": ["structured-output", "diff-review", "workspace-write"],
            "concurrency": 2,
            "activeJobs": 0,
            "environmentFingerprint": "sha256:" + "ab" * 32,
            "catalogue": {
                "models": [{"id": m, "efforts": ["low", "medium", "high"]} for m in ("opus-4", "sonnet-4-5", "haiku")],
                "default": "sonnet-4-5",
            },
            "credentialGeneration": 1,
            "podName": runner.name,
            "reportedAt": micro_time(dt.datetime.now(dt.UTC)),
            "registeredAt": runner.registered_at,
        }
        await self.publish(runner, report)

    async def publish(self, runner: SimRunner, report: dict[str, Any]) -> None:
        """Write ``report`` as the runner's status.report and remember its digest for the Lease."""
        body = {"apiVersion": "helmhive.dev/v1alpha1", "kind": "Runner", "metadata": {"name": runner.name},
                "status": {"report": report}}  # fmt: skip
        url = f"{self.runners_path}/{runner.name}/status"
        self.tally.report_bytes += await self._send("PATCH", url, runner, body, params=APPLY_PARAMS, headers=APPLY)
        self.tally.report += 1
        runner.last_report = time.monotonic()
        runner.digest = build_report_digest(RunnerReport.model_validate(report))

    async def renew(self, runner: SimRunner) -> None:
        now = dt.datetime.now(dt.UTC)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": runner.name,
                "labels": {"helmhive.dev/runner": runner.name},
                "annotations": {REPORT_DIGEST_ANNOTATION: runner.digest} if runner.digest else {},
            },
            "spec": {"holderIdentity": runner.name, "leaseDurationSeconds": self.lease_s, "renewTime": micro_time(now)},
        }
        url = f"{self.leases_path}/{runner.name}"
        self.tally.lease_bytes += await self._send("PATCH", url, runner, body, params=APPLY_PARAMS, headers=APPLY)
        self.tally.lease += 1
        runner.last_renewal = now.timestamp()

    async def register(self, runner: SimRunner) -> None:
        body = {"apiVersion": "helmhive.dev/v1alpha1", "kind": "Runner", "metadata": {"name": runner.name},
                "spec": {"poolRef": {"name": runner.pool}}}  # fmt: skip
        await self._send("POST", self.runners_path, runner, body, headers={"Content-Type": "application/json"})
        await self.report(runner)
        await self.renew(runner)

    async def run(self, runner: SimRunner) -> None:
        next_beat = time.monotonic() + random.uniform(0, self.renew_s)
        while not self.stop.is_set():
            await asyncio.sleep(max(0.0, next_beat - time.monotonic()))
            next_beat += self.renew_s
            if runner.name in self.dead:
                return
            with contextlib.suppress(httpx.HTTPError):
                await self.renew(runner)
                if self.baseline or time.monotonic() - runner.last_report >= self.refresh_s:
                    await self.report(runner)

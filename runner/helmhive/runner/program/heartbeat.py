"""The runner's liveness: one ``coordination.k8s.io/v1`` Lease, renewed every few seconds.

The Lease is named like the runner (= its pod), labelled ``helmhive.dev/runner: <name>``, held by
``<name>``, with ``leaseDurationSeconds`` from the pool's heartbeat settings. A renewal is one
conditional PUT of a small object; the Runner's status is never touched by a heartbeat
(KEP-589). Every renewal carries the annotation ``helmhive.dev/report-digest``: the digest of
the catalogue and authentication the runner holds right now, so each heartbeat publishes them
in 80 bytes and the operator can tell a stale report. On SIGTERM or revocation the Lease is
deleted, so the operator sees the runner Offline at once instead of after the lease expires.

:func:`build_lease` is pure; :class:`LeaseKeeper` does the I/O through :class:`RunnerKube`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from helmhive.api.runner import REPORT_DIGEST_ANNOTATION
from helmhive.runner.kube import Conflict, NotFound, RunnerKube

__all__ = ["RUNNER_LABEL", "LeaseKeeper", "build_lease", "micro_time"]

RUNNER_LABEL = "helmhive.dev/runner"


def micro_time(moment: dt.datetime) -> str:
    """RFC 3339 with microseconds in UTC, as ``metav1.MicroTime`` is written."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_lease(
    *,
    name: str,
    duration_s: int,
    acquired_at: dt.datetime,
    now: dt.datetime,
    transitions: int = 0,
    resource_version: str | None = None,
    digest: str | None = None,
) -> dict[str, Any]:
    """The runner's Lease as the API server stores it; ``digest`` (None before the first report) is annotated."""
    metadata: dict[str, Any] = {"name": name, "labels": {RUNNER_LABEL: name}}
    if digest is not None:
        metadata["annotations"] = {REPORT_DIGEST_ANNOTATION: digest}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": duration_s,
            "acquireTime": micro_time(acquired_at),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        },
    }


class LeaseKeeper:
    """Acquires, renews and releases the runner's Lease. Counts its writes for the logs.

    ``digest`` is what the next write annotates; the runner sets it after each report it builds.
    """

    def __init__(self, *, kube: RunnerKube, name: str, duration_s: int) -> None:
        self._kube = kube
        self._name = name
        self._duration_s = duration_s
        self._acquired_at: dt.datetime | None = None
        self._transitions = 0
        self._resource_version: str | None = None
        self.writes = 0
        self.last_renewed_at: dt.datetime | None = None
        self.digest: str | None = None
        self.written_digest: str | None = None
        self._lock = asyncio.Lock()  # the renew loop and a new digest may write at once

    async def acquire(self, *, now: dt.datetime) -> None:
        """Take the Lease: create it, or take over the one a previous process of this runner left."""
        async with self._lock:
            await self._acquire(now=now)

    async def _acquire(self, *, now: dt.datetime) -> None:
        self._acquired_at = now
        try:
            current = await self._kube.get_lease(self._name)
        except NotFound:
            digest = self.digest
            body = build_lease(name=self._name, duration_s=self._duration_s, acquired_at=now, now=now, digest=digest)
            created = await self._kube.create_lease(body)
            self._remember(created, now, digest)
            return
        spec = current.get("spec") or {}
        self._transitions = int(spec.get("leaseTransitions") or 0) + 1
        await self._put(now=now, resource_version=current["metadata"].get("resourceVersion"))

    async def renew(self, *, now: dt.datetime) -> None:
        """Move ``renewTime`` to ``now``. A stale version is re-read once; a deleted Lease is re-created."""
        async with self._lock:
            if self._acquired_at is None:
                await self._acquire(now=now)
                return
            try:
                await self._put(now=now, resource_version=self._resource_version)
            except Conflict:
                current = await self._kube.get_lease(self._name)
                await self._put(now=now, resource_version=current["metadata"].get("resourceVersion"))
            except NotFound:
                await self._acquire(now=now)

    async def release(self) -> bool:
        """Delete the Lease; True if it existed."""
        async with self._lock:
            self._acquired_at = None
            return await self._kube.delete_lease(self._name)

    async def _put(self, *, now: dt.datetime, resource_version: str | None) -> None:
        assert self._acquired_at is not None
        digest = self.digest
        body = build_lease(
            name=self._name,
            duration_s=self._duration_s,
            acquired_at=self._acquired_at,
            now=now,
            transitions=self._transitions,
            resource_version=resource_version,
            digest=digest,
        )
        self._remember(await self._kube.replace_lease(self._name, body), now, digest)

    def _remember(self, lease: dict[str, Any], now: dt.datetime, digest: str | None) -> None:
        self._resource_version = (lease.get("metadata") or {}).get("resourceVersion")
        self.writes += 1
        self.last_renewed_at = now
        self.written_digest = digest

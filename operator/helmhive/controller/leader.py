"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Owns: :class:`LeaderConfig` (the ``--leader-election*`` flags), the pure decision
:func:`decide_lease` and :class:`LeaderElector`, which acquires, renews and releases the Lease.
``docs/ha.md`` explains why a Lease rather than Kopf's peering, and what the bound is.

The rules are client-go's ``leaderelection`` package's:

* A candidate takes the Lease when it does not exist, when its holder is empty (released), or
  when the Lease record has not changed for ``leaseDurationSeconds`` *as measured on the
  candidate's own monotonic clock* since it first saw that record (so clocks need not agree).
* The leader renews every ``retry_period``; if no renewal succeeds for ``renew_deadline`` it has
  lost leadership and must stop acting at once (the operator exits; the pod restarts).
* Every write carries the read ``resourceVersion``, so of two candidates only one wins.
* On a graceful stop the leader releases the Lease (empty holder, duration 1 s), so a standby
  takes over at its next retry instead of waiting out the lease.

The elector talks to the API server through the operator's door (:class:`~helmhive.controller.kube.door.Kube`)
on its own connection and its own thread, so a burst of routing calls queued on the operator's
shared thread pool can never delay a renewal.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from helmhive.controller.kube.door import Conflict, Kube, NotFound

__all__ = [
    "DEFAULT_LEASE_NAME",
    "LeaderConfig",
    "LeaderElector",
    "LeaseAction",
    "LeaseRecord",
    "build_identity",
    "build_lease_record",
    "decide_lease",
]

log = logging.getLogger("helmhive.leader")

DEFAULT_LEASE_NAME = "helmhive-operator"
_REQUEST_TIMEOUT = (2.0, 5.0)  # connect, read: one hung call may not eat the renew deadline
_JITTER = 1.2  # client-go's JitterFactor for the candidate's retries
_LEASE_API = "coordination.k8s.io/v1"


@dataclass(frozen=True, kw_only=True)
class LeaderConfig:
    """Leader-election settings: client-go's defaults (15 s lease, 10 s renew deadline, 2 s retry)."""

    enabled: bool = False
    namespace: str = "helmhive-system"
    lease_name: str = DEFAULT_LEASE_NAME
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    @property
    def takeover_bound(self) -> float:
        """Seconds from the leader's last renewal until a standby holds the Lease, at worst."""
        return self.lease_duration + self.retry_period * _JITTER


def build_identity(*, pod_name: str | None, hostname: str, token: str) -> str:
    """``<pod name or host name>_<random>``: unique per process, readable in ``kubectl get lease``."""
    return f"{pod_name or hostname}_{token}"


def default_identity() -> str:
    """The identity of this process: ``$POD_NAME`` (or the host name) and 8 random hex digits."""
    return build_identity(
        pod_name=os.environ.get("POD_NAME"), hostname=socket.gethostname(), token=secrets.token_hex(4)
    )


@dataclass(frozen=True, kw_only=True)
class LeaseRecord:
    """What the candidate reads from the Lease."""

    holder: str | None
    duration_seconds: int | None
    acquire_time: str | None
    transitions: int
    resource_version: str


def build_lease_record(lease: dict[str, Any]) -> LeaseRecord:
    """The candidate's view of a Lease as the API server sent it (``acquireTime`` kept in MicroTime form)."""
    spec = lease.get("spec") or {}
    acquire = spec.get("acquireTime")
    if isinstance(acquire, str) and acquire:
        acquire = _micro_time(dt.datetime.fromisoformat(acquire))
    return LeaseRecord(
        holder=spec.get("holderIdentity"),
        duration_seconds=spec.get("leaseDurationSeconds"),
        acquire_time=acquire or None,
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str(lease["metadata"]["resourceVersion"]),
    )


class LeaseAction(StrEnum):
    CREATE = "create"
    ACQUIRE = "acquire"
    RENEW = "renew"
    WAIT = "wait"


def decide_lease(
    *, record: LeaseRecord | None, identity: str, observed_at: float, now: float, default_duration: float
) -> LeaseAction:
    """What a candidate does next; ``observed_at`` is when (monotonic) it first saw this ``record``."""
    if record is None:
        return LeaseAction.CREATE
    if record.holder == identity:
        return LeaseAction.RENEW
    if not record.holder:
        return LeaseAction.ACQUIRE
    duration = record.duration_seconds or default_duration
    if observed_at + duration > now:
        return LeaseAction.WAIT
    return LeaseAction.ACQUIRE


def _micro_time(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire, hold and release one Lease for this process."""

    def __init__(
        self,
        config: LeaderConfig,
        api_client: Any,
        *,
        on_change: Callable[[bool], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.identity = config.identity or default_identity()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leader-election")
        self.kube = Kube(api_client, executor=self._executor, request_timeout=_REQUEST_TIMEOUT)
        self.on_change = on_change
        self.monotonic = monotonic
        self.is_leader = False
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self._last_renewal = 0.0
        self.holder: str | None = None
        """The holder this process last read or wrote."""

    def _set_leader(self, leader: bool) -> None:
        if leader != self.is_leader:
            self.is_leader = leader
            if self.on_change is not None:
                self.on_change(leader)

    def _body(self, *, record: LeaseRecord | None, acquire: bool, release: bool = False) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        transitions = record.transitions if record is not None else 0
        if acquire and record is not None and record.holder:
            transitions += 1
        acquired = _micro_time(now) if acquire or record is None else record.acquire_time
        body: dict[str, Any] = {
            "apiVersion": _LEASE_API,
            "kind": "Lease",
            "metadata": {
                "name": self.config.lease_name,
                "namespace": self.config.namespace,
                "labels": {"app.kubernetes.io/name": "helmhive", "app.kubernetes.io/component": "operator"},
            },
            "spec": {
                "holderIdentity": None if release else self.identity,
                "leaseDurationSeconds": 1 if release else round(self.config.lease_duration),
                "acquireTime": acquired,
                "renewTime": _micro_time(now),
                "leaseTransitions": transitions,
            },
        }
        if record is not None:
            body["metadata"]["resourceVersion"] = record.resource_version
        return body

    async def _read(self) -> LeaseRecord | None:
        try:
            lease = await self.kube.read_object(_LEASE_API, "Lease", self.config.lease_name, self.config.namespace)
        except NotFound:
            return None
        return build_lease_record(lease)

    async def try_acquire_or_renew(self) -> bool:
        """One round of client-go's ``tryAcquireOrRenew``; True if this process holds the Lease after it."""
        record = await self._read()
        self.holder = record.holder if record is not None else None
        now = self.monotonic()
        if record is not None and record.resource_version != self._observed_version:
            self._observed_version, self._observed_at = record.resource_version, now
        action = decide_lease(
            record=record,
            identity=self.identity,
            observed_at=self._observed_at,
            now=now,
            default_duration=self.config.lease_duration,
        )
        if action is LeaseAction.WAIT:
            return False
        body = self._body(record=record, acquire=action is not LeaseAction.RENEW)
        try:
            if record is None:
                written = await self.kube.create_object(body)
            else:
                written = await self.kube.replace_object(body)
        except Conflict:
            return False  # another candidate wrote first
        self._observed_version, self._observed_at = written["metadata"]["resourceVersion"], self.monotonic()
        self.holder = self.identity
        if action is not LeaseAction.RENEW:
            log.info(
                "leader election: %s acquired Lease %s/%s (previous holder %s)",
                self.identity,
                self.config.namespace,
                self.config.lease_name,
                record.holder if record is not None and record.holder else "none",
            )
        return True

    async def acquire(self) -> None:
        """Return once this process holds the Lease (retrying every ``retry_period``, with jitter)."""
        log.info(
            "leader election: %s is a candidate for Lease %s/%s",
            self.identity,
            self.config.namespace,
            self.config.lease_name,
        )
        while True:
            try:
                if await self.try_acquire_or_renew():
                    self._last_renewal = self.monotonic()
                    self._set_leader(True)
                    return
            except Exception as err:  # the API server may be briefly away; a candidate just retries
                log.warning("leader election: could not read or write the Lease: %s", err)
            await asyncio.sleep(self.config.retry_period * random.uniform(1.0, _JITTER))

    async def hold(self) -> None:
        """Renew every ``retry_period``; return when no renewal succeeded for ``renew_deadline`` (lost)."""
        while True:
            await asyncio.sleep(self.config.retry_period)
            try:
                if await self.try_acquire_or_renew():
                    self._last_renewal = self.monotonic()
                    continue
                if self.holder and self.holder != self.identity:
                    log.error("leader election: the Lease is held by %s now", self.holder)
                    break
            except Exception as err:
                log.warning("leader election: renewal failed: %s", err)
            if self.monotonic() - self._last_renewal > self.config.renew_deadline:
                log.error("leader election: no renewal for %.0f s", self.config.renew_deadline)
                break
        self._set_leader(False)

    async def release(self) -> None:
        """Give the Lease up (if held), so a standby takes over at its next retry."""
        if not self.is_leader:
            return
        self._set_leader(False)
        try:
            record = await self._read()
            if record is not None and record.holder == self.identity:
                body = self._body(record=record, acquire=False, release=True)
                await self.kube.replace_object(body)
                log.info("leader election: %s released the Lease", self.identity)
        except Exception as err:
            log.warning("leader election: could not release the Lease (it expires instead): %s", err)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

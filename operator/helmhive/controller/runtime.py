"""What every handler needs, injected once: the API wrapper, the clock, the settings and the scheduler.

Handlers take these from a :class:`Runtime` rather than from globals, so tests build one
against the real test cluster with a clock they control. The one
:class:`~helmhive.controller.deadlines.DeadlineScheduler` of the process reads the same clock.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from helmhive.api.kinds import KindDef
from helmhive.controller.deadlines import DeadlineScheduler
from helmhive.controller.job_store_sync import JobStoreSync
from helmhive.controller.kube.contact import ApiContact
from helmhive.controller.kube.door import Kube, KubeError
from helmhive.controller.kube.shared_reads import SharedReads
from helmhive.policy.agentjob.failed import DEFAULT_RETRY_WINDOW
from helmhive.policy.runners.pool import ClusterNetwork
from helmhive.policy.waiting import DEFAULT_REFERENCE_WAIT

__all__ = ["Clock", "JobEvents", "JobObserver", "OperatorConfig", "Runtime", "utc_now"]

log = logging.getLogger("helmhive.controller.jobs.queueing")

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    """The real clock: an aware UTC datetime."""
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    """Operator settings, from flags or environment."""

    namespace: str = "helmhive-system"
    service_account: str = "helmhive-operator"
    liveness_port: int = 8080
    audit_max_age_days: int = 90
    audit_max_records: int = 10000
    # Runner pools: a Lease older than its duration plus this grace means Offline.
    runner_grace_seconds: float = 2.0
    # The least time between two passes of a pool's loop (it wakes on events and deadlines, not a tick).
    runner_tick_seconds: float = 1.0
    # How often each pool re-reads its credential Secret, and re-applies its objects to undo drift.
    credential_check_seconds: float = 5.0
    # Every resync re-applies each runner pod's sessions Secret: O(runners) writes, so rarely.
    objects_resync_seconds: float = 600.0
    revision_history_limit: int = 10
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_host: str = "127.0.0.1"
    webhooks_enabled: bool = True
    # Prometheus ``/metrics`` (helmhive.controller.metrics); port 0 serves none.
    metrics_addr: str = "0.0.0.0"
    metrics_port: int = 9090
    # How long after its creation a job or memory record waits for a Workspace or Profile that does
    # not exist yet (``WaitingForWorkspace``/``WaitingForProfile``) before it fails closed.
    reference_wait_seconds: float = DEFAULT_REFERENCE_WAIT.total_seconds()
    # A job its runner ended with a retryable failure is re-run only if it failed this recently
    # (so an operator started after an upgrade does not re-run last week's failures).
    retry_window_seconds: float = DEFAULT_RETRY_WINDOW.total_seconds()
    # The cluster's pod networks, excepted from every runner pool's HTTPS egress (empty: none,
    # HTTPS to any address). Parsed and checked by ``parse_cluster_cidrs`` before it gets here.
    runner_cluster_cidrs: tuple[ClusterNetwork, ...] = ()

    @property
    def reference_wait(self) -> dt.timedelta:
        """``reference_wait_seconds`` as a duration."""
        return dt.timedelta(seconds=self.reference_wait_seconds)

    @property
    def retry_window(self) -> dt.timedelta:
        """``retry_window_seconds`` as a duration."""
        return dt.timedelta(seconds=self.retry_window_seconds)

    @property
    def username(self) -> str:
        """The operator's own user name as the API server reports it."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


JobObserver = Callable[[str | None, Mapping[str, Any]], Awaitable[None]]
"""Takes one AgentJob watch event: (its type, None for the initial listing; the job)."""


class JobEvents:
    """The operator's steps that react to AgentJob events, called in the order they subscribed.

    The operator's own AgentJob watch (:mod:`helmhive.controller.jobs.watch`; Kopf does not watch
    AgentJobs) calls :meth:`dispatch` for every event, one job's events one at a time and in
    order. A step that raises is logged and does not stop the others.
    """

    def __init__(self) -> None:
        self.observers: list[tuple[str, JobObserver]] = []

    def subscribe(self, name: str, observer: JobObserver) -> None:
        self.observers.append((name, observer))

    async def dispatch(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        for name, observer in self.observers:
            try:
                await observer(event_type, body)
            except KubeError as exc:  # the API refused or was away: the job's next event tries again
                meta = body.get("metadata") or {}
                log.warning(
                    "agentjob %s/%s: step %s failed on the API: %s",
                    meta.get("namespace"),
                    meta.get("name"),
                    name,
                    exc,
                )
            except Exception:
                meta = body.get("metadata") or {}
                log.exception("agentjob %s/%s: step %s failed", meta.get("namespace"), meta.get("name"), name)


@dataclass(kw_only=True)
class Runtime:
    kube: Kube
    clock: Clock = utc_now
    config: OperatorConfig = field(default_factory=OperatorConfig)
    deadlines: DeadlineScheduler = field(init=False)
    reads: SharedReads = field(init=False)
    """Single-object GETs shared by concurrent callers (the queue step's Workspace and Profile reads)."""
    job_events: JobEvents = field(default_factory=JobEvents)
    job_store: JobStoreSync = field(default_factory=JobStoreSync)
    """The operator's AgentJob store (jobs by runner, implementations by change), filled by the AgentJob watch."""
    contact: ApiContact = field(default_factory=ApiContact)
    """Contact with the API server since the process started (the heartbeat hold's clock)."""
    slot_waited_for: Callable[[tuple[str, str]], bool] = field(default=lambda _runner: False)
    """Whether a user job waits for a free slot on a runner (set by the router): qualification leaves it that slot."""
    slots_held: Callable[[tuple[str, str]], int] | None = None
    """The slots of a runner held, with the router's in-flight assignments (set by the router; None: the store's)."""

    def __post_init__(self) -> None:
        self.deadlines = DeadlineScheduler(clock=self.now)
        self.reads = SharedReads(self._get)

    async def _get(self, kind: KindDef, name: str, namespace: str) -> dict[str, Any]:
        return await self.kube.get(kind, name, namespace=namespace)  # ``kube`` read per call: tests may swap it

    def now(self) -> dt.datetime:
        """The injected clock, read when called (so a test may swap ``clock`` later)."""
        return self.clock()

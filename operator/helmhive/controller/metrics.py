"""The operator's Prometheus metrics: every one is defined here, and ``/metrics`` is served from here.

Owns: the metric objects (in the operator's own :data:`REGISTRY`, with the standard process,
platform and garbage-collector metrics), the small ``record_*``/``observe_*`` helpers the
handlers call at the moment something happens, a collector that reads the router's and the
queue step's in-memory state when Prometheus scrapes, and :func:`serve_metrics`.

Must not: put an object's name, a message or any other free text into a label. Every label
value is a fixed name (a :class:`~helmhive.api.reasons.Reason`, a job kind, a route outcome, a
control state, an API verb or kind) or a provider name (bounded by the RunnerPools an
administrator writes). ``docs/observability.md`` lists every metric, and a unit test keeps the
two in step.

Gauges derived from indexes (runners by state, queue depth) are computed at scrape time on the
operator's event loop, so the handlers pay nothing for them and a scrape never iterates a
mapping while the loop changes it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import logging
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from helmhive.api.common import JobKind
from helmhive.api.kubeerrors import KubeError
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.kube import hooks as door_hooks
from helmhive.metricdefs import Catalogue, serve_registry
from helmhive.policy.agentjob.life import AgentJob

__all__ = [
    "API_WRITES",
    "CATALOGUE",
    "JOBS_FINISHED",
    "JOBS_ROUTED",
    "JOB_DURATION",
    "LEADER",
    "LEADERSHIP",
    "QUEUE_TO_ASSIGNED",
    "REGISTRY",
    "ROUTING_DECISION",
    "STATE",
    "OperatorState",
    "StateSnapshot",
    "observe_assigned",
    "record_api_write",
    "record_job_finished",
    "record_queue_decision",
    "serve_metrics",
]

log = logging.getLogger("helmhive.metrics")

CATALOGUE = Catalogue()
"""Every metric the operator defines (``docs/observability.md`` lists exactly these)."""
REGISTRY = CATALOGUE.registry
"""The operator's registry: Helmhive's metrics plus the standard ``process_*`` and ``python_*`` ones."""

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_DECISION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_JOB_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0)

OTHER_REASON = "Other"
"""The ``reason`` label of a reason that is not one of Helmhive's fixed names (never free text)."""
WAITING_FOR_REFERENCE = "WaitingForReference"
"""The ``outcome`` label of a job that waits for its Workspace or Profile at queue time."""

# -- counters and histograms (updated where things happen) --------------------------------------

JOBS_ROUTED = CATALOGUE.counter(
    "helmhive_jobs_routed_total",
    "Routing decisions written to AgentJobs, by outcome (Assigned, WaitingForCapacity, "
    "WaitingForReference, Failed) and fixed reason. Failed means the job failed closed.",
    ["outcome", "reason"],
)
ROUTING_DECISION = CATALOGUE.histogram(
    "helmhive_routing_decision_duration_seconds",
    "Time the router spends deciding one job (runner views, active jobs, decide_route), under its lock.",
    buckets=_DECISION_BUCKETS,
)
QUEUE_TO_ASSIGNED = CATALOGUE.histogram(
    "helmhive_job_queue_to_assigned_seconds",
    "From an AgentJob's creationTimestamp (1 s resolution) to its assignment being written.",
    ["job_kind", "provider"],
    buckets=_LATENCY_BUCKETS,
)
API_WRITES = CATALOGUE.counter(
    "helmhive_api_writes_total",
    "Writes the operator sent to the Kubernetes API through its API wrapper, by kind, verb, "
    "subresource and result (Success or the error class). Kopf's own bookkeeping patches are not counted.",
    ["kind", "verb", "subresource", "result"],
)
JOBS_FINISHED = CATALOGUE.counter(
    "helmhive_jobs_finished_total",
    "AgentJobs seen to finish while they held a runner slot, by job kind, provider, outcome and fixed reason.",
    ["job_kind", "provider", "outcome", "reason"],
)
JOB_DURATION = CATALOGUE.histogram(
    "helmhive_job_duration_seconds",
    "Run time of finished AgentJobs that started (status.result.startedAt to completedAt, 1 s resolution).",
    ["job_kind", "provider", "outcome"],
    buckets=_JOB_BUCKETS,
)

# -- gauges (computed at scrape time by OperatorState) --------------------------------------------

QUEUE_DEPTH = CATALOGUE.gauge(
    "helmhive_routing_queue_depth", "AgentJobs in the router's work queue, waiting for a routing decision."
)
WAITING_CAPACITY = CATALOGUE.gauge(
    "helmhive_jobs_waiting_for_capacity",
    "AgentJobs whose last routing decision was WaitingForCapacity (every eligible runner is full).",
)
WAITING_REFERENCE = CATALOGUE.gauge(
    "helmhive_jobs_waiting_for_reference",
    "AgentJobs waiting at queue time for a Workspace or Profile that does not exist yet.",
)
RUNNERS = CATALOGUE.gauge(
    "helmhive_runners",
    "Runners by provider, effective control state, reported status and schedulability (true or false).",
    ["provider", "control_state", "reported_status", "schedulable"],
)
SCHEDULABLE_RUNNERS = CATALOGUE.gauge(
    "helmhive_schedulable_runners",
    "Schedulable runners per provider; 0 for a provider that has pools or runners but none schedulable.",
    ["provider"],
)
SCHEDULABLE_SLOTS = CATALOGUE.gauge(
    "helmhive_schedulable_slots", "Job slots (concurrency) of schedulable runners, per provider.", ["provider"]
)
SCHEDULABLE_SLOTS_BUSY = CATALOGUE.gauge(
    "helmhive_schedulable_slots_busy",
    "Slots of schedulable runners held by assigned, unfinished jobs, per provider.",
    ["provider"],
)
LEADER = CATALOGUE.gauge(
    "helmhive_operator_leader",
    "1 while this operator process acts (it holds the leader Lease, or runs without leader election), else 0.",
)


def _reason_label(raw: Any) -> str:
    """A fixed reason name for a label: the part before any ``:detail``, if it is one of ours."""
    base = str(raw or "").split(":", 1)[0]
    try:
        return Reason(base).value
    except ValueError:
        return OTHER_REASON


def _job_kind_label(raw: Any) -> str:
    try:
        return JobKind(str(raw)).value
    except ValueError:
        return "unknown"


def _parse_time(raw: Any) -> dt.datetime | None:
    if not raw:
        return None
    try:
        parsed = dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def record_queue_decision(*, reason: Reason, waiting: bool) -> None:
    """The queue step wrote ``Routed=False``: waiting for a Workspace or Profile, or failed closed."""
    JOBS_ROUTED.labels(WAITING_FOR_REFERENCE if waiting else "Failed", _reason_label(reason)).inc()


def observe_assigned(body: Mapping[str, Any], *, job_kind: str, provider: str, now: dt.datetime) -> None:
    """An assignment was written to ``body`` (the job as the API server returned it) at ``now``."""
    created = _parse_time((body.get("metadata") or {}).get("creationTimestamp"))
    if created is not None:
        seconds = max(0.0, (now - created).total_seconds())
        QUEUE_TO_ASSIGNED.labels(_job_kind_label(job_kind), provider).observe(seconds)


def record_job_finished(job: AgentJob) -> None:
    """A job this process saw holding a runner slot holds none now: count it if it finished.

    Called on the job's transition only (not for jobs already finished when the operator
    started), so a restart does not count a job twice. A job re-queued instead (a lost runner's
    read-only job) has not finished and is not counted.
    """
    if not job.finished:
        return
    succeeded = job.condition(ConditionType.SUCCEEDED) or {}
    outcome = "Failed" if job.failed else "Succeeded"
    job_kind = _job_kind_label(job.raw_spec.get("jobKind"))
    provider = str(job.status_part("assignment").get("provider") or "")
    JOBS_FINISHED.labels(job_kind, provider, outcome, _reason_label(succeeded.get("reason"))).inc()
    result = job.status_part("result")
    started, completed = _parse_time(result.get("startedAt")), _parse_time(result.get("completedAt"))
    if started is not None and completed is not None:
        JOB_DURATION.labels(job_kind, provider, outcome).observe(max(0.0, (completed - started).total_seconds()))


def record_api_write(*, kind: str, verb: str, subresource: str = "", error: BaseException | None = None) -> None:
    """One write through :class:`~helmhive.controller.kube.door.Kube`; ``error`` is what it raised, if anything."""
    if error is None:
        result = "Success"
    elif isinstance(error, KubeError):
        result = type(error).__name__
    else:
        result = "Error"
    API_WRITES.labels(kind, verb, subresource, result).inc()


door_hooks.on_api_write(record_api_write)  # the door reports its writes through this hook, not by importing us


# -- gauges computed at scrape time ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StateSnapshot:
    """What the scrape-time gauges show, read from the router and the queue step in one go."""

    queue_depth: int = 0
    waiting_for_capacity: int = 0
    waiting_for_reference: int = 0
    runners: Mapping[tuple[str, str, str, str], int] = field(default_factory=dict)
    """(provider, control_state, reported_status, schedulable) -> runners."""
    providers: frozenset[str] = frozenset()
    slots: Mapping[str, int] = field(default_factory=dict)
    """provider -> concurrency of its schedulable runners."""
    busy_slots: Mapping[str, int] = field(default_factory=dict)
    """provider -> active jobs on its schedulable runners."""


class OperatorState(Collector):
    """Scrape-time gauges: the snapshot is built on the operator's event loop, the HTTP thread waits for it."""

    TIMEOUT_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._read: Callable[[], StateSnapshot] | None = None

    def bind(self, *, read: Callable[[], StateSnapshot], loop: asyncio.AbstractEventLoop) -> None:
        """Call ``read`` on ``loop`` at each scrape from now on (the operator's startup registers the router's).

        The collector knows nothing of the router or the queue step: whoever owns them registers a
        reader (:func:`helmhive.controller.router.gauges.build_state_snapshot`), so the metrics, which
        the API door reports to, never import what uses that door.
        """
        with self._lock:
            self._read, self._loop = read, loop

    def unbind(self) -> None:
        with self._lock:
            self._read = self._loop = None

    def snapshot(self) -> StateSnapshot | None:
        """The current snapshot, or None before startup, after cleanup, or when the loop does not answer."""
        with self._lock:
            read, loop = self._read, self._loop
        if read is None or loop is None or loop.is_closed():
            return None

        async def on_loop() -> StateSnapshot:
            return read()

        future = asyncio.run_coroutine_threadsafe(on_loop(), loop)
        try:
            return future.result(timeout=self.TIMEOUT_S)
        except (concurrent.futures.TimeoutError, RuntimeError) as err:
            future.cancel()
            log.warning("metrics: the event loop did not answer the scrape in time (%s)", type(err).__name__)
            return None

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.snapshot()))

    @staticmethod
    def _families(snap: StateSnapshot | None) -> Iterator[Metric]:
        queue, capacity, reference = QUEUE_DEPTH.family(), WAITING_CAPACITY.family(), WAITING_REFERENCE.family()
        runners, schedulable = RUNNERS.family(), SCHEDULABLE_RUNNERS.family()
        slots, busy = SCHEDULABLE_SLOTS.family(), SCHEDULABLE_SLOTS_BUSY.family()
        if snap is not None:
            queue.add_metric([], snap.queue_depth)
            capacity.add_metric([], snap.waiting_for_capacity)
            reference.add_metric([], snap.waiting_for_reference)
            per_provider: Tally[str] = Tally()
            for (provider, control, reported, is_schedulable), count in sorted(snap.runners.items()):
                runners.add_metric([provider, control, reported, is_schedulable], count)
                if is_schedulable == "true":
                    per_provider[provider] += count
            for provider in sorted(snap.providers | set(per_provider)):
                schedulable.add_metric([provider], per_provider[provider])
                slots.add_metric([provider], snap.slots.get(provider, 0))
                busy.add_metric([provider], snap.busy_slots.get(provider, 0))
        yield from (queue, capacity, reference, runners, schedulable, slots, busy)


STATE = OperatorState()
"""The one scrape-time collector; :func:`OperatorState.bind` points it at the running router."""
REGISTRY.register(STATE)


class LeaderState(Collector):
    """``helmhive_operator_leader``: set by the operator as it gains or loses leadership."""

    def __init__(self) -> None:
        self.leader = True

    def describe(self) -> Iterable[Metric]:
        return [LEADER.family()]

    def collect(self) -> Iterable[Metric]:
        family = LEADER.family()
        family.add_metric([], 1 if self.leader else 0)
        return [family]


LEADERSHIP = LeaderState()
"""Whether this process acts; 1 unless leader election is on and another process holds the Lease."""
REGISTRY.register(LEADERSHIP)


def serve_metrics(*, addr: str, port: int) -> bool:
    """Serve ``/metrics`` from :data:`REGISTRY` on a daemon thread; False (logged) when port 0 or unbindable."""
    return serve_registry(REGISTRY, addr=addr, port=port)

"""The runner's Prometheus metrics: every one is defined here, and ``/metrics`` is served from here.

Owns: the metric objects (in the runner's own :data:`REGISTRY`, with the standard process,
platform and garbage-collector metrics), the ``record_*`` helpers the runner calls when a
heartbeat, a report write, a probe or an agent turn happens, a collector that reads the
process's state (control state, active jobs, last heartbeat) when Prometheus scrapes, and
:func:`serve_metrics` (a server the runner program stops before it exits).

Must not: label anything with a runner, pool, job or model name, or with free text. A runner's
identity is its scrape target (the pod); labels are fixed names only -- a turn outcome, a
cancel origin, a write reason, an authentication state -- plus the runner's provider and
adapter type, which are constant for the process. ``docs/observability.md`` lists every
metric, and a unit test keeps the two in step.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import start_http_server
from prometheus_client.metrics_core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from helmhive.api.common import ControlState
from helmhive.api.runner import AuthState
from helmhive.metricdefs import Catalogue
from helmhive.runner.adapters.base import TurnOutcome, TurnResult
from helmhive.runner.config import RunnerConfig

__all__ = [
    "ADAPTER_CANCELLATIONS",
    "ADAPTER_KILLS",
    "ADAPTER_TURNS",
    "CATALOGUE",
    "EGRESS_REQUESTS",
    "HEARTBEATS",
    "JOB_AGENT_START",
    "PROBES",
    "REGISTRY",
    "REPORT_WRITES",
    "STATE",
    "TURN_DURATION",
    "MetricsServer",
    "RunnerGauges",
    "RunnerState",
    "record_agent_start",
    "record_egress",
    "record_heartbeat",
    "record_probe",
    "record_report_write",
    "record_turn",
    "serve_metrics",
]


CATALOGUE = Catalogue()
"""Every metric the runner defines (``docs/observability.md`` lists exactly these)."""
REGISTRY = CATALOGUE.registry
"""The runner's registry: Helmhive's metrics plus the standard ``process_*`` and ``python_*`` ones."""

log = logging.getLogger("helmhive.metrics")

_TURN_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)

HEARTBEATS = CATALOGUE.counter(
    "helmhive_runner_heartbeats_total",
    "Lease renewals (the heartbeat; the first one acquires the Lease), by result (success or failure).",
    ["result"],
)
REPORT_WRITES = CATALOGUE.counter(
    "helmhive_runner_report_writes_total",
    "Writes of the Runner's status.report, by why (Registration, Changed, Refresh) and result.",
    ["reason", "result"],
)
PROBES = CATALOGUE.counter(
    "helmhive_runner_probes_total",
    "Adapter probes (what the agent offers, whether it is logged in), by the authentication state found.",
    ["provider", "adapter", "auth_state"],
)
ADAPTER_TURNS = CATALOGUE.counter(
    "helmhive_runner_adapter_turns_total",
    "Agent turns the runner drove (a job's turn and its repair turn), by provider, adapter and outcome.",
    ["provider", "adapter", "outcome"],
)
TURN_DURATION = CATALOGUE.histogram(
    "helmhive_runner_adapter_turn_duration_seconds",
    "How long agent turns took, by provider, adapter and outcome.",
    ["provider", "adapter", "outcome"],
    buckets=_TURN_BUCKETS,
)
ADAPTER_CANCELLATIONS = CATALOGUE.counter(
    "helmhive_runner_adapter_cancellations_total",
    "Turns the adapter cancelled (session/cancel or SIGINT), by who asked: Caller (job cancelled, timed out, "
    "runner stopping) or Watchdog (no update from the agent within the idle timeout).",
    ["provider", "adapter", "origin"],
)
ADAPTER_KILLS = CATALOGUE.counter(
    "helmhive_runner_adapter_kills_total",
    "Turns that ended with the agent killed, because it did not stop within the grace after a cancel "
    "or did not answer a setup request in time.",
    ["provider", "adapter"],
)
_START_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
JOB_AGENT_START = CATALOGUE.histogram(
    "helmhive_runner_job_queue_to_agent_start_seconds",
    "From a job's creation (its queueing) to its agent's first prompt about to be sent, by provider, adapter "
    "and where the agent starts: warm (a claimed warm job pod), cold (a job pod created for the job) or in-runner.",
    ["provider", "adapter", "start"],
    buckets=_START_BUCKETS,
)
EGRESS_REQUESTS = CATALOGUE.counter(
    "helmhive_runner_egress_requests_total",
    "Requests to the runner's egress proxy, by outcome: forwarded, upstream-failed, or refused-<reason> "
    "(connect, host, target, no-upstream, no-credential, too-large, path, path-suspicious, rate, concurrency).",
    ["outcome"],
)

INFO = CATALOGUE.info(
    "helmhive_runner",
    "The runner's provider, adapter type and Helmhive version (value 1).",
    ["provider", "adapter", "version"],
)
CONTROL_STATE = CATALOGUE.gauge(
    "helmhive_runner_control_state",
    "1 for the control state the runner obeys (Active, Draining, Disabled, Revoked), 0 for the others.",
    ["state"],
)
AUTH_STATE = CATALOGUE.gauge(
    "helmhive_runner_auth_state",
    "1 for the authentication state in the last report written, 0 for the others; none before the first report.",
    ["state"],
)
JOBS_ACTIVE = CATALOGUE.gauge("helmhive_runner_jobs_active", "Jobs this runner is running now.")
JOB_SLOTS = CATALOGUE.gauge("helmhive_runner_job_slots", "Jobs this runner may run at once (its concurrency).")
LAST_HEARTBEAT = CATALOGUE.gauge(
    "helmhive_runner_last_heartbeat_timestamp_seconds", "Unix time of the last successful Lease renewal."
)


def record_heartbeat(*, ok: bool) -> None:
    HEARTBEATS.labels("success" if ok else "failure").inc()


def record_report_write(*, reason: str, ok: bool) -> None:
    """``reason`` is a :class:`~helmhive.runner.program.report.WriteReason` value."""
    REPORT_WRITES.labels(reason, "success" if ok else "failure").inc()


def _identity(config: RunnerConfig) -> tuple[str, str]:
    """The (provider, adapter) labels: constant for one runner process."""
    return config.file.provider, config.file.adapter.type.value


def record_probe(*, config: RunnerConfig, auth: str) -> None:
    """``auth`` is an :class:`~helmhive.api.runner.AuthState` value (the adapters report the API's states)."""
    PROBES.labels(*_identity(config), auth).inc()


def record_agent_start(*, config: RunnerConfig, start: str, seconds: float | None) -> None:
    """A job's agent is about to get its first prompt, ``seconds`` after the job was created (None: its
    creation time unreadable, nothing observed). ``start``: ``warm``, ``cold`` or ``in-runner``."""
    if seconds is not None:
        JOB_AGENT_START.labels(*_identity(config), start).observe(max(0.0, seconds))


def record_egress(*, outcome: str) -> None:
    """``outcome``: ``forwarded``, ``upstream-failed`` or ``refused-<reason>`` (:mod:`helmhive.runner.egress.proxy`)."""
    EGRESS_REQUESTS.labels(outcome).inc()


def record_turn(*, config: RunnerConfig, result: TurnResult) -> None:
    """One turn ended: its outcome and duration, and whether it was cancelled or its agent killed."""
    provider, adapter = _identity(config)
    outcome = result.outcome.value
    ADAPTER_TURNS.labels(provider, adapter, outcome).inc()
    TURN_DURATION.labels(provider, adapter, outcome).observe(max(0.0, result.duration_s))
    if result.cancel_origin is not None:
        ADAPTER_CANCELLATIONS.labels(provider, adapter, result.cancel_origin.value).inc()
    if result.outcome is TurnOutcome.KILLED:
        ADAPTER_KILLS.labels(provider, adapter).inc()


# -- gauges read at scrape time ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunnerGauges:
    """What the scrape-time gauges show."""

    provider: str
    adapter: str
    version: str
    control_state: ControlState
    auth_state: str | None
    active_jobs: int
    slots: int
    last_heartbeat: dt.datetime | None


class RunnerSource(Protocol):
    """Reads the running process's state (each read is a single attribute or ``len``, safe from another thread)."""

    def metrics_view(self) -> RunnerGauges: ...


class RunnerState(Collector):
    """Scrape-time gauges, read from the bound runner process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._source: RunnerSource | None = None

    def bind(self, source: RunnerSource | None) -> None:
        with self._lock:
            self._source = source

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            source = self._source
        return list(self._families(source.metrics_view() if source is not None else None))

    @staticmethod
    def _families(view: RunnerGauges | None) -> list[Metric]:
        info = InfoMetricFamily(INFO.name.removesuffix("_info"), INFO.help)
        control, auth = CONTROL_STATE.family(), AUTH_STATE.family()
        active, slots, heartbeat = JOBS_ACTIVE.family(), JOB_SLOTS.family(), LAST_HEARTBEAT.family()
        if view is not None:
            info.add_metric([], {"provider": view.provider, "adapter": view.adapter, "version": view.version})
            for state in ControlState:
                control.add_metric([state.value], 1 if state is view.control_state else 0)
            if view.auth_state is not None:
                for auth_state in AuthState:
                    auth.add_metric([auth_state.value], 1 if auth_state.value == view.auth_state else 0)
            active.add_metric([], view.active_jobs)
            slots.add_metric([], view.slots)
            if view.last_heartbeat is not None:
                heartbeat.add_metric([], view.last_heartbeat.timestamp())
        return [info, control, auth, active, slots, heartbeat]


STATE = RunnerState()
"""The one scrape-time collector; the runner program binds its process to it."""
REGISTRY.register(STATE)


class MetricsServer:
    """``/metrics`` served on a thread of its own, until :meth:`close`."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self.thread = thread

    def close(self, timeout: float = 10.0) -> bool:
        """Stop serving and wait for the thread (no thread may outlive the runner's main loop); True once it ended."""
        self._server.shutdown()
        self._server.server_close()
        self.thread.join(timeout)
        return not self.thread.is_alive()


def serve_metrics(*, addr: str, port: int) -> MetricsServer | None:
    """Serve ``/metrics`` from :data:`REGISTRY`; None (logged) when ``port`` is 0 or cannot be bound.

    A port that cannot be bound stops nothing: the runner's work matters more than its metrics.
    """
    if port == 0:
        return None
    try:
        server, thread = start_http_server(port, addr=addr, registry=REGISTRY)
    except OSError as err:
        log.error("metrics endpoint not served on %s:%d: %s", addr, port, err)
        return None
    thread.name = "metrics"
    log.info("metrics served on http://%s:%d/metrics", addr, port)
    return MetricsServer(server, thread)

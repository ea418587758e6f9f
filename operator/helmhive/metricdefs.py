"""What the operator's and the runner's metrics modules share: a catalogue of their metrics, and serving.

:class:`Catalogue` makes Prometheus metrics in one registry and remembers each one's name,
type, labels and help as a :class:`MetricSpec`, so ``docs/observability.md`` can be checked
against exactly what the code registers (``tests/unit/test_metrics.py``). Gauges computed at
scrape time are declared here too and built by :meth:`Catalogue.gauge`.

The metrics themselves live in :mod:`helmhive.controller.metrics` and
:mod:`helmhive.runner.metrics`; the pure core (``api``, ``policy``, ``deploy``) never imports
``prometheus_client``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.metrics_core import GaugeMetricFamily

__all__ = ["Catalogue", "MetricSpec", "serve_registry"]

log = logging.getLogger("helmhive.metrics")

# No ``<name>_created`` series beside every counter and histogram: in the text format Prometheus
# stores them as gauges of their own, doubling the series for a timestamp nobody queries.
disable_created_metrics()  # type: ignore[no-untyped-call]


@dataclass(frozen=True, kw_only=True)
class MetricSpec:
    """One metric as exposed: ``name`` is the full name (counters end in ``_total``)."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


class Catalogue:
    """A registry (with the standard ``process_*`` and ``python_*`` metrics) and the specs of Helmhive's own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(standard)
        self.specs: list[MetricSpec] = []

    def _add(self, name: str, kind: str, labels: Sequence[str], doc: str) -> None:
        if any(spec.name == name for spec in self.specs):
            raise ValueError(f"metric {name} is defined twice")
        self.specs.append(MetricSpec(name=name, type=kind, labels=tuple(labels), help=doc))

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        """A counter; ``name`` ends in ``_total`` as exposed."""
        if not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        self._add(name, "counter", labels, doc)
        return Counter(name, doc, list(labels), registry=self.registry)

    def histogram(self, name: str, doc: str, labels: Sequence[str] = (), *, buckets: Sequence[float]) -> Histogram:
        self._add(name, "histogram", labels, doc)
        return Histogram(name, doc, list(labels), buckets=tuple(buckets), registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> GaugeSpec:
        """Declare a gauge that a collector computes at scrape time (see :meth:`GaugeSpec.family`)."""
        self._add(name, "gauge", labels, doc)
        return GaugeSpec(name=name, doc=doc, labels=tuple(labels))

    def info(self, name: str, doc: str, labels: Sequence[str]) -> MetricSpec:
        """Declare an info metric (exposed as ``<name>_info`` with value 1) that a collector computes."""
        self._add(f"{name}_info", "info", labels, doc)
        return self.specs[-1]


@dataclass(frozen=True, kw_only=True)
class GaugeSpec:
    name: str
    doc: str
    labels: tuple[str, ...]

    def family(self) -> GaugeMetricFamily:
        """An empty family to add this scrape's samples to."""
        return GaugeMetricFamily(self.name, self.doc, labels=list(self.labels) if self.labels else None)


def serve_registry(registry: CollectorRegistry, *, addr: str, port: int) -> bool:
    """Serve ``/metrics`` on a daemon thread; False (logged) when ``port`` is 0 or cannot be bound.

    A port that cannot be bound stops nothing: the process's work matters more than its
    metrics, and Prometheus shows the target down.
    """
    if port == 0:
        return False
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as err:
        log.error("metrics endpoint not served on %s:%d: %s", addr, port, err)
        return False
    log.info("metrics served on http://%s:%d/metrics", addr, port)
    return True

"""Scrape a real Prometheus ``/metrics`` endpoint and read samples from it.

The exposition is parsed with ``prometheus_client.parser``, the same text format Prometheus
reads. :meth:`Scrape.total` sums every series of a sample name whose labels include the given
ones, and is 0 when there is none, so a test can compare two scrapes without caring which
label combinations exist yet::

    before = scrape(operator.metrics_url)
    ...
    wait_for(lambda: scrape(url).total("helmhive_jobs_routed_total", outcome="Assigned")
             >= before.total("helmhive_jobs_routed_total", outcome="Assigned") + 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["Scrape", "parse_exposition", "scrape", "scrape_apiserver"]


@dataclass(frozen=True)
class Scrape:
    """One scrape: every sample, and the type of each metric family."""

    samples: tuple[Sample, ...]
    types: dict[str, str]

    def series(self, name: str, **labels: str) -> list[Sample]:
        """The samples called ``name`` whose labels include ``labels``."""
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def total(self, name: str, **labels: str) -> float:
        """The sum of :meth:`series` (0 when there is none)."""
        return float(sum(s.value for s in self.series(name, **labels)))

    def label_values(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}


def parse_exposition(text: str) -> Scrape:
    """Parse a Prometheus text exposition."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        samples.extend(family.samples)
    return Scrape(samples=tuple(samples), types=types)


def scrape(url: str, *, timeout: float = 10.0) -> Scrape:
    """GET ``url`` and parse it; raises on a connection error or a non-200 answer."""
    response = httpx.get(url, timeout=timeout)
    response.raise_for_status()
    return parse_exposition(response.text)


def scrape_apiserver(api: Any) -> Scrape:
    """The API server's own ``/metrics``, read with ``api`` (a kubernetes ``ApiClient``: its credentials)."""
    method, url, headers, body, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    return parse_exposition(api.call_api(method, url, header_params=headers, body=body).read().decode())

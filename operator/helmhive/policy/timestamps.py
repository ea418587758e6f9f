"""How the policy layer writes a moment into status, conditions and messages: ``2026-01-02T03:04:05Z``.

Kubernetes timestamps are whole seconds in UTC with a ``Z``; every condition time, deadline and
``...At`` field the operator writes uses this one format, which the tests read back. A naive
datetime is taken as UTC (the operator's clocks are aware; tests sometimes are not). Pure.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["as_utc", "format_timestamp"]


def as_utc(moment: dt.datetime) -> dt.datetime:
    """``moment`` in UTC; a naive one is read as UTC already."""
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def format_timestamp(moment: dt.datetime) -> str:
    """``moment`` as a Kubernetes timestamp, to the second (fractions are dropped, not rounded)."""
    return as_utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")

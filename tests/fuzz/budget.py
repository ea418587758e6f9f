"""How many inputs each fuzz test tries, how they replay, and the counts a long run records.

CI runs every fuzz test with a fixed, modest ``max_examples`` and ``derandomize=True``: the
same inputs every time, so a failure replays by running the test again. ``benchmarks/fuzz.py``
runs them longer: ``HELMHIVE_FUZZ_SCALE`` multiplies every test's count and
``HELMHIVE_FUZZ_SEED`` switches to random generation from that seed (printed, so a failure
replays with the same two variables). No example database is written (the working tree is shared).

Each test counts what it tried in a :class:`Tally`; with ``HELMHIVE_FUZZ_REPORT`` set the counts
are appended to that file as JSON lines (the long run sums them into ``docs/reliability.md``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

__all__ = ["Tally", "fuzz_settings", "scaled"]


def scaled(ci_examples: int) -> int:
    return max(1, round(ci_examples * float(os.environ.get("HELMHIVE_FUZZ_SCALE", "1"))))


def fuzz_settings(ci_examples: int) -> settings:
    """Settings for one fuzz test: ``ci_examples`` inputs in CI, derandomized unless a seed is given."""
    seeded = bool(os.environ.get("HELMHIVE_FUZZ_SEED"))
    return settings(
        max_examples=scaled(ci_examples),
        derandomize=not seeded,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


class Tally:
    """Counts of one fuzz test's inputs: tried, refused, accepted, and anything else worth a number."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.counts: Counter[str] = Counter()

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def report(self) -> dict[str, Any]:
        record = {"test": self.test, **dict(sorted(self.counts.items()))}
        print(f"fuzz counts: {json.dumps(record)}")
        target = os.environ.get("HELMHIVE_FUZZ_REPORT")
        if target:
            with Path(target).open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
        return record

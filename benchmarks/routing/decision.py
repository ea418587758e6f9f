"""``decide_route`` alone (phase 5): the router's pure decision for one job, timed in-process.

Over a made-up fleet of 200 and 1,000 runners, as a plain list and (when the code measured has
it) as a RunnerSet, as the router passes them; ``--decide-only`` also times the implementation
it replaced (the tests' oracle). No cluster and no I/O.
"""

from __future__ import annotations

import datetime as dt
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from helmhive.api.common import JobKind
from helmhive.api.job import AgentJobSpec, ProfileBinding
from helmhive.api.profile import ProfileSpec
from helmhive.policy.envelopes import ENVELOPES
from helmhive.policy.profiles.narrowing import decide_profile
from helmhive.policy.routing.route import RoutingJob, RunnerView, decide_route
from routing.report import pct
from routing.settings import MODEL

try:
    from helmhive.policy.routing.prepared import RunnerSet
except ImportError:  # older code (the benchmark also measures a base commit through PYTHONPATH)
    RunnerSet = None  # type: ignore[assignment,misc]

REPO = Path(__file__).resolve().parents[2]
"""The repository: ``--decide-only`` imports the tests' oracle from its ``tests/unit``."""


def time_decide_route(
    runners: int, repeats: int = 200, decide: Any = decide_route, *, fleet: bool = False
) -> dict[str, float]:
    """Milliseconds per decide_route call for one job over ``runners`` runners (no I/O).

    ``fleet``: the runners as a RunnerSet, as the operator's router passes them (each runner's
    static checks remembered across decisions); else a plain list (every check made per call).
    """
    spec = ProfileSpec.model_validate(
        {
            "envelope": "implementation-probe",
            "purpose": "bench",
            "providerMappings": [
                {"provider": "anthropic", "model": "opus-4", "fallbackModels": [MODEL]},
                {"provider": "openai", "model": "gpt-5"},
            ],
            "requiredLabels": {"domain": "code"},
        }
    )
    effective = decide_profile(profile=spec, envelope=ENVELOPES[JobKind.IMPLEMENTATION_PROBE]).effective
    assert effective is not None
    binding = ProfileBinding(name="bench", revision="bench-1", hash="sha256:0", snapshot=effective,
                             bound_at=dt.datetime.now(dt.UTC))  # fmt: skip
    views = [
        RunnerView(
            namespace=f"ns-{i % 10}",
            name=f"runner-{i:04d}",
            pool=f"pool-{i // 100}",
            provider=("anthropic", "openai", "google")[i % 3],
            schedulable=i % 17 != 0,
            schedulable_reason="HeartbeatStale",
            default_model=MODEL,
            models=frozenset({MODEL, "haiku"} | ({"opus-4"} if i % 5 == 0 else set())),
            capabilities=frozenset({"structured-output", "diff-review", "workspace-write"}),
            labels={"domain": "code"} if i % 7 else {"domain": "docs"},
            concurrency=4,
            serves_namespace=i % 10 != 3,
        )
        for i in range(runners)
    ]
    active = {v.key: i % 5 for i, v in enumerate(views)}
    if fleet:
        views = RunnerSet(views)  # type: ignore[assignment]
    job = RoutingJob(
        namespace="ns-0",
        name="j",
        spec=AgentJobSpec.model_validate(
            {"workspace": "shop", "jobKind": "implementation-probe", "request": {"title": "t", "prompt": "p"}}
        ),
    )
    now = dt.datetime.now(dt.UTC)
    decide(job=job, binding=binding, runners=views, active_jobs=active, now=now)  # a RunnerSet remembers here
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        decision = decide(job=job, binding=binding, runners=views, active_jobs=active, now=now)
        samples.append(time.perf_counter() - started)
    assert decision.routed
    return {
        "runners": runners,
        "fleet": fleet,
        "p50_ms": 1000 * statistics.median(samples),
        "p95_ms": 1000 * pct(samples, 0.95),
    }


def time_decide_routes() -> list[dict[str, float]]:
    """:func:`time_decide_route` over 200 and 1,000 runners: a plain list, and a RunnerSet if the code has it."""
    fleets = (False, True) if RunnerSet is not None else (False,)
    return [time_decide_route(n, fleet=f) for n in (200, 1000) for f in fleets]


def print_decide_times(repeats: int = 500) -> None:
    """decide_route now, and the implementation it replaced (the tests' oracle), in the same run."""
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    import routing_oracle_v1  # noqa: PLC0415 - a test module, found only from the repository

    for n in (200, 1000):
        print(f"decide_route over {n} runners: timing {repeats} calls of each implementation ...", flush=True)
        now = time_decide_route(n, repeats)
        before = time_decide_route(n, repeats, routing_oracle_v1.decide_route)
        remembered = time_decide_route(n, repeats, fleet=True) if RunnerSet is not None else None
        print(
            f"  now p50 {now['p50_ms']:.3f} ms, p95 {now['p95_ms']:.3f} ms; before (oracle) p50 "
            f"{before['p50_ms']:.3f} ms, p95 {before['p95_ms']:.3f} ms; "
            f"p50 ratio {now['p50_ms'] / before['p50_ms']:.2f}"
            + (
                f"; over a RunnerSet (the router's path, static checks remembered) p50 {remembered['p50_ms']:.3f} ms, "
                f"p95 {remembered['p95_ms']:.3f} ms"
                if remembered is not None
                else ""
            )
        )

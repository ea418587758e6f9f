"""The burst (phase 3): the jobs the operator routes, and the watch that times them.

It creates the bench Profile every job binds, then ``--jobs`` AgentJobs (16 in flight, or at a
steady ``--rate``, or as a backlog with the operator stopped until every one exists) and
watches them, recording for each job when its create returned, when its profile was first seen
bound (the queue step) and when its ``status.assignment`` was; last, it waits for the routing
audit records. It returns raw timings and counts; the ratios and the printed report are
``report``'s, and the operator's process is ``process``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson

from helmhive.policy.audit.routing import iter_routing_decisions
from routing.report import pct
from routing.settings import BENCH_PROFILE_SPEC, GROUP_PATH, NS, job_body


async def ensure_bench_profile(admin: httpx.AsyncClient) -> None:
    """Create the Profile ``bench`` (``BENCH_PROFILE_SPEC``) and wait until the operator says it is Valid."""
    profile = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "Profile",
        "metadata": {"name": "bench"},
        "spec": BENCH_PROFILE_SPEC,
    }
    (await admin.post(f"{GROUP_PATH}/namespaces/{NS}/profiles", json=profile)).raise_for_status()

    async def valid() -> bool:
        obj = (await admin.get(f"{GROUP_PATH}/namespaces/{NS}/profiles/bench")).json()
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Valid" and c["status"] == "True" for c in conds)

    while not await valid():  # noqa: ASYNC110
        await asyncio.sleep(0.5)


async def burst(  # noqa: PLR0915
    admin: httpx.AsyncClient,
    *,
    jobs: int,
    limit: float,
    rate: float = 0.0,
    release: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Create ``jobs`` AgentJobs and watch until every one is assigned (or the timeout).

    ``rate`` > 0 paces the creates at that many a second (steady arrival) instead of a burst.
    ``release`` (the backlog mode) is awaited once every job exists: it starts the stopped
    operator, and the routing rate is then timed from that moment, without the client's creates.
    """
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    assigned: dict[str, float] = {}
    runner_of: dict[str, str] = {}
    waiting: set[str] = set()
    listing = await admin.get(f"{GROUP_PATH}/namespaces/{NS}/agentjobs")
    version = listing.json()["metadata"]["resourceVersion"]

    async def watch() -> None:
        nonlocal version
        while len(assigned) < jobs:
            params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true", "timeoutSeconds": "60"}
            async with admin.stream("GET", f"{GROUP_PATH}/namespaces/{NS}/agentjobs", params=params,
                                    timeout=httpx.Timeout(90)) as stream:  # fmt: skip
                async for line in stream.aiter_lines():
                    if not line:
                        continue
                    event = orjson.loads(line)
                    obj = event["object"]
                    version = obj["metadata"].get("resourceVersion", version)
                    if event["type"] == "BOOKMARK":
                        continue
                    name = obj["metadata"]["name"]
                    status = obj.get("status") or {}
                    now = time.monotonic()
                    if status.get("profile") and name not in bound:
                        bound[name] = now
                    if status.get("assignment") and name not in assigned:
                        assigned[name] = now
                        runner_of[name] = status["assignment"]["runner"]
                    reasons = {c.get("reason") for c in status.get("conditions") or []}
                    if "WaitingForCapacity" in reasons:
                        waiting.add(name)
                    if len(assigned) >= jobs:
                        return

    watcher = asyncio.create_task(watch())
    gate = asyncio.Semaphore(16)

    async def progress() -> None:
        while True:
            await asyncio.sleep(10)
            print(f"  {len(created)} of {jobs} jobs created, {len(assigned)} assigned", flush=True)

    reporter = asyncio.create_task(progress())

    async def create(name: str) -> None:
        async with gate:
            response = await admin.post(f"{GROUP_PATH}/namespaces/{NS}/agentjobs", json=job_body(name))
            response.raise_for_status()
            created[name] = time.monotonic()

    started = time.monotonic()
    if rate > 0:
        pending = []
        for i in range(jobs):
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            pending.append(asyncio.create_task(create(f"job-{i:05d}")))
        await asyncio.gather(*pending)
    else:
        await asyncio.gather(*(create(f"job-{i:05d}") for i in range(jobs)))
    created_all = time.monotonic() - started
    released = None
    if release is not None:
        released = time.monotonic()
        await release()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(watcher, limit)
    reporter.cancel()
    done = time.monotonic()
    latency = [assigned[n] - created[n] for n in assigned if n in created]
    bind = [bound[n] - created[n] for n in bound if n in created]
    route = [assigned[n] - bound[n] for n in assigned if n in bound]
    times = sorted(assigned.values())
    steady = None
    if len(times) >= 10:
        lo, hi = times[len(times) // 10], times[(len(times) * 9) // 10]
        steady = (len(times) * 8 // 10) / (hi - lo) if hi > lo else None
    backlog = None
    if released is not None and times:
        backlog = {
            "operator_started_to_last_seconds": max(times) - released,
            "first_assigned_seconds": min(times) - released,
            "jobs_per_second_from_start": len(assigned) / (max(times) - released),
            "jobs_per_second_first_to_last": (len(assigned) - 1) / (max(times) - min(times))
            if max(times) > min(times)
            else None,
        }
    return {
        "started": started,
        "assigned_at": (min(times), max(times)) if times else (None, None),
        "runner_of": runner_of,
        "backlog": backlog,
        "jobs": jobs,
        "assigned": len(assigned),
        "seen_waiting": len(waiting),
        "create_seconds": created_all,
        "wall_seconds": (max(times) - started) if times else done - started,
        "jobs_per_second": len(assigned) / ((max(times) - started) if times else done - started),
        "steady_jobs_per_second": steady,
        "latency": {
            "queue_to_assigned_p50": statistics.median(latency) if latency else None,
            "queue_to_assigned_p95": pct(latency, 0.95) if latency else None,
            "queue_to_assigned_max": max(latency) if latency else None,
            "queue_to_bound_p50": statistics.median(bind) if bind else None,
            "bound_to_assigned_p50": statistics.median(route) if route else None,
            "bound_to_assigned_p95": pct(route, 0.95) if route else None,
        },
        "per_runner": Counter(runner_of.values()),
    }


async def wait_for_routing_audits(admin: httpx.AsyncClient, figures: dict[str, Any]) -> None:
    """Wait until the RoutingDecisions audit records hold a JobRouted decision for every assigned
    job (``figures["assigned"]``, the burst's); ``figures["audit_batches"]`` is kept to their count.

    Audits are written off the assignment path: the run counts the writes once every one is there.
    """
    audits_url = f"{GROUP_PATH}/namespaces/{NS}/auditrecords"
    selector = {"labelSelector": "helmhive.dev/audit-action=RoutingDecisions"}

    async def routed_decisions() -> int:
        records = (await admin.get(audits_url, params=selector)).json()["items"]
        figures["audit_batches"] = len(records)
        return sum(d["spec"]["action"] == "JobRouted" for d in iter_routing_decisions(records))

    while await routed_decisions() < figures["assigned"]:  # noqa: ASYNC110
        await asyncio.sleep(1)

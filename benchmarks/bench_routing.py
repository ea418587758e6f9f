"""Benchmark: how fast the operator routes a burst of queued jobs, and what it costs the API server.

Run by hand (pytest does not collect it)::

    .venv/bin/python benchmarks/bench_routing.py --jobs 2000 --runners 200 --concurrency 10

It starts its own local control plane (``helmhive.devcluster``) in a temporary directory,
installs Helmhive and then, in one run:

1. **raw patch rates**: before the operator starts, a plain client (httpx, admin certificate,
   ``--writers`` requests in flight) merge-patches the status of scratch AgentJobs for
   ``--raw-seconds``: a tiny status (two counters; the issue's raw rate, also one at a time),
   then a status the shape and size of the router's write (the binding, ``MAX_CANDIDATES``
   candidate rows, the assignment, Routed/Ready; built by the router's pure core,
   :func:`build_like_router_status`: the like-for-like rate), the same status as a conditional
   PUT of the whole status (as the router writes it), then the tiny status again on the
   same jobs, which now hold a routed-size status (the API server's cost follows the stored
   object), and last the tiny status on fresh jobs again (how steady the raw rate was); the
   tiny patch first runs untimed for ``--raw-warmup`` seconds, since a control plane just
   started may serve it slower than a moment later; the scratch jobs are deleted again (and,
   after everything else, with the operator stopped, the tiny patch runs once more on fresh
   jobs: the machine's speed drifts over minutes, and the backlog's ratio is also given against
   the mean of the rates before and after it);
2. starts the real operator (its own ServiceAccount token) and M runners in pools of up to
   100, each writing its Runner, report and Lease as its own Pod (``runner_fleet``), reporting
   ``--concurrency`` slots; waits until all are schedulable;
3. **the burst**: creates N AgentJobs as fast as the client can (16 in flight) and watches
   them; for each job it records when the create returned, when the watch first showed its
   profile bound (the queue step) and when it first showed ``status.assignment``;
4. reports jobs routed per second, p50/p95 queue-to-assigned latency, API mutating calls per
   job (``apiserver_request_total``, by resource), the operator's RSS, routing throughput as
   a ratio of the raw patch rate and of the like-for-like rate, and how many runners ended over
   their concurrency (must be 0);
4a. **where the CPU goes**: the CPU seconds (``/proc/PID/stat``) of this cluster's kube-apiserver
   and etcd (their pid records), the operator and the bench process, and the machine's busy
   cores (``/proc/stat``), per patch in each raw phase and per routed job in the burst (first
   create to last assignment) and, with ``--backlog``, from the first assignment to the last;
5. **decide_route alone**: the pure decision for one job over 1,000 runners, timed in-process.

``--raw-only`` runs the raw phases alone; ``--raw-status`` has them write a smaller status than
the router's (:data:`RAW_STATUSES`), to bound what a smaller status could gain; and
``--apiserver-profile DIR`` has the API server serve its Go profiles and writes its CPU profile
of each raw phase into ``DIR`` (``go tool pprof -top <kube-apiserver> DIR/apiserver-tiny.pb.gz``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from bench_runners import CpuProbe, cpu_seconds, cpu_window, install, operator_kubeconfig, wait, write_counts
from kubernetes import client, config
from runner_fleet import Fleet, SimRunner, micro_time

from helmhive.api.common import JobKind
from helmhive.api.job import AgentJobSpec, ProfileBinding
from helmhive.api.kinds import API_VERSION
from helmhive.api.profile import ProfileSpec
from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import ensure_binaries
from helmhive.devcluster.flags import StateLayout
from helmhive.devcluster.procs import client_tls, free_ports, is_alive, read_record
from helmhive.policy.agentjob import life as agentjob
from helmhive.policy.audit.routing import iter_routing_decisions
from helmhive.policy.envelopes import ENVELOPES
from helmhive.policy.profiles.narrowing import decide_profile, decide_profile_body
from helmhive.policy.profiles.revisions import profile_hash, revision_name
from helmhive.policy.routing.route import MAX_CANDIDATES, RoutingJob, RunnerView, decide_route
from helmhive.policy.routing.step import route as route_step
from helmhive.policy.timestamps import format_timestamp

try:
    from helmhive.policy.routing.prepared import RunnerSet
except ImportError:  # older code (the benchmark also measures a base commit through PYTHONPATH)
    RunnerSet = None  # type: ignore[assignment,misc]

NS = "routing-bench"
EVENT_INTERVAL_SECONDS = 30.0  # the operator's HELMHIVE_ROUTING_EVENT_INTERVAL_SECONDS default
RAW_NS = "raw-bench"
AFTER_NS = "raw-bench-after"
POOL_SIZE = 100
MODEL = "sonnet-4-5"
GROUP_PATH = "/apis/helmhive.dev/v1alpha1"
BENCH_PROFILE_SPEC: dict[str, Any] = {
    "envelope": "implementation-probe",
    "purpose": "bench",
    "providerMappings": [{"provider": "anthropic", "model": MODEL}],
}
"""The spec of the bench's Profile ``bench``: the one every routed job binds, and the like-for-like baseline's."""
RUNNER_LABELS = {"domain": "code", "region": "eu"}
RUNNER_CAPABILITIES = ["structured-output", "diff-review", "workspace-write"]
RUNNER_MODELS = ("opus-4", MODEL, "haiku")


class RoutingFleet(Fleet):
    """The benchmark runners: the runner_fleet writes, with a configurable concurrency in the report."""

    def __init__(self, *args: Any, concurrency: int, generation: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.concurrency = concurrency
        self.generation = generation

    async def report(self, runner: SimRunner) -> None:
        report = {
            "provider": "anthropic",
            "adapter": {"type": "claude-cli", "name": "claude", "version": "2.0.14"},
            "authentication": {"state": "Authenticated", "reason": "SessionCreated", "verifiedAt": runner.verified_at},
            "placementLabels": RUNNER_LABELS,
            "capabilities": RUNNER_CAPABILITIES,
            "concurrency": self.concurrency,
            "activeJobs": 0,
            "environmentFingerprint": "sha256:" + "ab" * 32,
            "catalogue": {"models": [{"id": m} for m in RUNNER_MODELS], "default": MODEL},
            "credentialGeneration": self.generation,
            "podName": runner.name,
            "reportedAt": micro_time(dt.datetime.now(dt.UTC)),
            "registeredAt": runner.registered_at,
        }
        await self.publish(runner, report)


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Vm")
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def job_body(name: str, kind: str = "implementation-probe", profile: str = "bench") -> dict[str, Any]:
    return {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {"workspace": "shop", "jobKind": kind, "profile": profile, "request": {"title": name, "prompt": "go"}},
    }


# 1. The raw rates ------------------------------------------------------------------------------


def build_like_router_status(*, runners: int, concurrency: int, now: dt.datetime) -> dict[str, Any]:
    """The status the router writes for one bench job it assigns, built by the same pure core. Pure.

    The binding is the bench Profile's (``BENCH_PROFILE_SPEC``, decided as the queue step does,
    ``helmhive.controller.jobs.binding``), the decision ``decide_route`` over ``runners`` runners
    like the bench's (so ``MAX_CANDIDATES`` candidate rows once there are that many), the wire
    form ``agentjob.route`` with the binding: routing, the assignment, Routed/Ready, the profile.
    """
    parsed, verdict = decide_profile_body(BENCH_PROFILE_SPEC)
    assert parsed is not None and verdict.effective is not None, verdict.violations
    digest = profile_hash(parsed)
    binding = {
        "name": "bench",
        "revision": revision_name("bench", digest),
        "hash": digest,
        "snapshot": verdict.effective.to_wire(),
        "boundAt": format_timestamp(now),
    }
    pools = (runners + POOL_SIZE - 1) // POOL_SIZE
    views = [
        RunnerView(
            namespace=NS,
            name=f"pool-{i % pools}-{i // pools}",  # the StatefulSet's Pod names, as the bench's runners
            pool=f"pool-{i % pools}",
            provider="anthropic",
            schedulable=True,
            default_model=MODEL,
            models=frozenset(RUNNER_MODELS),
            capabilities=frozenset(RUNNER_CAPABILITIES),
            labels=RUNNER_LABELS,
            concurrency=concurrency,
            credential_generation=1,
        )
        for i in range(runners)
    ]
    job = job_body("job-00000")
    job["metadata"] |= {"namespace": NS, "generation": 1, "resourceVersion": "1"}
    decision = decide_route(
        job=RoutingJob(namespace=NS, name="job-00000", spec=AgentJobSpec.model_validate(job["spec"])),
        binding=ProfileBinding.model_validate(binding),
        runners=views,
        active_jobs={},
        now=now,
    )
    assert decision.choice is not None, decision.message
    return route_step(agentjob.parse_agent_job(job), decision=decision, binding=binding, now=now).status


RAW_STATUSES = ("router", "one-candidate", "assignment-only")
"""What the like-for-like raw phases write (``--raw-status``): the router's status; the same with
its candidate table cut to the selected row; only the assignment, Routed/Ready and ``decidedAt``
(the least any router could write to say where a job runs). The last two are not what Helmhive
writes: they bound what a smaller status could gain."""


def trim_like_router_status(status: dict[str, Any], variant: str) -> dict[str, Any]:
    """``status`` (from :func:`build_like_router_status`) as ``variant`` of :data:`RAW_STATUSES`. Pure."""
    routing = status["routing"]
    if variant == "one-candidate":
        return {**status, "routing": {**routing, "candidates": routing["candidates"][:1]}}
    if variant == "assignment-only":
        return {k: status[k] for k in ("assignment", "conditions")} | {"routing": {"decidedAt": routing["decidedAt"]}}
    return status


def like_router_patches(status: dict[str, Any]) -> Callable[[str, int], bytes]:
    """Merge-patch bodies of ``status``, each a real change (``routing.attempts`` and ``decidedAt`` move on)."""
    base = dt.datetime.now(dt.UTC)

    def body(_: str, i: int) -> bytes:
        routing = {**status["routing"], "attempts": i % 1000,
                   "decidedAt": format_timestamp(base + dt.timedelta(seconds=i))}  # fmt: skip
        return orjson.dumps({"status": {**status, "routing": routing}})

    return body


def like_router_puts(status: dict[str, Any], versions: dict[str, str]) -> Callable[[str, int], bytes]:
    """PUT bodies of the status subresource as the router sends them since it replaces the status
    (``StatusPatch.replacement``): ``status`` whole, the name and the resourceVersion last seen.
    """
    patches = like_router_patches(status)

    def body(name: str, i: int) -> bytes:
        meta = {"name": name, "namespace": RAW_NS, "resourceVersion": versions[name]}
        return orjson.dumps({"apiVersion": API_VERSION, "kind": "AgentJob", "metadata": meta,
                             "status": orjson.loads(patches(name, i))["status"]})  # fmt: skip

    return body


def tiny_patch(_: str, i: int) -> bytes:
    """The issue's raw patch: a tiny ``status`` (two counters), as the benchmark has always sent it."""
    return json.dumps({"status": {"attempts": i % 60000, "routing": {"attempts": i % 1000}}}).encode()


async def hammer(
    admin: httpx.AsyncClient,
    jobs: list[str],
    body: Callable[[str, int], bytes],
    *,
    width: int,
    duration: float,
    probe: CpuProbe,
    versions: dict[str, str] | None = None,
    profile: Path | None = None,
    namespace: str = RAW_NS,
) -> dict[str, Any]:
    """Merge-patch the jobs' status for ``duration`` with ``width`` in flight (each slot its own jobs);
    with ``versions`` (each job's resourceVersion, kept up to date here), PUT it instead. With
    ``profile``, the API server's CPU profile over the window is written there (pprof format).

    Returns patches per second and the window's CPU (the probe read at its ends) per patch.
    """
    done = 0
    stop = time.monotonic() + duration
    put = versions is not None
    headers = {"Content-Type": "application/json" if put else "application/merge-patch+json"}

    async def one(slot: int) -> None:
        nonlocal done
        i = 0
        while time.monotonic() < stop:
            name = jobs[(slot + i * width) % len(jobs)]
            url = f"{GROUP_PATH}/namespaces/{namespace}/agentjobs/{name}/status"
            send = admin.put if put else admin.patch
            response = await send(url, content=body(name, i), headers=headers)
            response.raise_for_status()
            if versions is not None:
                versions[name] = response.json()["metadata"]["resourceVersion"]
            done += 1
            i += 1

    # The API server's own CPU profile over the window (``--apiserver-profile``), to say where it goes.
    pprof = (
        asyncio.create_task(
            admin.get("/debug/pprof/profile", params={"seconds": max(1, int(duration) - 1)}, timeout=duration + 60)
        )
        if profile is not None
        else None
    )
    before = probe.sample()
    await asyncio.gather(*(one(s) for s in range(width)))
    after = probe.sample()
    if pprof is not None and profile is not None:
        response = await pprof
        response.raise_for_status()
        await asyncio.to_thread(profile.write_bytes, response.content)
    return {"rate": done / (after.at - before.at), "cpu": cpu_window(before, after, done)}


async def tiny_on_fresh_jobs(
    admin: httpx.AsyncClient, *, namespace: str, prefix: str, seconds: float, writers: int, probe: CpuProbe
) -> dict[str, Any]:
    """The tiny patch's rate (and CPU per patch) on ``writers * 4`` fresh jobs created in ``namespace``."""
    fresh = [f"{prefix}-{i}" for i in range(writers * 4)]
    for name in fresh:
        response = await admin.post(f"{GROUP_PATH}/namespaces/{namespace}/agentjobs", json=job_body(name))
        response.raise_for_status()
    return await hammer(admin, fresh, tiny_patch, width=writers, duration=seconds, probe=probe, namespace=namespace)


async def raw_patch_rate(
    admin: httpx.AsyncClient,
    *,
    seconds: float,
    writers: int,
    probe: CpuProbe,
    like_router: dict[str, Any],
    profiles: Path | None = None,
    warmup: float = 0.0,
) -> dict[str, Any]:
    """Status merge-patches per second by a plain client: tiny ones (the issue's raw rate), ``writers``
    in flight then one at a time; then ones the shape and size of the router's write (``like_router``),
    ``writers`` in flight for ``seconds`` too, as a merge patch and as the router's PUT. Each phase
    with its CPU per patch, and with ``profiles`` the API server's CPU profile of each phase there.

    The tiny patch first runs untimed for ``warmup`` seconds: a control plane just started (and
    just given the CRDs, whose OpenAPI it builds in the background) serves it slower than it will
    a moment later, and the raw rate is the ratio's denominator. Last, the tiny patch runs again
    on fresh jobs (``tiny_fresh_again``), so the run shows how steady that denominator was.
    """

    def profile(phase: str) -> Path | None:
        return profiles / f"apiserver-{phase}.pb.gz" if profiles is not None else None

    await admin.post("/api/v1/namespaces", json={"metadata": {"name": RAW_NS}})
    jobs = [f"raw-{i}" for i in range(writers * 4)]
    for name in jobs:
        response = await admin.post(f"{GROUP_PATH}/namespaces/{RAW_NS}/agentjobs", json=job_body(name))
        response.raise_for_status()
    warm = await hammer(admin, jobs, tiny_patch, width=writers, duration=warmup, probe=probe) if warmup > 0 else None
    parallel = await hammer(admin, jobs, tiny_patch, width=writers, duration=seconds, probe=probe,
                            profile=profile("tiny"))  # fmt: skip
    sequential = await hammer(admin, jobs, tiny_patch, width=1, duration=seconds / 2, probe=probe)
    like = await hammer(admin, jobs, like_router_patches(like_router), width=writers, duration=seconds,
                        probe=probe, profile=profile("like-router-patch"))  # fmt: skip
    # The same status as the router writes it now: a conditional PUT of the whole status.
    versions: dict[str, str] = {}
    for name in jobs:
        got = (await admin.get(f"{GROUP_PATH}/namespaces/{RAW_NS}/agentjobs/{name}")).json()
        versions[name] = got["metadata"]["resourceVersion"]
    like_put = await hammer(admin, jobs, like_router_puts(like_router, versions), width=writers, duration=seconds,
                            probe=probe, versions=versions, profile=profile("like-router-put"))  # fmt: skip
    # The tiny patch again, now that each job holds a routed-size status: the API server's cost
    # follows the stored object, not the patch.
    tiny_on_routed = await hammer(admin, jobs, tiny_patch, width=writers, duration=seconds / 2, probe=probe,
                                  profile=profile("tiny-on-routed"))  # fmt: skip
    stored = (await admin.get(f"{GROUP_PATH}/namespaces/{RAW_NS}/agentjobs/{jobs[0]}")).json()
    again = await tiny_on_fresh_jobs(admin, namespace=RAW_NS, prefix="raw-again", seconds=seconds / 2,
                                     writers=writers, probe=probe)  # fmt: skip
    await admin.delete(f"/api/v1/namespaces/{RAW_NS}")
    return {
        "parallel": parallel["rate"],
        "sequential": sequential["rate"],
        "writers": writers,
        "like_router": like["rate"],
        "like_router_put": like_put["rate"],
        "tiny_on_routed": tiny_on_routed["rate"],
        "warmup_seconds": warmup,
        "tiny_warmup": warm["rate"] if warm is not None else None,
        "tiny_fresh_again": again["rate"],
        "stored_bytes": len(orjson.dumps(stored)),
        "managed_fields_bytes": len(orjson.dumps(stored["metadata"].get("managedFields") or [])),
        "like_router_status_bytes": len(orjson.dumps(stored.get("status") or {})),
        "cpu": {
            "parallel": parallel["cpu"],
            "sequential": sequential["cpu"],
            "like_router": like["cpu"],
            "like_router_put": like_put["cpu"],
            "tiny_on_routed": tiny_on_routed["cpu"],
            **({"tiny_warmup": warm["cpu"]} if warm is not None else {}),
            "tiny_fresh_again": again["cpu"],
        },
    }


# 2. Runners --------------------------------------------------------------------------------------


def create_pools(api: client.ApiClient, runners: int, concurrency: int) -> list[str]:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    wait(lambda: core.read_namespaced_service_account("default", NS), 60, "the default ServiceAccount")
    core.create_namespaced_secret(
        NS, client.V1Secret(metadata=client.V1ObjectMeta(name="bench-key"), string_data={"api-key": "sk-bench"})
    )
    names = [f"pool-{i}" for i in range((runners + POOL_SIZE - 1) // POOL_SIZE)]
    for i, name in enumerate(names):
        spec = {
            "provider": "anthropic",
            "adapter": {"type": "claude-cli"},
            "image": "ghcr.io/helmhive/runner:bench",
            "credential": {"secretRef": {"name": "bench-key", "key": "api-key"}},
            "placementLabels": RUNNER_LABELS,
            "capabilities": RUNNER_CAPABILITIES,
            "concurrency": concurrency,
            "replicas": min(POOL_SIZE, runners - i * POOL_SIZE),
            # Long Leases: the runners' own write rate stays out of the routing figures.
            "heartbeat": {"leaseDurationSeconds": 300, "renewIntervalSeconds": 60, "reportRefreshSeconds": 3600},
        }
        body = {"apiVersion": "helmhive.dev/v1alpha1", "kind": "RunnerPool", "metadata": {"name": name}, "spec": spec}
        custom.create_namespaced_custom_object("helmhive.dev", "v1alpha1", NS, "runnerpools", body)
    return names


def mint_runners(api: client.ApiClient, count: int) -> list[SimRunner]:
    core = client.CoreV1Api(api)
    wait(lambda: len(core.list_namespaced_pod(NS).items) == count, 300, f"{count} pods")
    out = []
    for pod in sorted(core.list_namespaced_pod(NS).items, key=lambda p: p.metadata.name):
        pool = pod.metadata.labels["helmhive.dev/pool"]
        sa = f"helmhive-runner-{pool}"
        wait(lambda sa=sa: core.read_namespaced_service_account(sa, NS), 60, f"ServiceAccount {sa}")
        ref = client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid)
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(expiration_seconds=6 * 3600, bound_object_ref=ref)
        )
        token = core.create_namespaced_service_account_token(sa, NS, request).status.token
        out.append(SimRunner(name=pod.metadata.name, pool=pool, token=token))
    return out


# 3. The burst ----------------------------------------------------------------------------------


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


# 5. decide_route alone ----------------------------------------------------------------------------


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


# Orchestration --------------------------------------------------------------------------------------


async def restart_and_route_one(
    workdir: Path,
    env: dict[str, str],
    operator: subprocess.Popen[bytes],
    admin: httpx.AsyncClient,
    result: dict[str, Any],
) -> subprocess.Popen[bytes]:
    """Stop the operator (SIGTERM) and start it again; time its recovery over everything that exists.

    Recovery is measured two ways: until its liveness endpoint answers (Kopf has listed every
    watched kind and filled the indexes), and until a job created right after the start is
    assigned (the router decided over the rebuilt indexes, with every earlier job counted).
    """
    print("restarting the operator over everything that exists ...", flush=True)
    operator.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        operator.wait(timeout=60)
    started = time.monotonic()
    # Opt-in, for profiling the restart only: e.g. HELMHIVE_BENCH_RESTART_PREFIX="memray run -o /tmp/op.bin"
    # runs the restarted operator as `memray run -o /tmp/op.bin -m helmhive operator run ...`.
    prefix = shlex.split(os.environ.get("HELMHIVE_BENCH_RESTART_PREFIX", ""))
    lists_before = await list_counts(admin)
    fresh, health = start_operator(workdir / "operator.kubeconfig", workdir, env, prefix=prefix)
    await asyncio.to_thread(wait, lambda: httpx.get(health, timeout=2).status_code == 200, 600, "liveness again")
    live = time.monotonic() - started
    print(f"  liveness after {live:.1f} s", flush=True)
    (await admin.post(f"{GROUP_PATH}/namespaces/{NS}/agentjobs", json=job_body("after-restart"))).raise_for_status()
    synced: float | None = None
    last_note = time.monotonic()
    while True:
        if synced is None and _store_synced(health):
            synced = time.monotonic() - started
            print(f"  job store synced after {synced:.1f} s", flush=True)
        job = (await admin.get(f"{GROUP_PATH}/namespaces/{NS}/agentjobs/after-restart")).json()
        if (job.get("status") or {}).get("assignment") or _routed_false(job):
            break
        if time.monotonic() - last_note > 15:
            last_note = time.monotonic()
            rss, cpu = rss_kib(fresh.pid)[0] / 1024, cpu_seconds(fresh.pid)
            print(f"  {last_note - started:.0f} s after the restart: the new job is not routed yet "
                  f"(RSS {rss:.0f} MiB, CPU {cpu:.1f} s)", flush=True)  # fmt: skip
        await asyncio.sleep(0.2)
    routed = time.monotonic() - started
    if synced is None and _store_synced(health):
        synced = routed
    # Kopf caches its probes' answers for 10 s, so the probe may not have said so yet: the
    # operator's own log line gives the time from its start-up (the process start, a little later).
    logged = synced_from_log((workdir / "operator.log").read_text(errors="replace"))
    result["restart"] = {
        "liveness_seconds": live,
        "store_synced_seconds": synced,
        "store_synced_logged_seconds": logged,
        "first_job_assigned_seconds": routed,
        "first_job_outcome": "assigned" if (job.get("status") or {}).get("assignment") else "not assigned",
        "first_job_reason": _routed_reason(job),
        "operator_rss_kib": rss_kib(fresh.pid)[0],
        "operator_rss_peak_kib": rss_kib(fresh.pid)[1],
        "operator_cpu_seconds": cpu_seconds(fresh.pid),
        # The restarted operator's LISTs until then, by resource (the benchmark lists none meanwhile).
        "lists": dict(await list_counts(admin) - lists_before),
    }
    print(f"  {result['restart']}", flush=True)
    return fresh


async def list_counts(http: httpx.AsyncClient) -> Counter[str]:
    """Cumulative LIST requests the API server has answered, by resource."""
    counts: Counter[str] = Counter()
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith("apiserver_request_total{") and 'verb="LIST"' in line:
            resource = re.search(r'resource="([^"]*)"', line)
            counts[resource.group(1) if resource else ""] += int(float(line.rsplit(" ", 1)[1]))
    return counts


async def note_while(what: str, pid: int, every: float = 15.0) -> None:
    """Print a line every ``every`` seconds until cancelled, so a long phase shows it is alive."""
    started = time.monotonic()
    while True:
        await asyncio.sleep(every)
        rss = rss_kib(pid)[0] / 1024
        print(f"  {what}: {time.monotonic() - started:.0f} s (operator RSS {rss:.0f} MiB)", flush=True)


_SYNCED_LINE = re.compile(r"agentjob store synced: .*?, ([0-9.]+) s after start-up")


def synced_from_log(text: str) -> float | None:
    """Seconds from the operator's start-up to its job store's first sync, from its log; None if absent. Pure."""
    found = _SYNCED_LINE.search(text)
    return float(found.group(1)) if found else None


def _synced_text(again: dict[str, Any]) -> str:
    """How the restart's sync is reported: by the probe when it saw it, else by the operator's log."""
    if again.get("store_synced_seconds") is not None:
        return f"after {again['store_synced_seconds']:.1f} s (its probe)"
    if again.get("store_synced_logged_seconds") is not None:
        return f"{again['store_synced_logged_seconds']:.1f} s after its start-up (its log)"
    return "at an unknown time (neither its probe nor its log said)"


def _store_synced(health: str) -> bool:
    """The routing probe says the operator's job store is synced (it routes nothing before)."""
    try:
        probes = httpx.get(health, timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return False
    return bool((probes.get("routing") or {}).get("synced"))


def _routed_reason(job: dict[str, Any]) -> str:
    conditions = (job.get("status") or {}).get("conditions") or []
    return next((str(c.get("reason")) for c in conditions if c.get("type") == "Routed"), "")


def _routed_false(job: dict[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Routed" and c.get("status") == "False" for c in conditions)


def start_profile(pid: int, path: Path | None) -> subprocess.Popen[bytes] | None:
    """``py-spy record`` on the operator (50 samples a second, GIL holders only, raw stacks) into ``path``."""
    if path is None:
        return None
    spy = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen(
        [str(spy), "record", "-p", str(pid), "-r", "50", "--gil", "-f", "raw", "-o", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop_profile(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(timeout=60)


class Backlog:
    """The backlog mode: the operator is stopped while the client creates every job, then started.

    What it times is the router alone: from the operator's start (and from its first assignment)
    to the last assignment, with the whole backlog already in the API server, so the client's
    creates do not bound the rate. The operator's CPU is sampled, so its start-up (Kopf's
    indexes, the job store's LIST) can be told from the routing.
    """

    def __init__(
        self,
        operator: subprocess.Popen[bytes],
        workdir: Path,
        env: dict[str, str],
        profile: Path | None,
        probe: CpuProbe,
    ) -> None:
        self.operator = operator
        self.probe = probe
        self.workdir = workdir
        self.env = env
        self.profile = profile
        self.profile_run: subprocess.Popen[bytes] | None = None
        self.samples: list[tuple[float, float]] = []  # (monotonic, operator CPU seconds)
        self.sampler: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        self.operator.terminate()
        await asyncio.to_thread(self.operator.wait, 60)
        self.probe.pids.pop("operator", None)

    async def __call__(self) -> None:
        self.started = time.monotonic()
        self.operator, _ = start_operator(self.workdir / "operator.kubeconfig", self.workdir, self.env)
        self.probe.pids["operator"] = self.operator.pid
        self.profile_run = start_profile(self.operator.pid, self.profile)
        self.sampler = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            while True:
                self.samples.append((time.monotonic(), cpu_seconds(self.operator.pid)))
                await asyncio.sleep(0.1)

    def figures(self, first_assigned: float | None) -> dict[str, float]:
        """The operator's CPU from its start, and from just before its first assignment, to now."""
        if self.sampler is not None:
            self.sampler.cancel()
        total = cpu_seconds(self.operator.pid)
        first = self.started + (first_assigned or 0.0)
        before = [cpu for at, cpu in self.samples if at <= first]
        at_first = before[-1] if before else 0.0
        return {"cpu_seconds_to_last": total, "cpu_seconds_before_first": at_first}


def start_operator(
    kubeconfig: Path, workdir: Path, env: dict[str, str], *, prefix: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    health, webhook = free_ports(2)
    log = (workdir / "operator.log").open("wb")
    proc = subprocess.Popen(
        [*(prefix or [sys.executable]), "-m", "helmhive", "operator", "run", "--kubeconfig", str(kubeconfig),
         f"--liveness=http://127.0.0.1:{health}/healthz", "--webhook-addr=127.0.0.1", "--webhook-host=127.0.0.1",
         f"--webhook-port={webhook}"],
        stdout=log, stderr=subprocess.STDOUT,
        env={**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, **env},
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{health}/healthz"


async def run(  # noqa: PLR0915
    args: argparse.Namespace, info: devcluster.ClusterInfo, layout: StateLayout, workdir: Path, probe: CpuProbe
) -> dict[str, Any]:
    api = config.new_client_from_config(config_file=str(info.kubeconfig))
    admin_tls = client_tls(ca_file=info.ca_file, cert_file=layout.pki.cert("admin"), key_file=layout.pki.key("admin"))
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    result: dict[str, Any] = {"args": vars(args), "load_average_start": os.getloadavg()}
    async with (
        httpx.AsyncClient(base_url=info.server, verify=admin_tls, limits=limits, timeout=60) as admin,
        httpx.AsyncClient(
            base_url=info.server, verify=client_tls(ca_file=info.ca_file), limits=limits, timeout=60
        ) as http,  # fmt: skip
    ):
        print(f"raw status-patch rates, tiny and like the router's, {args.raw_seconds:g} s each "
              f"({args.writers} in flight) ...", flush=True)  # fmt: skip
        like_router = trim_like_router_status(
            build_like_router_status(runners=args.runners, concurrency=args.concurrency, now=dt.datetime.now(dt.UTC)),
            args.raw_status,
        )
        result["raw"] = await raw_patch_rate(admin, seconds=args.raw_seconds, writers=args.writers, probe=probe,
                                             like_router=like_router, profiles=args.apiserver_profile,
                                             warmup=args.raw_warmup)  # fmt: skip
        raw = result["raw"]
        if args.apiserver_profile:
            print(f"  the API server's CPU profile of each phase: {args.apiserver_profile}/apiserver-*.pb.gz "
                  f"(read with: go tool pprof -top <kube-apiserver binary> <file>)", flush=True)  # fmt: skip
        print(f"  tiny {raw['parallel']:.0f}/s ({raw['sequential']:.0f}/s one at a time), like the router's "
              f"{raw['like_router']:.0f}/s (PUT {raw['like_router_put']:.0f}/s), "
              f"tiny on a routed-size job {raw.get('tiny_on_routed', 0):.0f}/s "
              f"(stored job {raw.get('stored_bytes', 0)} B, managedFields {raw.get('managed_fields_bytes', 0)} B)",
              flush=True)  # fmt: skip
        print(f"  the tiny patch's steadiness: {raw['tiny_warmup'] or 0:.0f}/s in the {raw['warmup_seconds']:g} s "
              f"warm-up (untimed), {raw['parallel']:.0f}/s measured, {raw['tiny_fresh_again']:.0f}/s on fresh "
              f"jobs again at the end", flush=True)  # fmt: skip
        await asyncio.to_thread(
            wait, lambda: client.CoreV1Api(api).list_namespace(field_selector=f"metadata.name={RAW_NS}").items == [],
            180, "the scratch namespace to go",
        )  # fmt: skip
        if args.raw_only:
            return result

        env = {"HELMHIVE_ROUTING_QPS": str(args.qps), "HELMHIVE_ROUTING_BURST": str(args.burst)}
        operator, health = start_operator(operator_kubeconfig(api, info, workdir / "operator.kubeconfig"), workdir, env)
        probe.pids["operator"] = operator.pid
        try:
            await asyncio.to_thread(wait, lambda: httpx.get(health, timeout=2).status_code == 200, 60, "liveness")
            create_pools(api, args.runners, args.concurrency)
            runners = await asyncio.to_thread(mint_runners, api, args.runners)
            pools_url = f"{GROUP_PATH}/namespaces/{NS}/runnerpools"

            async def generation() -> int:
                pools = (await admin.get(pools_url)).json()["items"]
                gens = [int((p.get("status") or {}).get("credentialGeneration") or 0) for p in pools]
                return min(gens) if gens else 0

            while await generation() < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.5)
            fleet = RoutingFleet(http, NS, renew=60, lease=300, refresh=3600, concurrency=args.concurrency,
                                 generation=await generation())  # fmt: skip
            gate = asyncio.Semaphore(16)

            async def register(r: SimRunner) -> None:
                async with gate:
                    await fleet.register(r)

            started = time.monotonic()
            await asyncio.gather(*(register(r) for r in runners))
            beats = [asyncio.create_task(fleet.run(r)) for r in runners]

            async def schedulable() -> int:
                pools = (await admin.get(pools_url)).json()["items"]
                return sum(int((p.get("status") or {}).get("schedulableRunners") or 0) for p in pools)

            while await schedulable() < args.runners:  # noqa: ASYNC110
                await asyncio.sleep(0.5)
            print(f"{args.runners} runners schedulable after {time.monotonic() - started:.1f} s", flush=True)
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
            await asyncio.sleep(5)  # let registration audits and events settle before counting
            writes_before = await write_counts(admin)
            cpu_before = cpu_seconds(operator.pid)
            rss_before = rss_kib(operator.pid)
            pace = f"at {args.rate:g} a second" if args.rate else "as fast as the client can"
            release = None
            if args.backlog:
                pace += ", the operator stopped until every job exists"
                release = Backlog(operator, workdir, env, args.profile, probe)
                await release.stop()
                cpu_before, rss_before = 0.0, (0, 0)
            profile_run = start_profile(operator.pid, args.profile) if args.profile and not args.backlog else None
            print(f"creating {args.jobs} jobs {pace} ...", flush=True)
            sampler = asyncio.create_task(probe.run())
            result["burst"] = await burst(admin, jobs=args.jobs, limit=args.timeout, rate=args.rate, release=release)
            sampler.cancel()
            probe.samples.append(probe.sample())
            first_at, last_at = result["burst"].pop("assigned_at")
            if result["burst"]["assigned"]:
                result["burst"]["cpu"] = cpu_window(probe.at(result["burst"]["started"]), probe.at(last_at),
                                                    result["burst"]["assigned"])  # fmt: skip
                name = min(result["burst"]["runner_of"])
                routed = (await admin.get(f"{GROUP_PATH}/namespaces/{NS}/agentjobs/{name}")).json()
                result["burst"]["routed_status_bytes"] = len(orjson.dumps(routed.get("status") or {}))
            result["burst"].pop("runner_of")
            result["ratios"] = ratios(result)
            if release is not None:
                operator = release.operator
                found = result["burst"]["backlog"] or {}
                result["burst"]["backlog"] = {**found, **release.figures(found.get("first_assigned_seconds"))}
                if result["burst"]["assigned"] > 1:
                    # The routing alone: neither the client's creates nor the operator's start-up.
                    result["burst"]["backlog"]["cpu"] = cpu_window(probe.at(first_at), probe.at(last_at),
                                                                   result["burst"]["assigned"] - 1)  # fmt: skip
                profile_run = release.profile_run
            stop_profile(profile_run)
            waiting_note = asyncio.create_task(note_while("waiting for every routing audit record", operator.pid))
            # Audits are written off the assignment path: count the writes once every one is there.
            audits_url = f"{GROUP_PATH}/namespaces/{NS}/auditrecords"
            selector = {"labelSelector": "helmhive.dev/audit-action=RoutingDecisions"}

            async def routed_decisions() -> int:
                records = (await admin.get(audits_url, params=selector)).json()["items"]
                result["burst"]["audit_batches"] = len(records)
                return sum(d["spec"]["action"] == "JobRouted" for d in iter_routing_decisions(records))

            while await routed_decisions() < result["burst"]["assigned"]:  # noqa: ASYNC110
                await asyncio.sleep(1)
            result["burst"]["audits_done_seconds"] = time.monotonic() - result["burst"].pop("started")
            waiting_note.cancel()
            result["operator_cpu_seconds"] = cpu_seconds(operator.pid) - cpu_before
            # Each runner's aggregated JobsRouted Event has its count patched at most every 30 s:
            # wait one interval so those writes are counted too (the CPU figure stops before it).
            await asyncio.sleep(EVENT_INTERVAL_SECONDS + 3)
            writes = await write_counts(admin) - writes_before
            result["operator_rss_kib"] = {"before": rss_before[0], "after": rss_kib(operator.pid)[0],
                                          "peak": rss_kib(operator.pid)[1]}  # fmt: skip
            result["writes"] = dict(writes)
            if args.idle_seconds > 0:
                print(f"idle window: {args.idle_seconds:g} s with every job assigned, only heartbeats ...", flush=True)
                idle_cpu = cpu_seconds(operator.pid)
                idle_writes = await write_counts(admin)
                await asyncio.sleep(args.idle_seconds)
                during = await write_counts(admin) - idle_writes
                result["idle"] = {
                    "seconds": args.idle_seconds,
                    "operator_cpu_seconds": cpu_seconds(operator.pid) - idle_cpu,
                    "operator_rss_kib": rss_kib(operator.pid)[0],
                    "writes": dict(during),
                    "heartbeat_writes_per_second": sum(during[k] for k in ("leases", "runners/status"))
                    / args.idle_seconds,
                }
                print(f"  {result['idle']}", flush=True)
            if args.restart:
                operator = await restart_and_route_one(workdir, env, operator, admin, result)
            fleet.stop.set()
            for task in beats:
                task.cancel()
            over = {r: n for r, n in result["burst"]["per_runner"].items() if n > args.concurrency}
            result["over_committed_runners"] = over
            result["burst"]["per_runner"] = {
                "runners_used": len(result["burst"]["per_runner"]),
                "max_jobs_on_one_runner": max(result["burst"]["per_runner"].values(), default=0),
            }
        finally:
            operator.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                operator.wait(timeout=30)
        # The tiny patch once more, after the routing, with the operator stopped and the runners
        # quiet: the machine's speed drifts over minutes, so the backlog's ratio is also given
        # against the mean of the tiny rates measured before and after it.
        print("the tiny patch on fresh jobs again, after the run (the operator stopped) ...", flush=True)
        probe.pids.pop("operator", None)
        (await admin.post("/api/v1/namespaces", json={"metadata": {"name": AFTER_NS}})).raise_for_status()
        after = await tiny_on_fresh_jobs(admin, namespace=AFTER_NS, prefix="after", seconds=args.raw_seconds / 2,
                                         writers=args.writers, probe=probe)  # fmt: skip
        result["raw"]["tiny_after_run"] = after["rate"]
        result["raw"]["cpu"]["tiny_after_run"] = after["cpu"]
        result["ratios"] = ratios(result)
    fleets = (False, True) if RunnerSet is not None else (False,)
    result["decide_route"] = [time_decide_route(n, fleet=f) for n in (200, 1000) for f in fleets]
    result["load_average_end"] = os.getloadavg()
    return result


def cluster_pids(layout: StateLayout) -> dict[str, int]:
    """The pids whose CPU the bench reads: this cluster's kube-apiserver and etcd (their pid records,
    checked against the kernel's start time), and the bench process itself (client, watch, runners).
    """
    pids = {"bench client": os.getpid()}
    for name in ("kube-apiserver", "etcd"):
        record = read_record(layout.pids, name)
        if record is None or not is_alive(record.pid, record.start_ticks):
            raise SystemExit(f"no live {name} recorded in {layout.pids}")
        pids[name] = record.pid
    return pids


CPU_COLUMNS = ("kube-apiserver", "etcd", "operator", "bench client")


def ratios(result: dict[str, Any]) -> dict[str, float | None]:
    """Routing throughput over the raw rates: the tiny patch (the issue's) and the like-for-like one.

    ``backlog_to_raw`` divides by the tiny rate measured first (the figure the docs report);
    ``backlog_to_raw_again`` by the one measured on fresh jobs at the raw phases' end; and
    ``backlog_to_raw_bracket`` by the mean of the first and of the one measured after the run
    (the operator stopped), so the routing sits in time between the two rates it is divided by.
    """
    raw, b = result["raw"], result["burst"]
    backlog = (b.get("backlog") or {}).get("jobs_per_second_first_to_last")
    again, after = raw.get("tiny_fresh_again"), raw.get("tiny_after_run")
    bracket = (raw["parallel"] + after) / 2 if after else None
    return {
        "burst_to_raw": b["jobs_per_second"] / raw["parallel"],
        "burst_to_like_router": b["jobs_per_second"] / raw["like_router"],
        "burst_to_like_router_put": b["jobs_per_second"] / raw["like_router_put"],
        "backlog_to_raw": backlog / raw["parallel"] if backlog else None,
        "backlog_to_raw_again": backlog / again if backlog and again else None,
        "backlog_to_raw_bracket": backlog / bracket if backlog and bracket else None,
        "backlog_to_like_router": backlog / raw["like_router"] if backlog else None,
        "backlog_to_like_router_put": backlog / raw["like_router_put"] if backlog else None,
    }


def render_cpu(result: dict[str, Any]) -> list[str]:
    """The CPU table: each window's CPU per patch (raw phases) or per routed job, and the machine's busy cores."""
    raw, b = result["raw"], result["burst"]
    writers = raw["writers"]
    rows = [
        (f"raw tiny patches, {writers} in flight", raw["cpu"]["parallel"]),
        ("raw tiny patches, one at a time", raw["cpu"]["sequential"]),
        (f"raw patches like the router's, {writers} in flight", raw["cpu"]["like_router"]),
        (f"raw PUTs of that status, {writers} in flight", raw["cpu"].get("like_router_put")),
        (f"raw tiny patches on routed-size jobs, {writers}", raw["cpu"].get("tiny_on_routed")),
        (f"raw tiny patches, fresh jobs again, {writers}", raw["cpu"].get("tiny_fresh_again")),
        (f"raw tiny patches after the run, {writers}", raw["cpu"].get("tiny_after_run")),
        ("burst, first create to last assignment", b.get("cpu")),
        ("backlog, first to last assignment", (b.get("backlog") or {}).get("cpu")),
    ]
    head = f"{'CPU ms per patch / per routed job':44}{'seconds':>8}{'count':>7}"
    lines = [head + "".join(f"{c:>15}" for c in CPU_COLUMNS) + f"{'their cores':>12}{'busy cores':>12}"]
    for label, window in rows:
        if window is None:
            continue
        per = window["ms_per_item"]
        cells = "".join(f"{per[c]:15.2f}" if c in per else f"{'-':>15}" for c in CPU_COLUMNS)
        ours, busy = window.get("processes_cores") or 0, window["machine_busy_cores"] or 0
        lines.append(f"{label:44}{window['seconds']:8.1f}{window['count']:7d}{cells}{ours:12.2f}{busy:12.2f}")
    lines.append(f"(their cores: these processes' CPU over the window; busy cores: the whole machine's, of "
                 f"{os.cpu_count()}, anyone's processes; the bench client is this process: its patches, its "
                 "watch and the runners' heartbeats; -: not running over the whole window)")  # fmt: skip
    return lines


def render_raw(result: dict[str, Any]) -> str:
    """The raw phases alone (``--raw-only``): each one's rate and its CPU per write."""
    raw, variant = result["raw"], result["args"]["raw_status"]
    api = {k: v["ms_per_item"].get("kube-apiserver", 0.0) for k, v in raw["cpu"].items()}
    lines = [
        f"raw status writes by a plain client, {raw['writers']} in flight; like-for-like status: {variant} "
        f"({raw['like_router_status_bytes']} B stored, the stored job {raw['stored_bytes']} B)",
        f"  tiny patch on fresh jobs: {raw['parallel']:.0f}/s, API server {api['parallel']:.2f} ms per write",
        f"  that status, merge patch: {raw['like_router']:.0f}/s, API server {api['like_router']:.2f} ms "
        f"(ratio of rates to the tiny patch {raw['like_router'] / raw['parallel']:.3f})",
        f"  that status, PUT: {raw['like_router_put']:.0f}/s, API server {api['like_router_put']:.2f} ms "
        f"(ratio {raw['like_router_put'] / raw['parallel']:.3f})",
        f"  tiny patch on jobs holding that status: {raw['tiny_on_routed']:.0f}/s, API server "
        f"{api['tiny_on_routed']:.2f} ms",
        f"  tiny patch on fresh jobs again, at the end: {raw['tiny_fresh_again']:.0f}/s, API server "
        f"{api['tiny_fresh_again']:.2f} ms (in the untimed {raw['warmup_seconds']:g} s warm-up: "
        f"{raw['tiny_warmup'] or 0:.0f}/s)",
    ]
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    args, raw, b, writes = result["args"], result["raw"], result["burst"], Counter(result["writes"])
    jobs = max(1, b["assigned"])
    fleet_writes = writes["leases"] + writes["runners/status"] + writes["runners"]
    writes["agentjobs"] -= b["jobs"]  # the client's own creates
    runner_side = ("leases", "runners", "runners/status")
    per_job = {k: v / jobs for k, v in sorted(writes.items()) if k not in runner_side and v / jobs >= 0.005}
    operator_writes = sum(v for k, v in writes.items() if k not in runner_side)
    lat = b["latency"]
    rss = result["operator_rss_kib"]
    lines = [
        f"{b['jobs']} jobs over {args['runners']} runners x {args['concurrency']} slots; operator QPS "
        f"{args['qps']:g} burst {args['burst']}; "
        + (f"steady arrival at {args['rate']:g} jobs/s" if args.get("rate") else "one burst"),
        f"raw status patches by a plain client: {raw['parallel']:.0f}/s with {raw['writers']} in flight, "
        f"{raw['sequential']:.0f}/s one at a time",
        f"assigned {b['assigned']}/{b['jobs']} in {b['wall_seconds']:.1f} s from the first create "
        f"(creates took {b['create_seconds']:.1f} s); {b['seen_waiting']} seen waiting for capacity; "
        f"every JobRouted decision recorded after {b['audits_done_seconds']:.1f} s "
        f"in {b.get('audit_batches', 0)} RoutingDecisions records",
        f"jobs routed per second: {b['jobs_per_second']:.1f} overall, "
        f"{(b['steady_jobs_per_second'] or 0):.1f} between 10% and 90% assigned",
        f"routing throughput / raw patch rate: {result['ratios']['burst_to_raw']:.3f} "
        f"(one status write per job at {args['qps']:g} QPS shared with audit records and events)",
        f"raw status patches like the router's write (the binding, {MAX_CANDIDATES} candidate rows, the "
        f"assignment, Routed/Ready; {raw['like_router_status_bytes']} B of status, a routed job's here "
        f"{b.get('routed_status_bytes', 0)} B): {raw['like_router']:.0f}/s with {raw['writers']} in flight",
        f"routing throughput / like-for-like patch rate: {result['ratios']['burst_to_like_router']:.3f}",
        f"the same status PUT whole, conditional (how the router writes it since it replaces the status): "
        f"{raw['like_router_put']:.0f}/s; routing throughput / that rate: "
        f"{result['ratios']['burst_to_like_router_put']:.3f}",
        f"raw tiny patches on the routed-size jobs: {raw.get('tiny_on_routed', 0):.0f}/s (stored job "
        f"{raw.get('stored_bytes', 0)} B, of it managedFields {raw.get('managed_fields_bytes', 0)} B)",
        "queue-to-assigned latency: p50 {queue_to_assigned_p50:.2f} s, p95 {queue_to_assigned_p95:.2f} s, "
        "max {queue_to_assigned_max:.2f} s (queue step p50 {queue_to_bound_p50:.2f} s; bound-to-assigned "
        "p50 {bound_to_assigned_p50:.2f} s, p95 {bound_to_assigned_p95:.2f} s)".format(**lat),
        f"API mutating calls per job, all writers except the runners' own: {operator_writes / jobs:.2f} "
        f"(+1 create by the client); by resource: " + ", ".join(f"{k} {v:.2f}" for k, v in per_job.items()),
        f"runner writes during the burst (Leases, reports): {fleet_writes}",
        f"operator: CPU {result['operator_cpu_seconds']:.1f} s; RSS "
        + (f"{rss['before'] / 1024:.0f} MiB before, " if rss["before"] else "(a fresh process: no before), ")
        + f"{rss['after'] / 1024:.0f} MiB after, peak {rss['peak'] / 1024:.0f} MiB",
        f"runners over their concurrency: {len(result['over_committed_runners'])} "
        f"(max jobs on one runner {b['per_runner']['max_jobs_on_one_runner']}, "
        f"runners used {b['per_runner']['runners_used']})",
    ]
    backlog = b.get("backlog")
    if backlog:
        routing_cpu = backlog["cpu_seconds_to_last"] - backlog["cpu_seconds_before_first"]
        lines.append(
            f"backlog (every job created before the operator started): first assignment "
            f"{backlog['first_assigned_seconds']:.1f} s after the operator's start, the last "
            f"{backlog['operator_started_to_last_seconds']:.1f} s after it; jobs routed per second "
            f"{backlog['jobs_per_second_from_start']:.1f} from the start, "
            f"{backlog['jobs_per_second_first_to_last'] or 0:.1f} from the first assignment to the last "
            f"(ratio to the raw rate {result['ratios']['backlog_to_raw'] or 0:.3f}, to the raw rate measured "
            f"again at the raw phases' end {result['ratios'].get('backlog_to_raw_again') or 0:.3f}, "
            f"to the mean of the raw rate and the one after the run "
            f"({raw.get('tiny_after_run') or 0:.0f}/s) {result['ratios'].get('backlog_to_raw_bracket') or 0:.3f}, "
            f"to the like-for-like rate {result['ratios']['backlog_to_like_router'] or 0:.3f}, "
            f"to the PUT rate {result['ratios']['backlog_to_like_router_put'] or 0:.3f}); "
            f"operator CPU {backlog['cpu_seconds_before_first']:.1f} s before the first assignment "
            f"(start-up), {routing_cpu:.1f} s from it to the last ({1000 * routing_cpu / jobs:.1f} ms per job)"
        )
    lines += render_cpu(result)
    if "idle" in result:
        idle = result["idle"]
        lines.append(
            f"at rest ({idle['seconds']:g} s, every job assigned, heartbeats only): operator CPU "
            f"{idle['operator_cpu_seconds']:.2f} s "
            f"({100 * idle['operator_cpu_seconds'] / idle['seconds']:.1f}% of a core), "
            f"RSS {idle['operator_rss_kib'] / 1024:.0f} MiB; runner heartbeat writes (Leases, reports) "
            f"{idle['heartbeat_writes_per_second']:.1f}/s with {args['runners']} runners renewing every 60 s "
            f"(the default renewal is every 5 s: {args['runners'] / 5:.0f} Lease writes/s)"
        )
    if "restart" in result:
        again = result["restart"]
        lines.append(
            f"restart over everything: live after {again['liveness_seconds']:.1f} s, job store synced "
            f"{_synced_text(again)}, a new job routed "
            f"({again['first_job_outcome']}: {again['first_job_reason'] or '-'}) "
            f"{again['first_job_assigned_seconds']:.1f} s after the start; "
            f"RSS {again['operator_rss_kib'] / 1024:.0f} MiB (peak {again['operator_rss_peak_kib'] / 1024:.0f} MiB), "
            f"CPU {again['operator_cpu_seconds']:.1f} s; LISTs until then {again.get('lists')}"
        )
    lines.append(
        "load average (1, 5, 15 min) at the start: {:.1f} {:.1f} {:.1f}; at the end: {:.1f} {:.1f} {:.1f}".format(
            *result["load_average_start"], *result["load_average_end"]
        )
    )
    for timing in result["decide_route"]:
        lines.append(
            f"decide_route alone, {timing['runners']} runners"
            + (" (a RunnerSet, as the router passes them)" if timing.get("fleet") else " (a plain list)")
            + ": "
            f"p50 {timing['p50_ms']:.2f} ms, p95 {timing['p95_ms']:.2f} ms"
        )
    return "\n".join(lines)


def print_decide_times(repeats: int = 500) -> None:
    """decide_route now, and the implementation it replaced (the tests' oracle), in the same run."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runners", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=10, help="slots per runner (pool and report)")
    parser.add_argument("--qps", type=float, default=200.0, help="the operator's HELMHIVE_ROUTING_QPS (its default)")
    parser.add_argument("--burst", type=int, default=400, help="the operator's HELMHIVE_ROUTING_BURST (its default)")
    parser.add_argument("--rate", type=float, default=0.0, help="create jobs at this steady rate per second (0: burst)")
    parser.add_argument("--writers", type=int, default=8, help="requests in flight for the raw patch rate")
    parser.add_argument("--raw-seconds", type=float, default=20.0)
    parser.add_argument(
        "--raw-warmup", type=float, default=10.0, help="seconds of untimed tiny patches before the raw rate"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for every assignment")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--decide-only", action="store_true", help="only time decide_route (no cluster)")
    parser.add_argument("--idle-seconds", type=float, default=0.0, help="then measure operator CPU at rest")
    parser.add_argument("--restart", action="store_true", help="then restart the operator and time its recovery")
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="create every job with the operator stopped, then start it (times routing alone)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy the operator during the burst into this raw-stacks file")
    parser.add_argument(
        "--apiserver-profile",
        type=Path,
        help="serve the API server's pprof and write its CPU profile of each raw phase into this directory",
    )
    parser.add_argument("--raw-only", action="store_true", help="only the raw write phases (no operator, no burst)")
    parser.add_argument(
        "--raw-status",
        choices=RAW_STATUSES,
        default="router",
        help="the status the like-for-like raw phases write (the router's, or a smaller one to bound the gain)",
    )
    args = parser.parse_args()
    if args.apiserver_profile:
        args.apiserver_profile.mkdir(parents=True, exist_ok=True)
    if args.profile and not (Path(sys.executable).parent / "py-spy").exists():
        parser.error("--profile needs py-spy in this environment (make venv installs it with the dev extras)")
    if args.decide_only:
        print_decide_times()
        return
    workdir = Path(tempfile.mkdtemp(prefix="helmhive-bench-routing-"))
    with (workdir / "build.log").open("a") as log:
        binaries = ensure_binaries(log=log)
    layout = StateLayout(workdir / "cluster")
    # Only when asked, so the bench still runs a base commit's code given by PYTHONPATH.
    profiling = {"profiling": True} if args.apiserver_profile else {}
    info = devcluster.start(binaries, layout.root, tie_to_parent=True, **profiling)
    try:
        install(config.new_client_from_config(config_file=str(info.kubeconfig)))
        result = asyncio.run(run(args, info, layout, workdir, CpuProbe(cluster_pids(layout))))
        print()
        print(render_raw(result) if args.raw_only else render(result))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    finally:
        devcluster.stop(layout.root)
        print(f"(work directory {workdir})")


if __name__ == "__main__":
    main()

"""The raw-rate baseline (phase 1): status writes by a plain client, measured in the same run as
the routing they are the denominators of.

A plain client (httpx, admin certificate, ``--writers`` in flight) writes the status of scratch
AgentJobs: the tiny patch (the issue's raw rate), a status the shape and size of the router's
write (built by the router's own pure core, :func:`build_like_router_status`) as a merge patch
and as the router's conditional PUT, the tiny patch again on routed-size jobs and on fresh
ones, and, after the routing, once more (:func:`tiny_after_run`). Each phase with the CPU it
cost. It owns the scratch namespaces ``RAW_NS`` and ``AFTER_NS``; it starts no operator and
computes no ratio (``report`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from bench_runners import CpuProbe, cpu_window, wait
from kubernetes import client

from helmhive.api.job import AgentJobSpec, ProfileBinding
from helmhive.api.kinds import API_VERSION
from helmhive.policy.agentjob import life as agentjob
from helmhive.policy.profiles.narrowing import decide_profile_body
from helmhive.policy.profiles.revisions import profile_hash, revision_name
from helmhive.policy.routing.route import RoutingJob, RunnerView, decide_route
from helmhive.policy.routing.step import route as route_step
from helmhive.policy.timestamps import format_timestamp
from routing.settings import (
    AFTER_NS,
    BENCH_PROFILE_SPEC,
    GROUP_PATH,
    MODEL,
    NS,
    POOL_SIZE,
    RAW_NS,
    RUNNER_CAPABILITIES,
    RUNNER_LABELS,
    RUNNER_MODELS,
    job_body,
)


def build_like_router_status(*, runners: int, concurrency: int, now: dt.datetime) -> dict[str, Any]:
    """The status the router writes for one bench job it assigns, built by the same pure core. Pure.

    The binding is the bench Profile's (``BENCH_PROFILE_SPEC``, decided as the queue step does,
    ``helmhive.controller.jobs.binding``), the decision ``decide_route`` over ``runners`` runners
    like the bench's (so ``MAX_CANDIDATES`` candidate rows once there are that many), the wire
    form ``agentjob.route`` with the binding: routing, the assignment, Routed/Ready/Reconciling,
    ``observedGeneration``, the profile.
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


async def measure_raw(
    admin: httpx.AsyncClient, api: client.ApiClient, *, args: argparse.Namespace, probe: CpuProbe
) -> dict[str, Any]:
    """The raw phases as the run opens with them, their progress printed; returns :func:`raw_patch_rate`'s
    figures once the scratch namespace is gone.
    """
    print(f"raw status-patch rates, tiny and like the router's, {args.raw_seconds:g} s each "
          f"({args.writers} in flight) ...", flush=True)  # fmt: skip
    like_router = trim_like_router_status(
        build_like_router_status(runners=args.runners, concurrency=args.concurrency, now=dt.datetime.now(dt.UTC)),
        args.raw_status,
    )
    raw = await raw_patch_rate(admin, seconds=args.raw_seconds, writers=args.writers, probe=probe,
                               like_router=like_router, profiles=args.apiserver_profile,
                               warmup=args.raw_warmup)  # fmt: skip
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
    return raw


async def tiny_after_run(admin: httpx.AsyncClient, *, seconds: float, writers: int, probe: CpuProbe) -> dict[str, Any]:
    """The tiny patch once more, on fresh jobs in ``AFTER_NS``, after the routing (the operator
    stopped, the runners quiet): the machine's speed drifts over minutes, so the backlog's ratio
    is also given against the mean of the tiny rates measured before and after it.
    """
    (await admin.post("/api/v1/namespaces", json={"metadata": {"name": AFTER_NS}})).raise_for_status()
    return await tiny_on_fresh_jobs(admin, namespace=AFTER_NS, prefix="after", seconds=seconds, writers=writers,
                                    probe=probe)  # fmt: skip

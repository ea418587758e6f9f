"""The fleet of simulated runners (phase 2): the RunnerPools, their runners' tokens, and the
runners themselves on the bench's event loop.

The runners are the shared ``runner_fleet`` (each writes its Runner, report and Lease as its own
Pod, with a token bound to that Pod); this module only sets what the routing benchmark's
runners report (their labels, capabilities, models and ``--concurrency`` slots) and brings
``--runners`` of them up in pools of up to ``POOL_SIZE``, until the pools count every one
schedulable. It creates no job and starts no operator.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import httpx
from bench_runners import wait
from kubernetes import client
from runner_fleet import Fleet, SimRunner, micro_time

from routing.settings import GROUP_PATH, MODEL, NS, POOL_SIZE, RUNNER_CAPABILITIES, RUNNER_LABELS, RUNNER_MODELS


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


async def start_fleet(
    api: client.ApiClient, admin: httpx.AsyncClient, http: httpx.AsyncClient, *, runners: int, concurrency: int
) -> tuple[RoutingFleet, list[asyncio.Task[None]]]:
    """Create the pools, register ``runners`` runners and start their heartbeats; return the fleet
    and its heartbeat tasks once the pools count every runner schedulable.
    """
    create_pools(api, runners, concurrency)
    sims = await asyncio.to_thread(mint_runners, api, runners)
    pools_url = f"{GROUP_PATH}/namespaces/{NS}/runnerpools"

    async def generation() -> int:
        pools = (await admin.get(pools_url)).json()["items"]
        gens = [int((p.get("status") or {}).get("credentialGeneration") or 0) for p in pools]
        return min(gens) if gens else 0

    while await generation() < 1:  # noqa: ASYNC110
        await asyncio.sleep(0.5)
    fleet = RoutingFleet(http, NS, renew=60, lease=300, refresh=3600, concurrency=concurrency,
                         generation=await generation())  # fmt: skip
    gate = asyncio.Semaphore(16)

    async def register(r: SimRunner) -> None:
        async with gate:
            await fleet.register(r)

    started = time.monotonic()
    await asyncio.gather(*(register(r) for r in sims))
    beats = [asyncio.create_task(fleet.run(r)) for r in sims]

    async def schedulable() -> int:
        pools = (await admin.get(pools_url)).json()["items"]
        return sum(int((p.get("status") or {}).get("schedulableRunners") or 0) for p in pools)

    while await schedulable() < runners:  # noqa: ASYNC110
        await asyncio.sleep(0.5)
    print(f"{runners} runners schedulable after {time.monotonic() - started:.1f} s", flush=True)
    return fleet, beats


def stop_fleet(fleet: Fleet, beats: list[asyncio.Task[None]]) -> None:
    """The runners stop renewing: their heartbeat tasks are cancelled."""
    fleet.stop.set()
    for task in beats:
        task.cancel()

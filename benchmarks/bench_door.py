"""The operator door's CPU per request: its JSON calls on the event loop against the threaded path.

Starts a local dev cluster (the same binaries as the tests), installs the CRDs, creates one
AgentJob, and then, in rounds that alternate, GETs it through ``helmhive.controller.kube.door.Kube``:

- **on the loop**: ``Kube(api_client)``, the door as the operator builds it (aiohttp,
  :mod:`helmhive.controller.kube.http`);
- **threaded** (the baseline): ``Kube(api_client, executor=pool)``, each call in one of a pool's
  threads on the kubernetes client's urllib3 pool, as every JSON call ran before 10a9e48.

Each round sends ``--requests`` GETs with ``--in-flight`` at a time, after 200 to warm up, and
divides this process's CPU by the requests. Prints every round and the ratio of the medians.
Run: ``python benchmarks/bench_door.py`` (about three minutes with a warm binary cache).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_runners import install
from kubernetes import client, config

from helmhive.api.kinds import kind_by_name
from helmhive.controller.kube.door import Kube
from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import ensure_binaries
from helmhive.devcluster.flags import StateLayout
from helmhive.kubeclient import API_CONNECTIONS, load_api_client

AGENT_JOB = kind_by_name("AgentJob")
NS = "bench-door"
WARM_UP = 200


async def _round(kube: Kube, requests: int, in_flight: int) -> tuple[float, float]:
    """(requests per second, ms of this process's CPU per request) for one round; closes the door's session."""
    gate = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with gate:
            await kube.get(AGENT_JOB, "job", namespace=NS)

    await asyncio.gather(*(one() for _ in range(WARM_UP)))
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one() for _ in range(requests)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await kube.close()
    return requests / wall, 1000 * cpu / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="helmhive-bench-door-"))
    print("building or reusing the control-plane binaries ...", flush=True)
    with (workdir / "build.log").open("a") as log:
        binaries = ensure_binaries(log=log)
    layout = StateLayout(workdir / "cluster")
    print("starting a dev cluster ...", flush=True)
    info = devcluster.start(binaries, layout.root, tie_to_parent=True)
    try:
        admin = config.new_client_from_config(config_file=str(info.kubeconfig))
        install(admin)
        client.CoreV1Api(admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        job = {
            "apiVersion": "helmhive.dev/v1alpha1",
            "kind": "AgentJob",
            "metadata": {"name": "job"},
            "spec": {"workspace": "shop", "jobKind": "implementation-probe", "request": {"title": "t", "prompt": "go"}},
        }
        client.CustomObjectsApi(admin).create_namespaced_custom_object("helmhive.dev", "v1alpha1", NS, "agentjobs", job)
        api_client = load_api_client(str(info.kubeconfig))
        threads = ThreadPoolExecutor(max_workers=API_CONNECTIONS, thread_name_prefix="kube")
        doors = {"on the loop": Kube(api_client), "threaded": Kube(api_client, executor=threads)}
        results: dict[str, list[float]] = {name: [] for name in doors}
        for number in range(1, args.rounds + 1):
            for name, door in doors.items():
                print(f"round {number}, {name}: {args.requests} GETs, {args.in_flight} in flight ...", flush=True)
                rate, cpu_ms = asyncio.run(_round(door, args.requests, args.in_flight))
                results[name].append(cpu_ms)
                print(f"  {rate:,.0f} GETs/s, {cpu_ms:.3f} ms of CPU per GET", flush=True)
        threads.shutdown()
        loop_ms, thread_ms = statistics.median(results["on the loop"]), statistics.median(results["threaded"])
        print()
        print(f"median ms of client CPU per GET: on the loop {loop_ms:.3f}, threaded {thread_ms:.3f}")
        print(f"on the loop / threaded: {loop_ms / thread_ms:.2f}")
    finally:
        devcluster.stop(layout.root)


if __name__ == "__main__":
    main()

"""One run of the routing benchmark, in order, against its own local control plane: the raw-rate
baseline, the operator and the fleet, the burst, the operator at rest and restarted, the raw
rate once more, ``decide_route`` alone; then the report.

This module only sequences the phases (each is its own module's) and gathers their figures into
the result the report reads; of its own it prints only a few progress lines between phases and
computes only the burst's CPU windows (cut from the probe's samples). The report is ``report``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from bench_runners import CpuProbe, cpu_seconds, cpu_window, install, operator_kubeconfig, wait, write_counts
from kubernetes import config

from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import ensure_binaries
from helmhive.devcluster.flags import StateLayout
from helmhive.devcluster.procs import client_tls, is_alive, read_record
from routing.baseline import measure_raw, tiny_after_run
from routing.burst import burst, ensure_bench_profile, wait_for_routing_audits
from routing.cli import parse_args
from routing.decision import print_decide_times, time_decide_routes
from routing.fleet import start_fleet, stop_fleet
from routing.process import (
    Backlog,
    measure_at_rest,
    note_while,
    restart_and_route_one,
    rss_kib,
    start_operator,
    start_profile,
    stop_profile,
)
from routing.report import ratios, render, render_raw
from routing.settings import EVENT_INTERVAL_SECONDS, GROUP_PATH, NS


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
        result["raw"] = await measure_raw(admin, api, args=args, probe=probe)
        if args.raw_only:
            return result

        env = {"HELMHIVE_ROUTING_QPS": str(args.qps), "HELMHIVE_ROUTING_BURST": str(args.burst)}
        operator, health = start_operator(operator_kubeconfig(api, info, workdir / "operator.kubeconfig"), workdir, env)
        probe.pids["operator"] = operator.pid
        try:
            await asyncio.to_thread(wait, lambda: httpx.get(health, timeout=2).status_code == 200, 60, "liveness")
            fleet, beats = await start_fleet(api, admin, http, runners=args.runners, concurrency=args.concurrency)
            await ensure_bench_profile(admin)
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
            await wait_for_routing_audits(admin, result["burst"])
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
                result["idle"] = await measure_at_rest(admin, operator.pid, args.idle_seconds)
            if args.restart:
                operator = await restart_and_route_one(workdir, env, operator, admin, result)
            stop_fleet(fleet, beats)
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
        # The tiny patch once more, after the routing, with the operator stopped and the runners quiet.
        print("the tiny patch on fresh jobs again, after the run (the operator stopped) ...", flush=True)
        probe.pids.pop("operator", None)
        after = await tiny_after_run(admin, seconds=args.raw_seconds / 2, writers=args.writers, probe=probe)
        result["raw"]["tiny_after_run"] = after["rate"]
        result["raw"]["cpu"]["tiny_after_run"] = after["cpu"]
        result["ratios"] = ratios(result)
    result["decide_route"] = time_decide_routes()
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


def main(argv: list[str] | None = None) -> None:
    """The benchmark's command: parse the flags, start a control plane, run, print the report."""
    args = parse_args(argv)
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

"""The report: the figures computed from a run's result (percentiles, the routing throughput's
ratios to the raw rates) and the lines printed at the end of a run.

Pure: it reads the result dict the run built and returns numbers and text; no I/O, nothing
measured here.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from helmhive.policy.routing.route import MAX_CANDIDATES


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


CPU_COLUMNS = ("kube-apiserver", "etcd", "operator", "bench client")


def _synced_text(again: dict[str, Any]) -> str:
    """How the restart's sync is reported: by the probe when it saw it, else by the operator's log."""
    if again.get("store_synced_seconds") is not None:
        return f"after {again['store_synced_seconds']:.1f} s (its probe)"
    if again.get("store_synced_logged_seconds") is not None:
        return f"{again['store_synced_logged_seconds']:.1f} s after its start-up (its log)"
    return "at an unknown time (neither its probe nor its log said)"


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

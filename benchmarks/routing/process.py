"""The operator under test as a process: started, stopped (the backlog mode), profiled with
py-spy, restarted over everything that exists, watched at rest; and what is read from it (its
RSS, its log, its probes) and the API server's LIST counts around its restart.

It creates no job but the one that times a restart, and computes no ratio.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from bench_runners import CpuProbe, cpu_seconds, wait, write_counts

from helmhive.devcluster.procs import free_ports
from routing.settings import GROUP_PATH, NS, job_body


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Vm")
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


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


async def measure_at_rest(admin: httpx.AsyncClient, pid: int, seconds: float) -> dict[str, Any]:
    """The operator ``pid`` for ``seconds`` with every job assigned and only heartbeats: its CPU and
    RSS, and the writes meanwhile (the runners' Leases and reports).
    """
    print(f"idle window: {seconds:g} s with every job assigned, only heartbeats ...", flush=True)
    idle_cpu = cpu_seconds(pid)
    idle_writes = await write_counts(admin)
    await asyncio.sleep(seconds)
    during = await write_counts(admin) - idle_writes
    idle = {
        "seconds": seconds,
        "operator_cpu_seconds": cpu_seconds(pid) - idle_cpu,
        "operator_rss_kib": rss_kib(pid)[0],
        "writes": dict(during),
        "heartbeat_writes_per_second": sum(during[k] for k in ("leases", "runners/status")) / seconds,
    }
    print(f"  {idle}", flush=True)
    return idle

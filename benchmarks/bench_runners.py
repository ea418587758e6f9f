"""Benchmark: what runner heartbeats cost, and how fast the operator notices a dead runner.

Run by hand (pytest does not collect it)::

    .venv/bin/python benchmarks/bench_runners.py --runners 200 --window 60

It starts its own local control plane (``helmhive.devcluster``) in a temporary directory,
installs Helmhive, runs the real operator as a subprocess, and creates one RunnerPool of N
replicas; the StatefulSet controller creates N Pods (Pending: there is no kubelet). N
simulated runners then write exactly what ``docs/runners.md`` says a runner writes, each
with a TokenRequest token bound to its own Pod (so RBAC and the identity admission policy
apply): create the Runner, apply its report, renew its Lease.

Phases, all in one run against the same cluster and operator:

1. registration: time until the pool counts N schedulable runners;
2. design window: Lease renewed every ``renewIntervalSeconds``, report every ``reportRefreshSeconds``;
3. baseline window: the same, and the report is also written on every heartbeat, which is
   what a runner without a separate Lease would have to do;
4. detection: K runners stop renewing at once; the time from each one's last renewal until
   its Runner says Offline.

API writes are counted by the API server (``apiserver_request_total``); CPU is read from
``/proc`` for the operator and kube-apiserver processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, config, utils
from runner_fleet import Fleet, SimRunner, leases_path, runners_path

from helmhive.api.crdgen import build_crds
from helmhive.controller.runtime import OperatorConfig
from helmhive.deploy.manifests import OperatorIdentity, build_install_manifests
from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import ensure_binaries
from helmhive.devcluster.flags import StateLayout
from helmhive.devcluster.kubeconfig import build_kubeconfig, dump_kubeconfig
from helmhive.devcluster.procs import client_tls, free_ports, read_record

REPO = Path(__file__).resolve().parents[1]
GRACE = OperatorConfig().runner_grace_seconds
TICK = OperatorConfig().runner_tick_seconds
NS = "bench"
POOL_SIZE = 100  # spec.replicas is at most 100, so N runners are spread over ceil(N/100) pools
RUNNERS_PATH = runners_path(NS)
LEASES_PATH = leases_path(NS)
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE"}


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (all its threads), in seconds."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot, all cores (``/proc/stat``: all but idle and iowait)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSample:
    """One reading: when (monotonic), the machine's busy seconds, and each live process's CPU seconds."""

    at: float
    machine: float
    procs: dict[str, float]


@dataclass
class CpuProbe:
    """CPU seconds of named processes (``pids``, changeable: an operator restarts) and of the whole machine.

    ``samples`` fills while :meth:`run` runs, so a window known only afterwards (first to last
    assignment) can still be read, interpolated between the readings around its ends.
    """

    pids: dict[str, int]
    samples: list[CpuSample] = field(default_factory=list)

    def sample(self) -> CpuSample:
        procs = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, IndexError):
                procs[name] = cpu_seconds(pid)
        return CpuSample(at=time.monotonic(), machine=machine_busy_seconds(), procs=procs)

    async def run(self, every: float = 0.25) -> None:
        """Sample every ``every`` seconds until cancelled."""
        while True:
            self.samples.append(self.sample())
            await asyncio.sleep(every)

    def at(self, moment: float) -> CpuSample:
        """The reading at ``moment``, linear between the samples around it (the nearest one outside them)."""
        later = next((i for i, s in enumerate(self.samples) if s.at >= moment), None)
        if later is None:
            return self.samples[-1]
        if later == 0:
            return self.samples[0]
        a, b = self.samples[later - 1], self.samples[later]
        w = (moment - a.at) / (b.at - a.at) if b.at > a.at else 1.0
        procs = {n: a.procs[n] + w * (b.procs[n] - a.procs[n]) for n in a.procs.keys() & b.procs.keys()}
        return CpuSample(at=moment, machine=a.machine + w * (b.machine - a.machine), procs=procs)


def cpu_window(before: CpuSample, after: CpuSample, count: int) -> dict[str, Any]:
    """What a window cost: each process's CPU seconds and ms per item (``count`` patches or jobs), and cores:
    the whole machine's busy ones (anyone's processes) and those of the processes read (``processes_cores``).
    """
    seconds = after.at - before.at
    spent = {n: after.procs[n] - before.procs[n] for n in sorted(before.procs.keys() & after.procs.keys())}
    return {
        "seconds": seconds,
        "count": count,
        "cpu_seconds": spent,
        "ms_per_item": {n: 1000 * v / count for n, v in spent.items()} if count else {},
        "machine_busy_cores": (after.machine - before.machine) / seconds if seconds > 0 else None,
        "processes_cores": sum(spent.values()) / seconds if seconds > 0 else None,
    }


def pool_names(n: int) -> list[str]:
    return [f"bench-{i}" for i in range((n + POOL_SIZE - 1) // POOL_SIZE)]


async def write_counts(http: httpx.AsyncClient) -> Counter[str]:
    """Cumulative write requests the API server has answered, by resource[/subresource]."""
    counts: Counter[str] = Counter()
    for line in (await http.get("/metrics")).text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
        if labels.get("verb") in WRITE_VERBS:
            key = labels.get("resource", "") + ("/" + labels["subresource"] if labels.get("subresource") else "")
            counts[key] += int(float(line.rsplit(" ", 1)[1]))
    return counts


@dataclass
class Window:
    seconds: float
    writes: Counter[str]
    lease: int
    report: int
    lease_bytes: int
    report_bytes: int
    operator_cpu: float
    apiserver_cpu: float


async def measure(fleet: Fleet, admin: httpx.AsyncClient, pids: dict[str, int], seconds: float) -> Window:
    before = (await write_counts(admin), fleet.tally.lease, fleet.tally.report, fleet.tally.lease_bytes,
              fleet.tally.report_bytes, cpu_seconds(pids["operator"]), cpu_seconds(pids["apiserver"]))  # fmt: skip
    started = time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - started
    after = (await write_counts(admin), fleet.tally.lease, fleet.tally.report, fleet.tally.lease_bytes,
             fleet.tally.report_bytes, cpu_seconds(pids["operator"]), cpu_seconds(pids["apiserver"]))  # fmt: skip
    writes = after[0] - before[0]
    return Window(elapsed, writes, *(a - b for a, b in zip(after[1:], before[1:], strict=True)))  # type: ignore[arg-type]


def operator_kubeconfig(api: client.ApiClient, info: devcluster.ClusterInfo, dest: Path) -> Path:
    """A kubeconfig with a token of the operator's own ServiceAccount (the envelope policy wants that identity)."""
    identity = OperatorIdentity()
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(expiration_seconds=6 * 3600))
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        identity.service_account, identity.namespace, request
    )
    doc = build_kubeconfig(server=info.server, ca_file=info.ca_file, user=identity.service_account,
                           token=token.status.token)  # fmt: skip
    dest.write_text(dump_kubeconfig(doc), encoding="utf-8")
    dest.chmod(0o600)
    return dest


def start_operator(kubeconfig: Path, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    health, webhook = free_ports(2)
    log = (workdir / "operator.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "helmhive", "operator", "run", "--kubeconfig", str(kubeconfig),
         f"--liveness=http://127.0.0.1:{health}/healthz", "--webhook-addr=127.0.0.1", "--webhook-host=127.0.0.1",
         f"--webhook-port={webhook}"],
        stdout=log, stderr=subprocess.STDOUT, env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{health}/healthz"


def wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            value = predicate()
            if value:
                return value
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def install(api: client.ApiClient) -> None:
    # The CRDs of the code on the path (equal to crds/ at any commit), so a base commit measured
    # through PYTHONPATH runs with its own schemas.
    docs = list(build_crds().values())
    for doc in [*docs, *build_install_manifests(OperatorIdentity())]:
        with contextlib.suppress(utils.FailToCreateError):
            utils.create_from_dict(api, doc)
    ext = client.ApiextensionsV1Api(api)
    wait(lambda: all(c.status.conditions and any(x.type == "Established" and x.status == "True"
         for x in c.status.conditions) for c in ext.list_custom_resource_definition().items), 60, "CRDs")  # fmt: skip


def create_pools(api: client.ApiClient, n: int, lease: int, renew: int) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    wait(lambda: core.read_namespaced_service_account("default", NS), 60, "the default ServiceAccount")
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="bench-key"), string_data={"api-key": "sk-bench"})
    core.create_namespaced_secret(NS, secret)
    for i, name in enumerate(pool_names(n)):
        pool = {
            "apiVersion": "helmhive.dev/v1alpha1",
            "kind": "RunnerPool",
            "metadata": {"name": name},
            "spec": {
                "provider": "anthropic",
                "adapter": {"type": "claude-cli"},
                "image": "ghcr.io/helmhive/runner:bench",
                "credential": {"secretRef": {"name": "bench-key", "key": "api-key"}},
                "replicas": min(POOL_SIZE, n - i * POOL_SIZE),
                "heartbeat": {
                    "leaseDurationSeconds": lease,
                    "renewIntervalSeconds": renew,
                    "reportRefreshSeconds": 300,
                },
            },
        }
        custom.create_namespaced_custom_object("helmhive.dev", "v1alpha1", NS, "runnerpools", pool)


async def detect(fleet: Fleet, admin: httpx.AsyncClient, victims: list[SimRunner], *, limit: float) -> list[float]:
    """Stop the victims' renewals at once; return seconds from each one's last renewal to Offline."""
    fleet.dead |= {v.name for v in victims}
    await asyncio.sleep(fleet.renew_s + 0.5)  # every victim has skipped at least one renewal
    found: dict[str, float] = {}
    deadline = time.monotonic() + limit
    while len(found) < len(victims) and time.monotonic() < deadline:
        for victim in victims:
            if victim.name not in found:
                status = (await admin.get(f"{RUNNERS_PATH}/{victim.name}")).json().get("status") or {}
                if status.get("reportedStatus") == "Offline":
                    found[victim.name] = time.time() - victim.last_renewal
        await asyncio.sleep(0.1)
    return sorted(found.values())


def per_min(count: float, window: Window, n: int) -> float:
    return count / n / (window.seconds / 60)


def summarize(
    *, args: argparse.Namespace, reg_s: float, design: Window, base: Window, dead: list[float], sizes: dict[str, int]
) -> dict[str, Any]:
    n = args.runners

    def rows(w: Window) -> dict[str, float]:
        runner_status = w.report
        operator_status = max(0, w.writes["runners/status"] - w.report)
        operator_other = sum(
            v for k, v in w.writes.items() if k in {"runners", "runnerpools/status", "auditrecords", "events"}
        )
        return {
            "lease_renewals": per_min(w.lease, w, n),
            "report_writes": per_min(runner_status, w, n),
            "operator_writes": per_min(operator_status + operator_other, w, n),
            "all_api_writes": per_min(sum(w.writes.values()), w, n),
            "bytes_sent": per_min(w.lease_bytes + w.report_bytes, w, n),
            "stored_bytes_rewritten": per_min(w.lease * sizes["lease"] + w.report * sizes["runner"], w, n),
            "operator_cpu_pct": 100 * w.operator_cpu / w.seconds,
            "apiserver_cpu_pct": 100 * w.apiserver_cpu / w.seconds,
        }

    return {
        "runners": n,
        "lease_seconds": args.lease,
        "renew_seconds": args.renew,
        "window_seconds": round(design.seconds, 1),
        "registration_seconds": round(reg_s, 1),
        "object_bytes": sizes,
        "design": rows(design),
        "baseline": rows(base),
        "detection_seconds": dead,
    }


def render(result: dict[str, Any]) -> str:
    d, b = result["design"], result["baseline"]
    lines = [
        f"runners {result['runners']} in {len(pool_names(result['runners']))} pool(s); "
        f"Lease {result['lease_seconds']} s, renewed every {result['renew_seconds']} s; "
        f"report refresh 300 s; windows of {result['window_seconds']} s",
        f"registration: all runners schedulable after {result['registration_seconds']} s; stored sizes "
        f"Runner {result['object_bytes']['runner']} B, Lease {result['object_bytes']['lease']} B",
        "",
        f"{'per runner per minute':38} {'design':>10} {'baseline':>10} {'design/baseline':>16}",
    ]
    for key, label in (
        ("lease_renewals", "Lease renewals (runner)"),
        ("report_writes", "Runner report writes (runner)"),
        ("operator_writes", "writes by the operator"),
        ("all_api_writes", "all API writes (API server count)"),
        ("bytes_sent", "request bytes sent by the runner"),
        ("stored_bytes_rewritten", "stored object bytes rewritten"),
        ("operator_cpu_pct", "operator CPU, % of one core (total)"),
        ("apiserver_cpu_pct", "kube-apiserver CPU, % of one core"),
    ):
        ratio = d[key] / b[key] if b[key] else float("nan")
        lines.append(f"{label:38} {d[key]:10.2f} {b[key]:10.2f} {ratio:16.3f}")
    dead = result["detection_seconds"]
    if dead:
        lines += [
            "",
            f"dead-runner detection ({len(dead)} runners, seconds from last renewal to Offline): "
            f"min {min(dead):.1f}, median {statistics.median(dead):.1f}, max {max(dead):.1f} "
            f"(Lease {result['lease_seconds']} s + grace {GRACE:g} s + tick <= {TICK:g} s)",
        ]
    return "\n".join(lines)


async def run(
    args: argparse.Namespace, info: devcluster.ClusterInfo, layout: StateLayout, pids: dict[str, int]
) -> dict[str, Any]:
    api = config.new_client_from_config(config_file=str(info.kubeconfig))
    core = client.CoreV1Api(api)
    n = args.runners
    wait(lambda: len(core.list_namespaced_pod(NS).items) == n, 180, f"{n} pods")
    runners = []
    for pod in sorted(core.list_namespaced_pod(NS).items, key=lambda p: p.metadata.name):
        pool = pod.metadata.labels["helmhive.dev/pool"]
        sa = f"helmhive-runner-{pool}"
        wait(lambda sa=sa: core.read_namespaced_service_account(sa, NS), 60, f"ServiceAccount {sa}")
        ref = client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid)
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=None,
                  expiration_seconds=3600, bound_object_ref=ref))  # fmt: skip
        token = core.create_namespaced_service_account_token(sa, NS, request).status.token
        runners.append(SimRunner(name=pod.metadata.name, pool=pool, token=token))
    admin_tls = client_tls(ca_file=info.ca_file, cert_file=layout.pki.cert("admin"), key_file=layout.pki.key("admin"))
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(
            base_url=info.server, verify=client_tls(ca_file=info.ca_file), limits=limits, timeout=30
        ) as http,
        httpx.AsyncClient(base_url=info.server, verify=admin_tls, timeout=30) as admin,
    ):
        fleet = Fleet(http, NS, renew=args.renew, lease=args.lease, refresh=300)
        started = time.monotonic()
        gate = asyncio.Semaphore(16)

        async def register(r: SimRunner) -> None:
            async with gate:
                await fleet.register(r)

        await asyncio.gather(*(register(r) for r in runners))
        tasks = [asyncio.create_task(fleet.run(r)) for r in runners]
        pools_url = f"/apis/helmhive.dev/v1alpha1/namespaces/{NS}/runnerpools"

        async def schedulable() -> int:
            pools = (await admin.get(pools_url)).json()["items"]
            return sum(int((p.get("status") or {}).get("schedulableRunners") or 0) for p in pools)

        while await schedulable() != n:  # noqa: ASYNC110 (polling another process's state)
            await asyncio.sleep(0.5)
        registration = time.monotonic() - started
        await asyncio.sleep(5)  # let registration audits and Events settle
        print(f"registered {n} runners in {registration:.1f} s; measuring the design for {args.window} s", flush=True)
        design = await measure(fleet, admin, pids, args.window)
        fleet.baseline = True
        await asyncio.sleep(args.renew)
        print(f"measuring the baseline (report on every heartbeat) for {args.window} s", flush=True)
        baseline = await measure(fleet, admin, pids, args.window)
        fleet.baseline = False
        sizes = {
            "runner": len((await admin.get(f"{RUNNERS_PATH}/{runners[0].name}")).content),
            "lease": len((await admin.get(f"{LEASES_PATH}/{runners[0].name}")).content),
        }
        print(f"stopping {args.dead} runners to time their detection", flush=True)
        dead = await detect(fleet, admin, random.sample(runners, args.dead), limit=args.lease + 60)
        fleet.stop.set()
        for task in tasks:
            task.cancel()
        if fleet.tally.errors:
            print(f"note: runner requests answered with errors: {dict(fleet.tally.errors)}", flush=True)
    return summarize(
        args=args, reg_s=registration, design=design, base=baseline, dead=[round(x, 2) for x in dead], sizes=sizes
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runners", type=int, default=200)
    parser.add_argument("--window", type=float, default=60.0, help="seconds per measured window")
    parser.add_argument("--dead", type=int, default=10, help="runners stopped to time their detection")
    parser.add_argument("--lease", type=int, default=20, help="leaseDurationSeconds")
    parser.add_argument("--renew", type=int, default=5, help="renewIntervalSeconds")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="helmhive-bench-"))
    with (workdir / "build.log").open("a") as log:
        binaries = ensure_binaries(log=log)
    layout = StateLayout(workdir / "cluster")
    info = devcluster.start(binaries, layout.root, tie_to_parent=True)
    operator = None
    try:
        api = config.new_client_from_config(config_file=str(info.kubeconfig))
        install(api)
        operator, health = start_operator(operator_kubeconfig(api, info, workdir / "operator.kubeconfig"), workdir)
        wait(lambda: httpx.get(health, timeout=2).status_code == 200, 60, "operator liveness")
        create_pools(api, args.runners, args.lease, args.renew)
        apiserver = read_record(layout.pids, "kube-apiserver")
        assert apiserver is not None
        pids = {"operator": operator.pid, "apiserver": apiserver.pid}
        result = asyncio.run(run(args, info, layout, pids))
        print()
        print(render(result))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if operator is not None:
            operator.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                operator.wait(timeout=20)
        devcluster.stop(layout.root)
        print(f"(work directory {workdir})")


if __name__ == "__main__":
    main()

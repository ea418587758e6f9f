"""Benchmark: queue-to-agent-start of JobPod jobs on kind, warm pods against cold ones.

Run by hand (pytest does not collect it)::

    .venv/bin/python benchmarks/bench_jobpods.py --jobs 100 --warm 4

It makes (or reuses) the kind cluster ``helmhive-bench`` from the offline-built node image,
loads Helmhive's images built from the working tree, installs the chart, and runs one JobPod
RunnerPool of the reference agent. Each phase submits its jobs and waits until every one has
ended; the runners' own log lines say, per job, when its agent was about to start
(``job pod agent starting``: ``queuedSeconds`` since the job was created, ``warm``) and when its
pod was claimed or created. Phases, in one run against the same cluster:

1. **cold burst**: ``warmPods: 0``, every job at once: each job's pod is created for it;
2. **warm burst**: ``warmPods: W``, every job at once: the first W claim warm pods, the rest
   claim refilled ones or create their own;
3. **warm steady**: one job every ``--interval`` seconds, fewer than the warm pods can absorb.

Printed per phase: queue-to-agent-start p50/p95 (which includes waiting for a free runner slot
in a burst), pod-to-agent-start p50/p95 (from the claim or create to the agent's start: the
part warm pods remove), how many jobs claimed a warm pod, pod creates per job and API writes per
job (the API server's ``apiserver_request_total``, all writes and pods alone), and the ratios of
the warm phases to the cold one.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from helmhive.devcluster.helm import ensure_helm
from helmhive.devcluster.kind.cluster import KindCluster, ensure_cluster, load_helmhive

REPO = Path(__file__).resolve().parents[1]
NS = "bench-jobpods"
POOL = "bench"
PROFILE = "bench-check"
_API = "helmhive.dev/v1alpha1"
_WRITES = ("POST", "PUT", "PATCH", "DELETE")


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Kube:
    cluster: KindCluster

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [str(self.cluster.kubectl), "--kubeconfig", str(self.cluster.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()[-1500:]}")
        return proc.stdout

    def apply(self, docs: list[dict[str, Any]]) -> None:
        text = "---\n".join(yaml.safe_dump(d) for d in docs)
        for _ in range(60):  # right after the install, the Profile webhook's endpoints may not be up yet
            proc = subprocess.run(
                [str(self.cluster.kubectl), "--kubeconfig", str(self.cluster.kubeconfig), "apply", "-n", NS, "-f", "-"],
                input=text, capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
            if proc.returncode == 0:
                return
            if "failed calling webhook" not in proc.stderr:
                raise SystemExit(f"kubectl apply failed: {proc.stderr.strip()[-1500:]}")
            say("  the webhook does not answer yet; trying again in 2 s")
            time.sleep(2)
        raise SystemExit("the Profile webhook did not answer within 2 minutes")

    def get(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.run("get", "-o", "json", *args))
        return found

    def writes(self) -> tuple[int, int]:
        """(every write, pod creates) the API server has answered so far."""
        total = pods = 0
        for line in self.run("get", "--raw", "/metrics").splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            count = int(float(line.rsplit(" ", 1)[1]))
            if labels.get("verb") in _WRITES:
                total += count
                if labels.get("resource") == "pods" and labels.get("verb") == "POST" and not labels.get("subresource"):
                    pods += count
        return total, pods


def wait(what: str, check: Callable[[], bool], *, timeout: float) -> None:
    say(f"  waiting: {what} …")
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting: {what}")
        time.sleep(1.0)


def documents(image: str, *, warm: int, concurrency: int, replicas: int) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bench-token"}, "stringData": {"token": "bench"}},
        {
            "apiVersion": _API,
            "kind": "RunnerPool",
            "metadata": {"name": POOL},
            "spec": {
                "provider": "reference",
                "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
                "image": image,
                "imagePullPolicy": "Never",
                "credential": {"secretRef": {"name": "bench-token", "key": "token"}, "envName": "TOKEN"},
                "credentialIsolation": "Proxy",
                "placementLabels": {"domain": "code", "execution": "bench"},
                "concurrency": concurrency,
                "replicas": replicas,
                # A quarter of a core each; the pods may use both nodes (the two share this machine's cores).
                "jobLimits": {"memoryBytes": 256 * 1024 * 1024, "cpuMillicores": 250, "diskBytes": 64 * 1024 * 1024},
                "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
                "execution": {"mode": "JobPod", "warmPods": warm},
            },
        },
        {
            "apiVersion": _API,
            "kind": "Profile",
            "metadata": {"name": PROFILE},
            "spec": {
                "envelope": "connection-test",
                "purpose": "Benchmark job pods.",
                "instructions": "Reply with one short sentence.",
                "providerMappings": [{"provider": "reference"}],
                "requiredLabels": {"execution": "bench"},
            },
        },
    ]


def job(name: str) -> dict[str, Any]:
    spec = {"workspace": "bench", "jobKind": "connection-test", "profile": PROFILE, "timeoutSeconds": 600,
            "request": {"title": name, "prompt": "Say hello."}}  # fmt: skip
    return {"apiVersion": _API, "kind": "AgentJob", "metadata": {"name": name}, "spec": spec}


def ended(kube: Kube, prefix: str, count: int) -> bool:
    items = kube.get("agentjobs", "-n", NS)["items"]
    done = 0
    for item in items:
        if not item["metadata"]["name"].startswith(prefix):
            continue
        ready: dict[str, Any] = next(
            (c for c in item.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {}
        )
        if ready.get("status") in {"True", "False"} and ready.get("reason") != "Started":
            done += 1
    return done >= count


def runner_lines(kube: Kube) -> list[dict[str, Any]]:
    text = kube.run("logs", "-n", NS, "-l", f"helmhive.dev/pool={POOL},app.kubernetes.io/name=helmhive-runner",
                    "--tail=-1", "--prefix=false", "--max-log-requests=10")  # fmt: skip
    lines = []
    for raw in text.splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return lines


def _ts(line: dict[str, Any]) -> float:
    from datetime import datetime  # noqa: PLC0415

    return datetime.fromisoformat(line["timestamp"]).timestamp()


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Phase:
    name: str
    queue: list[float]
    pod_to_agent: list[float]
    warm: int
    jobs: int
    writes: float
    pod_creates: float

    def row(self) -> str:
        return (
            f"{self.name:<13} jobs {self.jobs:>3}  warm claims {self.warm:>3}  "
            f"queue->agent p50 {statistics.median(self.queue):6.2f} s p95 {pct(self.queue, 0.95):6.2f} s  "
            f"pod->agent p50 {statistics.median(self.pod_to_agent):5.2f} s p95 {pct(self.pod_to_agent, 0.95):5.2f} s  "
            f"pod creates/job {self.pod_creates:4.2f}  API writes/job {self.writes:5.2f}"
        )


def run_phase(kube: Kube, name: str, names: list[str], *, interval: float) -> Phase:
    before = kube.writes()
    seen = {line.get("job") for line in runner_lines(kube) if line.get("message") == "job pod agent starting"}
    say(f"==> {name}: {len(names)} jobs" + (f", one every {interval} s" if interval else ", all at once"))
    if interval:
        for n in names:
            kube.apply([job(n)])
            time.sleep(interval)
    else:
        kube.apply([job(n) for n in names])
    prefix = names[0].rsplit("-", 1)[0]
    wait(f"{len(names)} jobs of {name} to end", lambda: ended(kube, prefix, len(names)), timeout=3600)
    after = kube.writes()
    lines = runner_lines(kube)
    starts = {
        ln["job"]: ln for ln in lines if ln.get("message") == "job pod agent starting" and ln.get("job") not in seen
    }
    acquired = {ln["job"]: ln for ln in lines if ln.get("message") in {"job pod claimed", "job pod created"}}
    mine = [n for n in names if n in starts]
    if len(mine) < len(names):
        say(f"  note: {len(names) - len(mine)} job(s) have no agent-start line (ended before their agent started)")
    queue = [float(starts[n]["queuedSeconds"]) for n in mine]
    pod_to_agent = [_ts(starts[n]) - _ts(acquired[n]) for n in mine if n in acquired]
    return Phase(
        name=name, queue=queue, pod_to_agent=pod_to_agent, jobs=len(names),
        warm=sum(1 for n in mine if starts[n].get("warm")),
        writes=(after[0] - before[0]) / len(names), pod_creates=(after[1] - before[1]) / len(names),
    )  # fmt: skip


def set_warm(kube: Kube, warm: int) -> None:
    kube.run(
        "patch",
        "runnerpool",
        POOL,
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"execution": {"warmPods": warm}}}),
    )

    def ready() -> bool:
        pods = kube.get("pods", "-n", NS, "-l", f"helmhive.dev/pool={POOL},helmhive.dev/warm=true")["items"]
        return (
            sum(1 for p in pods if all(c.get("ready") for c in p.get("status", {}).get("containerStatuses", [{}])))
            >= warm
        )

    wait(f"{warm} warm pods ready", ready, timeout=600)


def schedulable(kube: Kube) -> int:
    runners = kube.get("runners", "-n", NS)["items"]
    return sum(
        1
        for r in runners
        if any(c["type"] == "Schedulable" and c["status"] == "True" for c in r.get("status", {}).get("conditions", []))
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--warm", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steady", type=int, default=20, help="jobs of the steady phase")
    parser.add_argument("--interval", type=float, default=3.0)
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    say(f"==> kind cluster helmhive-bench (commit {commit})")
    cluster = ensure_cluster("helmhive-bench", log=sys.stdout)
    images = load_helmhive(cluster, log=sys.stdout)
    helm = ensure_helm(log=sys.stdout)
    kube = Kube(cluster)
    repo, tag = images.operator.rsplit(":", 1)
    say("==> helm upgrade --install helmhive")
    subprocess.run(
        [str(helm), "upgrade", "--install", "helmhive", str(REPO / "charts" / "helmhive"), "-n", "helmhive-system",
         "--create-namespace", "--kubeconfig", str(cluster.kubeconfig), "--set", f"operator.image.repository={repo}",
         "--set", f"operator.image.tag={tag}", "--set", "operator.image.pullPolicy=Never", "--wait", "--timeout", "5m"],
        check=True, capture_output=True,
    )  # fmt: skip
    kube.run("delete", "namespace", NS, "--ignore-not-found", "--wait=true")
    kube.run("create", "namespace", NS)
    kube.run(
        "label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted", "helmhive.dev/workspaces=enabled"
    )
    kube.apply(documents(images.runner, warm=0, concurrency=args.concurrency, replicas=args.replicas))
    wait(f"{args.replicas} runners schedulable", lambda: schedulable(kube) >= args.replicas, timeout=600)
    phases = [run_phase(kube, "cold burst", [f"cold-{i}" for i in range(args.jobs)], interval=0)]
    set_warm(kube, args.warm)
    phases.append(run_phase(kube, "warm burst", [f"warm-{i}" for i in range(args.jobs)], interval=0))
    set_warm(kube, args.warm)
    phases.append(run_phase(kube, "warm steady", [f"steady-{i}" for i in range(args.steady)], interval=args.interval))
    say(f"\nresults at {commit} ({args.replicas} runners x {args.concurrency} slots, warmPods {args.warm}):")
    for phase in phases:
        say("  " + phase.row())
    cold = phases[0]
    for phase in phases[1:]:
        pod_ratio = statistics.median(phase.pod_to_agent) / statistics.median(cold.pod_to_agent)
        queue_ratio = pct(phase.queue, 0.95) / pct(cold.queue, 0.95)
        say(f"  {phase.name} / cold burst: pod->agent p50 {pod_ratio:.2f}, queue->agent p95 {queue_ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: queue-to-agent-start of JobPod jobs on kind, warm pods against cold ones.

Run by hand (pytest does not collect it)::

    .venv/bin/python benchmarks/bench_jobpods.py --jobs 100 --warm 4

It makes (or reuses) the kind cluster ``helmhive-bench`` from the offline-built node image,
loads Helmhive's images built from the working tree, installs the chart, and runs two RunnerPools
of the reference agent, one in each execution mode. Each phase submits its jobs and waits until
every one has ended; the runners' own log lines say, per job, when its agent was about to start
(``job pod agent starting``: ``queuedSeconds`` since the job was created, ``warm``) and when its
pod was claimed or created. Phases, in one run against the same cluster:

0. **in-runner burst**: the same jobs on the InRunner pool: the baseline of Helmhive's own writes
   per job (routing, the runner's status writes, audit) that JobPod mode must keep;
1. **cold burst**: ``warmPods: 0``, every job at once: each job's pod is created for it;
2. **warm burst**: ``warmPods: W``, every job at once: the first W claim warm pods, the rest
   claim refilled ones or create their own;
3. **warm steady**: one job every ``--interval`` seconds, fewer than the warm pods can absorb;
4. **kubelet baseline**: copies of a warm job pod created ``slots`` at a time, each timed from its
   create to Running (:func:`jobpod_kind.pod_start_baseline`): the kubelet's own pod start.

Printed per phase: queue-to-agent-start p50/p95 (which includes waiting for a free runner slot
in a burst), pod-to-agent-start p50/p95 (from the claim or create to the agent's start: the
part warm pods remove), how many jobs claimed a warm pod, and writes per job from the API server's
``apiserver_request_total`` split by part (:func:`jobpod_kind.parse_writes`: Helmhive's resources,
pods, Events, the rest; Leases left out, as they grow with time). Then the ratios: the warm phases'
to the cold one's, the JobPod phases' Helmhive writes to the in-runner burst's, and cold
pod-to-agent against the kubelet baseline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobpod_kind import Kube, Writes, pct, pod_start_baseline, say, timestamp, wait

from helmhive.devcluster.helm import ensure_helm
from helmhive.devcluster.kind.cluster import ensure_cluster, load_helmhive

REPO = Path(__file__).resolve().parents[1]
NS = "bench-jobpods"
POOL = "bench"
IN_RUNNER = "bench-inrunner"
PROFILES = {POOL: "bench-check", IN_RUNNER: "bench-inrunner-check"}
_API = "helmhive.dev/v1alpha1"
_RUNNERS = "app.kubernetes.io/name=helmhive-runner"


def pool(name: str, image: str, *, job_pod: bool, concurrency: int, replicas: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "provider": "reference",
        "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
        "image": image,
        "imagePullPolicy": "Never",
        "credential": {"secretRef": {"name": "bench-token", "key": "token"}, "envName": "TOKEN"},
        "credentialIsolation": "Proxy",
        "placementLabels": {"domain": "code", "execution": name},
        "concurrency": concurrency,
        "replicas": replicas,
        # A quarter of a core each; the pods may use both nodes (the two share this machine's cores).
        "jobLimits": {"memoryBytes": 256 * 1024 * 1024, "cpuMillicores": 250, "diskBytes": 64 * 1024 * 1024},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
    }
    if job_pod:
        spec["execution"] = {"mode": "JobPod", "warmPods": 0}
    return {"apiVersion": _API, "kind": "RunnerPool", "metadata": {"name": name}, "spec": spec}


def profile(pool_name: str) -> dict[str, Any]:
    spec = {"envelope": "connection-test", "purpose": "Benchmark job pods.", "instructions": "Reply in one sentence.",
            "providerMappings": [{"provider": "reference"}], "requiredLabels": {"execution": pool_name}}  # fmt: skip
    return {"apiVersion": _API, "kind": "Profile", "metadata": {"name": PROFILES[pool_name]}, "spec": spec}


def documents(image: str, *, concurrency: int, replicas: int) -> list[dict[str, Any]]:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bench-token"}, "stringData": {"token": "b"}}
    return [
        secret,
        pool(POOL, image, job_pod=True, concurrency=concurrency, replicas=replicas),
        pool(IN_RUNNER, image, job_pod=False, concurrency=concurrency, replicas=replicas),
        profile(POOL),
        profile(IN_RUNNER),
    ]


def job(name: str, pool_name: str) -> dict[str, Any]:
    spec = {"workspace": "bench", "jobKind": "connection-test", "profile": PROFILES[pool_name], "timeoutSeconds": 600,
            "request": {"title": name, "prompt": "Say hello."}}  # fmt: skip
    return {"apiVersion": _API, "kind": "AgentJob", "metadata": {"name": name}, "spec": spec}


def failures(kube: Kube, prefix: str) -> dict[str, int]:
    """The jobs of a phase that ended failed, by reason."""
    found: dict[str, int] = {}
    for item in kube.get("agentjobs", "-n", NS)["items"]:
        if not item["metadata"]["name"].startswith(prefix + "-"):
            continue
        ready: dict[str, Any] = next(
            (c for c in item.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {}
        )
        if ready.get("status") == "False":
            found[ready.get("reason", "")] = found.get(ready.get("reason", ""), 0) + 1
    return found


def ended(kube: Kube, prefix: str, count: int) -> bool:
    done = 0
    for item in kube.get("agentjobs", "-n", NS)["items"]:
        if not item["metadata"]["name"].startswith(prefix):
            continue
        ready: dict[str, Any] = next(
            (c for c in item.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {}
        )
        if ready.get("status") in {"True", "False"} and ready.get("reason") != "Started":
            done += 1
    return done >= count


@dataclass
class Phase:
    name: str
    jobs: int
    writes: Writes
    queue: list[float] = field(default_factory=list)
    pod_to_agent: list[float] = field(default_factory=list)
    warm: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    def per_job(self, count: int) -> float:
        return count / self.jobs

    def row(self) -> str:
        w = self.writes
        writes = (
            f"writes/job: Helmhive {self.per_job(w.helmhive):5.2f}  pods {self.per_job(w.pods):5.2f} "
            f"(creates {self.per_job(w.pod_creates):4.2f})  events {self.per_job(w.events):5.2f}  "
            f"other {self.per_job(w.other):4.2f}"
        )
        if self.failed:
            writes += f"  FAILED {sum(self.failed.values())}: {self.failed}"
        if not self.queue:
            return f"{self.name:<15} jobs {self.jobs:>3}  {writes}"
        return (
            f"{self.name:<15} jobs {self.jobs:>3}  warm claims {self.warm:>3}  "
            f"queue->agent p50 {pct(self.queue, 0.5):6.2f} s p95 {pct(self.queue, 0.95):6.2f} s  "
            f"pod->agent p50 {pct(self.pod_to_agent, 0.5):5.2f} s p95 {pct(self.pod_to_agent, 0.95):5.2f} s\n"
            f"{'':<15} {writes}"
        )


def run_phase(kube: Kube, name: str, names: list[str], *, pool_name: str, interval: float) -> Phase:
    selector = f"helmhive.dev/pool={POOL},{_RUNNERS}"
    seen = {ln.get("job") for ln in kube.log_lines(selector) if ln.get("message") == "job pod agent starting"}
    before = kube.writes()
    say(
        f"==> {name}: {len(names)} jobs on {pool_name}" + (f", one every {interval} s" if interval else ", all at once")
    )
    if interval:
        for n in names:
            kube.apply([job(n, pool_name)])
            time.sleep(interval)
    else:
        kube.apply([job(n, pool_name) for n in names])
    prefix = names[0].rsplit("-", 1)[0]
    wait(f"{len(names)} jobs of {name} to end", lambda: ended(kube, prefix, len(names)), timeout=3600)
    phase = Phase(name=name, jobs=len(names), writes=kube.writes() - before, failed=failures(kube, prefix))
    if phase.failed:
        say(f"  note: jobs that failed: {phase.failed}")
    if pool_name != POOL:
        return phase
    lines = kube.log_lines(selector)
    starts = {ln["job"]: ln for ln in lines if ln.get("message") == "job pod agent starting" and ln["job"] not in seen}
    acquired = {ln["job"]: ln for ln in lines if ln.get("message") in {"job pod claimed", "job pod created"}}
    mine = [n for n in names if n in starts]
    if len(mine) < len(names):
        say(f"  note: {len(names) - len(mine)} job(s) have no agent-start line (ended before their agent started)")
    phase.queue = [float(starts[n]["queuedSeconds"]) for n in mine]
    phase.pod_to_agent = [timestamp(starts[n]) - timestamp(acquired[n]) for n in mine if n in acquired]
    phase.warm = sum(1 for n in mine if starts[n].get("warm"))
    return phase


def warm_pods(kube: Kube) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = kube.get("pods", "-n", NS, "-l", f"helmhive.dev/pool={POOL},helmhive.dev/warm=true")[
        "items"
    ]
    return [p for p in pods if all(c.get("ready") for c in p.get("status", {}).get("containerStatuses", [{}]))]


def set_warm(kube: Kube, warm: int) -> None:
    patch = json.dumps({"spec": {"execution": {"warmPods": warm}}})
    kube.run("patch", "runnerpool", POOL, "-n", NS, "--type=merge", "-p", patch)
    wait(f"{warm} warm pods ready", lambda: len(warm_pods(kube)) >= warm, timeout=600)


def schedulable(kube: Kube) -> int:
    return sum(
        1
        for r in kube.get("runners", "-n", NS)["items"]
        if any(c["type"] == "Schedulable" and c["status"] == "True" for c in r.get("status", {}).get("conditions", []))
    )


def install(kube: Kube, operator_image: str) -> None:
    helm = ensure_helm(log=sys.stdout)
    repo, tag = operator_image.rsplit(":", 1)
    say("==> helm upgrade --install helmhive")
    subprocess.run(
        [str(helm), "upgrade", "--install", "helmhive", str(REPO / "charts" / "helmhive"), "-n", "helmhive-system",
         "--create-namespace", "--kubeconfig", str(kube.cluster.kubeconfig), "--set",
         f"operator.image.repository={repo}", "--set", f"operator.image.tag={tag}", "--set",
         "operator.image.pullPolicy=Never", "--wait", "--timeout", "5m"],
        check=True, capture_output=True,
    )  # fmt: skip
    kube.run("delete", "namespace", NS, "--ignore-not-found", "--wait=true")
    kube.run("create", "namespace", NS)
    kube.run(
        "label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted", "helmhive.dev/workspaces=enabled"
    )


def report(commit: str, args: argparse.Namespace, phases: list[Phase], baseline: list[float]) -> None:
    say(f"\nresults at {commit} ({args.replicas} runners x {args.concurrency} slots per pool, warmPods {args.warm}):")
    for phase in phases:
        say("  " + phase.row())
    say(f"  {'kubelet start':<15} pods {len(baseline):>3}  create->Running p50 {pct(baseline, 0.5):5.2f} s "
        f"p95 {pct(baseline, 0.95):5.2f} s ({args.concurrency * args.replicas} at a time)")  # fmt: skip
    in_runner, cold = phases[0], phases[1]
    base = in_runner.per_job(in_runner.writes.helmhive)
    for phase in phases[1:]:
        ratio = phase.per_job(phase.writes.helmhive) / base
        line = f"  {phase.name} / in-runner burst: Helmhive writes/job {ratio:.2f}"
        if phase is not cold:
            pod_ratio = pct(phase.pod_to_agent, 0.5) / pct(cold.pod_to_agent, 0.5)
            queue_ratio = pct(phase.queue, 0.95) / pct(cold.queue, 0.95)
            line += f";  / cold burst: pod->agent p50 {pod_ratio:.2f}, queue->agent p95 {queue_ratio:.2f}"
        say(line)
    for q, name in ((0.5, "p50"), (0.95, "p95")):
        cold_s, kubelet_s = pct(cold.pod_to_agent, q), pct(baseline, q)
        say(f"  cold pod->agent {name} {cold_s:.2f} s = kubelet start {kubelet_s:.2f} s {cold_s - kubelet_s:+.2f} s "
            f"(ratio {cold_s / kubelet_s:.2f})")  # fmt: skip
    for phase in phases:
        top = sorted(phase.writes.helmhive_by_resource.items(), key=lambda kv: -kv[1])[:6]
        parts = ", ".join(f"{name} {count / phase.jobs:.2f}" for name, count in top)
        say(f"  {phase.name}: Helmhive writes/job by resource: {parts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--in-runner", type=int, default=100, help="jobs of the in-runner burst (as many as a burst)")
    parser.add_argument("--warm", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steady", type=int, default=20, help="jobs of the steady phase")
    parser.add_argument("--interval", type=float, default=3.0)
    parser.add_argument("--baseline", type=int, default=20, help="pods of the kubelet baseline")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    say(f"==> kind cluster helmhive-bench (commit {commit})")
    cluster = ensure_cluster("helmhive-bench", log=sys.stdout)
    images = load_helmhive(cluster, log=sys.stdout)
    kube = Kube(cluster, NS)
    install(kube, images.operator)
    kube.apply(documents(images.runner, concurrency=args.concurrency, replicas=args.replicas))
    runners = 2 * args.replicas
    wait(f"{runners} runners schedulable", lambda: schedulable(kube) >= runners, timeout=600)
    burst = [f"inrunner-{i}" for i in range(args.in_runner)]
    phases = [run_phase(kube, "in-runner burst", burst, pool_name=IN_RUNNER, interval=0)]
    cold = [f"cold-{i}" for i in range(args.jobs)]
    phases.append(run_phase(kube, "cold burst", cold, pool_name=POOL, interval=0))
    set_warm(kube, args.warm)
    warm = [f"warm-{i}" for i in range(args.jobs)]
    phases.append(run_phase(kube, "warm burst", warm, pool_name=POOL, interval=0))
    set_warm(kube, args.warm)
    steady = [f"steady-{i}" for i in range(args.steady)]
    phases.append(run_phase(kube, "warm steady", steady, pool_name=POOL, interval=args.interval))
    say(f"==> kubelet baseline: {args.baseline} copies of a warm job pod, {args.concurrency * args.replicas} at a time")
    template = warm_pods(kube)[0]
    baseline = pod_start_baseline(kube, template, count=args.baseline, wave=args.concurrency * args.replicas)
    report(commit, args, phases, baseline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

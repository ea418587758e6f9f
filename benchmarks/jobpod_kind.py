"""The kind side of the job-pod benchmark (``bench_jobpods.py``): kubectl, the API server's writes
split by what made them, the runners' log lines, and the kubelet's own start of a pod like a job pod.

- :func:`parse_writes` (pure) splits ``apiserver_request_total``'s writes: Helmhive's own resources
  (routing, the runners' job status, audit: the path InRunner jobs take too), pods (the runner's
  create, claim and delete, the scheduler's binding, the kubelet's status), Events, Leases (which
  grow with time, not jobs: heartbeats, leader election, node leases) and the rest.
- :func:`pod_start_baseline`: copies of a warm job pod (same image, containers, requests and
  RuntimeClass; none of Helmhive's labels, so no runner claims them), created ``wave`` at a time,
  each timed from its create's answer to the first watch event that shows it Running. That is the
  kubelet's own pod start on this cluster, the baseline of the goal "cold no worse than the
  kubelet's pod start plus 1 s".
"""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml
from kubernetes import client, config, watch

from helmhive.devcluster.kind.cluster import KindCluster

__all__ = [
    "Kube",
    "Writes",
    "build_baseline_pod",
    "parse_writes",
    "pct",
    "pod_start_baseline",
    "say",
    "timestamp",
    "wait",
]

_WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
_SAMPLE = re.compile(r"^apiserver_request_total\{([^}]*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
BASELINE_LABEL = {"app.kubernetes.io/name": "helmhive-bench-baseline"}


def say(text: str) -> None:
    print(text, flush=True)


def wait(what: str, check: Callable[[], bool], *, timeout: float) -> None:
    say(f"  waiting: {what} …")
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting: {what}")
        time.sleep(1.0)


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Writes:
    """Writes the API server answered, by part (a snapshot, or the difference of two)."""

    helmhive: int = 0
    pods: int = 0
    pod_creates: int = 0
    events: int = 0
    leases: int = 0
    other: int = 0
    helmhive_by_resource: Mapping[str, int] = field(default_factory=dict)

    def __sub__(self, before: Writes) -> Writes:
        by = Counter(self.helmhive_by_resource)
        by.subtract(before.helmhive_by_resource)
        return Writes(
            helmhive=self.helmhive - before.helmhive,
            pods=self.pods - before.pods,
            pod_creates=self.pod_creates - before.pod_creates,
            events=self.events - before.events,
            leases=self.leases - before.leases,
            other=self.other - before.other,
            helmhive_by_resource={k: v for k, v in by.items() if v},
        )

    @property
    def total(self) -> int:
        """Every write but the Leases' (those grow with time, not with jobs)."""
        return self.helmhive + self.pods + self.events + self.other


def parse_writes(metrics: str) -> Writes:
    """The writes in a ``/metrics`` text, split by part (see the module)."""
    parts: Counter[str] = Counter()
    by: Counter[str] = Counter()
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group(1)))
        if labels.get("verb") not in _WRITE_VERBS:
            continue
        count = int(float(match.group(2)))
        group, resource, sub = labels.get("group", ""), labels.get("resource", ""), labels.get("subresource", "")
        if group == "helmhive.dev":
            parts["helmhive"] += count
            by[f"{resource}/{sub}" if sub else resource] += count
        elif group == "" and resource == "pods":
            parts["pods"] += count
            if labels["verb"] == "POST" and not sub:
                parts["pod_creates"] += count
        elif resource == "events":
            parts["events"] += count
        elif group == "coordination.k8s.io":
            parts["leases"] += count
        else:
            parts["other"] += count
    return Writes(**parts, helmhive_by_resource=dict(by))


@dataclass
class Kube:
    cluster: KindCluster
    namespace: str

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
                [str(self.cluster.kubectl), "--kubeconfig", str(self.cluster.kubeconfig), "apply", "-n",
                 self.namespace, "-f", "-"],
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

    def writes(self) -> Writes:
        return parse_writes(self.run("get", "--raw", "/metrics"))

    def log_lines(self, selector: str) -> list[dict[str, Any]]:
        """The JSON log lines of the pods ``selector`` picks (others skipped)."""
        text = self.run("logs", "-n", self.namespace, "-l", selector, "--tail=-1", "--prefix=false",
                        "--max-log-requests=10")  # fmt: skip
        lines = []
        for raw in text.splitlines():
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                continue
        return lines


def timestamp(line: Mapping[str, Any]) -> float:
    return datetime.fromisoformat(str(line["timestamp"])).timestamp()


def build_baseline_pod(pod: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A copy of ``pod``'s spec as a new, unbound pod of its own (none of Helmhive's labels or owners)."""
    spec = copy.deepcopy(dict(pod["spec"]))
    for bound in ("nodeName", "activeDeadlineSeconds"):
        spec.pop(bound, None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(BASELINE_LABEL)}, "spec": spec}


def pod_start_baseline(kube: Kube, pod: Mapping[str, Any], *, count: int, wave: int) -> list[float]:
    """Seconds from each create's answer to the watch event showing the pod Running (see the module)."""
    config.load_kube_config(config_file=str(kube.cluster.kubeconfig))
    core = client.CoreV1Api()
    selector = ",".join(f"{k}={v}" for k, v in BASELINE_LABEL.items())
    seconds: list[float] = []
    for first in range(0, count, wave):
        names = [f"baseline-{i}" for i in range(first, min(count, first + wave))]
        say(f"  kubelet baseline: creating {', '.join(names)}")
        listed = core.list_namespaced_pod(kube.namespace, label_selector=selector)
        created: dict[str, float] = {}
        for name in names:
            core.create_namespaced_pod(kube.namespace, build_baseline_pod(pod, name))
            created[name] = time.monotonic()
        running: dict[str, float] = {}
        stream = watch.Watch()
        for event in stream.stream(
            core.list_namespaced_pod, kube.namespace, label_selector=selector,
            resource_version=listed.metadata.resource_version, timeout_seconds=300,
        ):  # fmt: skip
            obj = event["object"]
            name = obj.metadata.name
            if name in created and name not in running and obj.status.phase == "Running":
                running[name] = time.monotonic() - created[name]
                if len(running) == len(names):
                    stream.stop()
        if len(running) < len(names):
            raise SystemExit(f"baseline pods not Running within 300 s: {sorted(set(names) - set(running))}")
        seconds += running.values()
        for name in names:
            core.delete_namespaced_pod(name, kube.namespace, grace_period_seconds=0)
    wait("baseline pods gone", lambda: not core.list_namespaced_pod(kube.namespace, label_selector=selector).items,
         timeout=300)  # fmt: skip
    return seconds

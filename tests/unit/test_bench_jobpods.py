"""The job-pod benchmark's pure parts: writes split by what made them, and the kubelet baseline's pod."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from jobpod_kind import BASELINE_LABEL, Writes, build_baseline_pod, parse_writes


def _sample(group: str, resource: str, verb: str, count: str, sub: str = "") -> str:
    labels = (
        f'code="200",component="apiserver",dry_run="",group="{group}",resource="{resource}",scope="resource",'
        f'subresource="{sub}",verb="{verb}",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {count}"


METRICS = "\n".join(
    [
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
        "# TYPE apiserver_request_total counter",
        _sample("", "pods", "POST", "7"),
        _sample("", "pods", "PATCH", "20", sub="status"),
        _sample("", "pods", "GET", "900"),
        _sample("helmhive.dev", "agentjobs", "PATCH", "12", sub="status"),
        _sample("helmhive.dev", "auditrecords", "POST", "3"),
        _sample("", "events", "POST", "5"),
        _sample("events.k8s.io", "events", "POST", "4"),
        _sample("coordination.k8s.io", "leases", "PUT", "1e+03"),
        _sample("", "configmaps", "APPLY", "2"),
        'apiserver_request_total_other{verb="POST"} 99',
    ]
)


def test_writes_are_split_by_what_made_them_and_reads_are_not_counted() -> None:
    w = parse_writes(METRICS)
    assert (w.helmhive, w.pods, w.pod_creates, w.events, w.leases, w.other) == (15, 27, 7, 9, 1000, 2)
    assert w.helmhive_by_resource == {"agentjobs/status": 12, "auditrecords": 3}
    assert w.total == 15 + 27 + 9 + 2, "Leases grow with time, not jobs: left out"


def test_a_difference_is_per_part_and_drops_what_did_not_change() -> None:
    before = Writes(helmhive=10, pods=4, pod_creates=1, helmhive_by_resource={"agentjobs/status": 8, "runners": 2})
    after = Writes(helmhive=16, pods=9, pod_creates=2, helmhive_by_resource={"agentjobs/status": 14, "runners": 2})
    diff = after - before
    assert (diff.helmhive, diff.pods, diff.pod_creates) == (6, 5, 1)
    assert diff.helmhive_by_resource == {"agentjobs/status": 6}


def test_the_baseline_pod_is_the_warm_pods_spec_unbound_and_unclaimable() -> None:
    warm = {
        "metadata": {"name": "bench-job-x", "labels": {"helmhive.dev/warm": "true"}, "ownerReferences": [{}]},
        "spec": {"nodeName": "helmhive-worker", "activeDeadlineSeconds": 3600, "containers": [{"name": "shim"}]},
        "status": {"phase": "Running"},
    }
    pod = build_baseline_pod(warm, "baseline-0")
    assert pod["metadata"] == {"name": "baseline-0", "labels": BASELINE_LABEL}
    assert pod["spec"] == {"containers": [{"name": "shim"}]}
    assert "status" not in pod and warm["spec"]["nodeName"] == "helmhive-worker", "the input is not changed"

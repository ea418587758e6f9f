"""What every phase of the routing benchmark shares: its namespaces and API path, the bench
Profile, the simulated runners' labels, capabilities and models, and an AgentJob's body.

Constants and one pure builder; no I/O.
"""

from __future__ import annotations

from typing import Any

NS = "routing-bench"
EVENT_INTERVAL_SECONDS = 30.0  # the operator's HELMHIVE_ROUTING_EVENT_INTERVAL_SECONDS default
RAW_NS = "raw-bench"
AFTER_NS = "raw-bench-after"
POOL_SIZE = 100
MODEL = "sonnet-4-5"
GROUP_PATH = "/apis/helmhive.dev/v1alpha1"
BENCH_PROFILE_SPEC: dict[str, Any] = {
    "envelope": "implementation-probe",
    "purpose": "bench",
    "providerMappings": [{"provider": "anthropic", "model": MODEL}],
}
"""The spec of the bench's Profile ``bench``: the one every routed job binds, and the like-for-like baseline's."""
RUNNER_LABELS = {"domain": "code", "region": "eu"}
RUNNER_CAPABILITIES = ["structured-output", "diff-review", "workspace-write"]
RUNNER_MODELS = ("opus-4", MODEL, "haiku")


def job_body(name: str, kind: str = "implementation-probe", profile: str = "bench") -> dict[str, Any]:
    return {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {"workspace": "shop", "jobKind": kind, "profile": profile, "request": {"title": name, "prompt": "go"}},
    }

"""What a chaos run is made of: its options and result, the namespace's objects, the jobs, the report.

Pure apart from :func:`retrying` (which calls what it is given); :mod:`chaos` runs it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_invariants import Violation
from kubernetes.client.rest import ApiException

GROUP, VERSION = "helmhive.dev", "v1alpha1"

NS = "chaos"
POOL = "chaos"
FAULTS = ("operator-kill", "runner-kill", "apiserver-restart", "etcd-restart", "watch-drop")
SWEPT = ("agentjobs", "runners", "runnerpools", "auditrecords", "profiles", "workspaces", "sessionbindings")


@dataclass(kw_only=True)
class ChaosOptions:
    """What one run does; every field is a command-line option of the same name."""

    seed: int
    jobs: int = 40
    runners: int = 2
    concurrency: int = 2
    operator_kills: int = 3
    runner_kills: int = 2
    apiserver_restarts: int = 1
    etcd_restarts: int = 1
    watch_drops: int = 1
    job_seconds: float = 1.0
    capacity_deadline: float = 300.0
    """The operator's ``HELMHIVE_ROUTING_CAPACITY_DEADLINE_SECONDS``: how long a job may wait for a free slot."""
    job_timeout: int = 120
    """Each job's ``spec.timeoutSeconds``."""
    settle_seconds: float = 0.0
    """How long after the faults stop every job must have ended; 0: the documented bound (:meth:`bound`)."""
    audit_seconds: float = 90.0
    max_delay: float = 2.0
    runner_down_max: float = 12.0
    fault_minutes: float = 0.0
    """Stop injecting faults after this long (0: never), then settle and check as usual."""
    workdir: Path | None = None

    def bound(self) -> float:
        """The latest a job may end once the faults stop: a waiting job fails ``CapacityDeadlineExceeded`` at
        its capacity deadline, a running one ends by its timeout or, its runner lost, one Lease (5 s) plus the
        2 s grace later; a minute more for a loaded machine."""
        return self.settle_seconds or self.capacity_deadline + self.job_timeout + 5 + 2 + 60


@dataclass
class ChaosResult:
    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    figures: dict[str, Any] = field(default_factory=dict)

    def by_invariant(self) -> Counter[str]:
        return Counter(v.invariant for v in self.violations)


def canary_for(seed: int) -> str:
    return f"hh-chaos-canary-{seed:x}-sk-do-not-leak"


def namespace_docs(opts: ChaosOptions, canary: str) -> list[dict[str, Any]]:
    """The canary Secret, the reference RunnerPool, a Workspace and its two Profiles."""
    api = f"{GROUP}/{VERSION}"
    steps = max(1, round(opts.job_seconds / 0.25))
    profile = {
        "purpose": "Chaos run.",
        "instructions": "Answer briefly.",
        "providerMappings": [{"provider": "reference"}],
    }
    env = [
        {"name": "HELMHIVE_REFERENCE_AGENT_SLOW_STEPS", "value": str(steps)},
        {"name": "HELMHIVE_REFERENCE_AGENT_SLOW_INTERVAL", "value": "0.25"},
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "reference-token"},
            "stringData": {"token": canary},
        },
        {
            "apiVersion": api,
            "kind": "RunnerPool",
            "metadata": {"name": POOL},
            "spec": {
                "provider": "reference",
                "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent", "env": env}},
                "image": "ghcr.io/helmhive/helmhive:test",
                "credential": {
                    "secretRef": {"name": "reference-token", "key": "token"},
                    "envName": "HELMHIVE_REFERENCE_AGENT_TOKEN",
                },
                "capabilities": ["structured-output", "diff-review", "workspace-write"],
                "concurrency": opts.concurrency,
                "replicas": opts.runners,
                "heartbeat": {"leaseDurationSeconds": 5, "renewIntervalSeconds": 1, "reportRefreshSeconds": 60},
            },
        },
        {
            "apiVersion": api,
            "kind": "Workspace",
            "metadata": {"name": "payments"},
            "spec": {
                "repository": {"url": "https://git.example.com/payments.git"},
                "profiles": [
                    {"jobKind": "connection-test", "profile": "ref-check"},
                    {"jobKind": "implementation-probe", "profile": "ref-impl"},
                ],
            },
        },
        {
            "apiVersion": api,
            "kind": "Profile",
            "metadata": {"name": "ref-check"},
            "spec": {"envelope": "connection-test", **profile},
        },
        {
            "apiVersion": api,
            "kind": "Profile",
            "metadata": {"name": "ref-impl"},
            "spec": {"envelope": "implementation-probe", **profile},
        },
    ]


def job_doc(index: int, timeout: int = 120) -> dict[str, Any]:
    """Every third job an implementation probe (never re-run once started), the rest read-only connection tests."""
    kind = "implementation-probe" if index % 3 == 2 else "connection-test"
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentJob",
        "metadata": {"name": f"job-{index:05d}"},
        "spec": {
            "workspace": "payments",
            "jobKind": kind,
            "timeoutSeconds": timeout,
            "request": {"title": f"chaos {index}", "prompt": f"Job {index}.\nREFERENCE-AGENT: slow"},
        },
    }


def retrying(call: Callable[[], Any], *, timeout: float = 120.0) -> Any:
    """One write, retried while the API server restarts (an AlreadyExists after a lost answer counts as done)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except ApiException as err:
            if err.status == 409:
                return None
            if time.monotonic() > deadline:
                raise
        except Exception:  # connection refused or reset while a component restarts
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def render(result: ChaosResult) -> str:
    by = result.by_invariant()
    invariants = (
        "double-assignment",
        "over-commit",
        "lost-job",
        "audit-job-routed",
        "audit-runner-status",
        "audit-runner-registered",
        "secret-leaked",
    )
    lines = [
        f"seed {result.seed}: faults " + ", ".join(f"{k} {result.faults[k]}" for k in FAULTS),
        "violations "
        + ", ".join(f"{k} {by[k]}" for k in invariants)
        + "".join(f", {k} {n}" for k, n in sorted(by.items()) if k not in invariants),
        "outcomes " + ", ".join(f"{k} {n}" for k, n in sorted(result.outcomes.items())),
        "figures " + json.dumps(result.figures),
    ]
    return "\n".join(lines)

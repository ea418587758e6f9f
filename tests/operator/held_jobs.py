"""Helpers for cluster tests that hold jobs on simulated runners: a schedulable fleet, profiles, jobs, starting them.

Each runner writes as its own pod (a token of its pool's ServiceAccount bound to the pod), so
RBAC and the runner admission policies see what a real runner sends; a job is marked Running
by the runner it was assigned to, as ``runner/helmhive/runner/jobs/status.py`` does.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pools import Pool, condition, make_pool
from simulated_runner import GROUP, VERSION, SimulatedRunner

from harness.kube import IdentityFactory, Kube
from harness.wait import wait_for
from helmhive.policy.conditions import set_condition

__all__ = [
    "CAPABILITIES",
    "SONNET",
    "Fleet",
    "create_profile",
    "get_job",
    "job_manifest",
    "list_jobs",
    "make_fleet",
    "running",
    "start_job",
]

SONNET = "claude-sonnet-4-5"
CAPABILITIES = ["structured-output", "diff-review", "workspace-write"]


@dataclass
class Fleet:
    """A pool and its runners by pod name."""

    pool: Pool
    runners: dict[str, SimulatedRunner]

    def stop(self) -> None:
        for runner in self.runners.values():
            runner.stop_heartbeat()


def make_fleet(
    kube: Kube,
    identities: IdentityFactory,
    namespace: str,
    *,
    name: str,
    replicas: int,
    slots: int,
    lease_seconds: int = 30,
    renew_seconds: int = 5,
) -> Fleet:
    """A pool of ``replicas`` runners, each Online, Authenticated and Schedulable with ``slots`` slots.

    Leases last ``lease_seconds`` (30) and are renewed every ``renew_seconds`` (5); call
    :meth:`Fleet.stop` when done.
    """
    pool = make_pool(
        kube,
        identities,
        namespace,
        name,
        replicas=replicas,
        concurrency=slots,
        capabilities=CAPABILITIES,
        heartbeat={
            "leaseDurationSeconds": lease_seconds,
            "renewIntervalSeconds": renew_seconds,
            "reportRefreshSeconds": 300,
        },
    )
    pods = pool.wait_pods(replicas, timeout=120)
    generation = wait_for(
        lambda: (pool.get().get("status") or {}).get("credentialGeneration"),
        timeout=60,
        describe=f"pool {name}'s credential generation",
    )
    wait_for(
        lambda: kube.core.read_namespaced_service_account(pool.service_account, namespace),
        timeout=60,
        describe=f"ServiceAccount {pool.service_account}",
    )
    fleet = Fleet(pool=pool, runners={})
    try:
        for pod in pods:
            identity = identities(namespace, pool.service_account, bound_pod=pod, create=False, expiration_seconds=3600)
            runner = SimulatedRunner(
                identity=identity, namespace=namespace, pool=name, name=pod, lease_seconds=lease_seconds
            )
            runner.register(generation=generation)
            report = runner.build_report(generation=generation)
            report.update(concurrency=slots, capabilities=CAPABILITIES)
            runner.apply_status({"report": report})
            runner.start_heartbeat(interval=renew_seconds)
            fleet.runners[pod] = runner
        for pod in pods:
            pool.wait_runner(pod, "schedulable", timeout=120, schedulable="Schedulable")
    except BaseException:
        fleet.stop()
        raise
    return fleet


def create_profile(kube: Kube, namespace: str, name: str, envelope: str) -> None:
    """A Profile for ``envelope`` mapping to the fleet's provider and model; waits until it is Valid."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Profile",
        "metadata": {"name": name},
        "spec": {
            "envelope": envelope,
            "purpose": "tests",
            "providerMappings": [{"provider": "anthropic", "model": SONNET}],
        },
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "profiles", body)
    wait_for(
        lambda: (
            condition(
                kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "profiles", name), "Valid"
            ).get("status")
            == "True"
        ),
        timeout=60,
        describe=f"profile {name} to be Valid",
    )


def job_manifest(name: str, *, profile: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {
            "workspace": "shop",
            "jobKind": kind,
            "profile": profile,
            "request": {"title": name, "prompt": "do it"},
        },
    }


def assign_job(kube: Kube, namespace: str, name: str, runner: str) -> dict[str, Any]:
    """Write an assignment onto job ``name`` as routing would (no operator involved); the job after it."""
    assignment = {
        "runner": runner,
        "runnerNamespace": namespace,
        "pool": "claude",
        "provider": "anthropic",
        "model": "claude-sonnet-4-5",
        "modelSource": "mapping",
        "mappingIndex": 0,
        "assignedAt": "2026-12-02T00:00:00Z",
    }
    result: dict[str, Any] = kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "agentjobs", name, {"status": {"assignment": assignment}}
    )
    return result


def get_job(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", name)
    return obj


def list_jobs(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs")[
        "items"
    ]
    return items


def running(job: dict[str, Any]) -> bool:
    return condition(job, "Running").get("status") == "True"


def start_job(runner: SimulatedRunner, job: dict[str, Any]) -> None:
    """Mark ``job`` Running as its runner does: conditional on the job's resourceVersion (409 if stale)."""
    now = dt.datetime.now(dt.UTC)
    meta, status = job["metadata"], job.get("status") or {}
    text = f"running on runner {runner.name}"
    conditions = status.get("conditions")
    for ctype, value in (("Running", True), ("Ready", None)):
        conditions = set_condition(
            conditions, type=ctype, status=value, reason="Started", message=text, generation=meta["generation"], now=now
        ).conditions
    patch = {
        "metadata": {"resourceVersion": meta["resourceVersion"]},
        "status": {
            "conditions": conditions,
            "result": {"outcome": "Started", "startedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ")},
        },
    }
    runner.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, runner.namespace, "agentjobs", meta["name"], patch
    )

"""Routing on a real API server with the real operator: fail closed, no over-commit, crash safety, memory.

Runners are made schedulable the way real ones are: each writes its own Lease and its
``status.report`` with a token of its pool's ServiceAccount bound to its pod (the StatefulSet
controller makes the pods; nothing runs them), and the operator derives ``Schedulable``.
Active jobs are always counted from the jobs themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from pools import Pool, condition, make_pool
from simulated_runner import GROUP, VERSION, SimulatedRunner

from harness.cluster import ClusterHandle
from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.policy.audit.routing import iter_routing_decisions
from helmhive.policy.routing.status import build_candidate_rows

SONNET = "claude-sonnet-4-5"
CAPABILITIES = ["structured-output", "diff-review", "workspace-write"]

Fleet = Callable[..., tuple[Pool, list[SimulatedRunner]]]


@pytest.fixture
def fleet(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> Iterator[Fleet]:
    """Make a pool whose runners are Online, Authenticated and Schedulable; heartbeats stop afterwards."""
    started: list[SimulatedRunner] = []

    def make(
        name: str = "claude",
        *,
        provider: str = "anthropic",
        replicas: int = 2,
        concurrency: int = 2,
        models: Sequence[str] = (SONNET,),
    ) -> tuple[Pool, list[SimulatedRunner]]:
        pool = make_pool(
            kube,
            service_account_identity,
            namespace,
            name,
            replicas=replicas,
            provider=provider,
            concurrency=concurrency,
            capabilities=CAPABILITIES,
            heartbeat={"leaseDurationSeconds": 30, "renewIntervalSeconds": 5, "reportRefreshSeconds": 300},
        )
        pods = pool.wait_pods(replicas)
        generation = wait_for(
            lambda: (pool.get().get("status") or {}).get("credentialGeneration"),
            timeout=30,
            describe=f"pool {name}'s credential generation",
        )
        runners = []
        for pod in pods:
            runner = pool.acting_as(pod, lease_seconds=30)
            runner.register(generation=generation, provider=provider, models=tuple(models))
            report = runner.build_report(generation=generation, provider=provider, models=tuple(models))
            report.update(concurrency=concurrency, capabilities=CAPABILITIES)
            runner.apply_status({"report": report})
            runner.start_heartbeat(interval=5)
            started.append(runner)
            runners.append(runner)
        for pod in pods:
            pool.wait_runner(pod, "schedulable", timeout=60, schedulable="Schedulable")
        return pool, runners

    try:
        yield make
    finally:
        for runner in started:
            runner.stop_heartbeat()


def apply(kube: Kube, namespace: str, plural: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)


def profile(kube: Kube, namespace: str, name: str, **spec: Any) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Profile",
        "metadata": {"name": name},
        "spec": {"purpose": "tests", "providerMappings": [{"provider": "anthropic", "model": SONNET}], **spec},
    }
    apply(kube, namespace, "profiles", body)

    def valid() -> bool:
        obj = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "profiles", name)
        return condition(obj, "Valid").get("status") == "True"

    wait_for(valid, timeout=30, describe=f"profile {name} to be Valid")


def job_manifest(name: str, profile_name: str, kind: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {
            "workspace": "shop",
            "jobKind": kind,
            "profile": profile_name,
            "request": {"title": name, "prompt": "do it"},
            **spec,
        },
    }


def get_job(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", name)
    return obj


def list_jobs(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs")[
        "items"
    ]
    return items


def audits(kube: Kube, namespace: str, action: str) -> list[dict[str, Any]]:
    """The ``action`` records, and the ``action`` decisions of the routing batches, one spec each."""
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "auditrecords",
        label_selector=f"helmhive.dev/audit-action in ({action},RoutingDecisions)",
    )["items"]
    return [d for d in iter_routing_decisions(items) if d["spec"]["action"] == action]


def routed(kube: Kube, namespace: str, name: str, status: str) -> Callable[[], dict[str, Any]]:
    def check() -> dict[str, Any]:
        obj = get_job(kube, namespace, name)
        cond = condition(obj, "Routed")
        assert cond.get("status") == status, (obj.get("status") or {}).get("conditions")
        return obj

    return check


def local_candidates(status: dict[str, Any], namespace: str) -> dict[str, str]:
    """Runner -> reason for the candidates in ``namespace``.

    Other tests' runners show as NamespaceNotServed, or as NotSchedulable when they are already
    unschedulable (a test's namespace being deleted: its pool gone, its Runner not yet), which the
    router checks first; never as anything closer to running the job.
    """
    rows = build_candidate_rows(status["routing"]["candidates"])
    foreign = [c["reason"] for c in rows if c["namespace"] != namespace]
    assert all(r == "NamespaceNotServed" or r.startswith("NotSchedulable") for r in foreign), rows
    return {c["runner"]: c["reason"] for c in rows if c["namespace"] == namespace}


def explain_routing(cluster: ClusterHandle, *args: str, via_kubectl: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``helmhive explain-routing`` (or ``kubectl helmhive explain-routing``) as the admin."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if via_kubectl:
        assert cluster.kubectl is not None
        cmd = [str(cluster.kubectl), "helmhive", "explain-routing", *args]
    else:
        cmd = [sys.executable, "-m", "helmhive", "explain-routing", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)


def test_an_unadvertised_explicit_model_fails_closed_at_queue_time_with_the_candidate_table(
    fleet: Fleet, kube: Kube, namespace: str, cluster: ClusterHandle, tmp_path: Path
) -> None:
    fleet(models=[SONNET])
    profile(
        kube,
        namespace,
        "review-opus",
        envelope="review-probe",
        providerMappings=[{"provider": "anthropic", "model": "claude-opus-4-1"}],
    )
    apply(kube, namespace, "agentjobs", job_manifest("wants-opus", "review-opus", "review-probe"))

    obj = wait_for(routed(kube, namespace, "wants-opus", "False"), timeout=60, describe="Routed=False")
    status = obj["status"]
    assert condition(obj, "Routed")["reason"] == "ModelNotAdvertised"
    assert (condition(obj, "Ready")["status"], condition(obj, "Ready")["reason"]) == ("False", "ModelNotAdvertised")
    assert "claude-opus-4-1" in condition(obj, "Routed")["message"]
    assert "assignment" not in status
    assert local_candidates(status, namespace) == dict.fromkeys(
        ["claude-0", "claude-1"], "ModelNotAdvertised:claude-opus-4-1"
    )
    first = status["routing"]["candidates"][0]
    assert (first["provider"], first["mappingIndex"], first["model"]) == ("anthropic", 0, "claude-opus-4-1")
    assert status["routing"]["consideredRunners"] >= 2
    failed = wait_for(lambda: audits(kube, namespace, "JobRoutingFailed"), timeout=30, describe="the failure audit")
    assert [a["spec"]["object"]["name"] for a in failed] == ["wants-opus"]
    assert failed[0]["spec"]["details"]["reason"] == "ModelNotAdvertised"
    # A failure keeps its own Warning Event on the job, for kubectl describe.
    warned = wait_for(
        lambda: (
            kube.core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=wants-opus,reason=JobRoutingFailed"
            ).items
        ),
        timeout=30,
        describe="the JobRoutingFailed Warning Event",
    )
    assert [e.type for e in warned] == ["Warning"] and "claude-opus-4-1" in warned[0].message

    # explain-routing shows the same decision, stored and fresh; -o json for machines.
    shown = explain_routing(cluster, "wants-opus", "-n", namespace, "-o", "json")
    assert shown.returncode == 1, shown.stderr
    explained = json.loads(shown.stdout)
    assert explained["decision"]["reason"] == "ModelNotAdvertised"
    assert local_candidates({"routing": explained["decision"]}, namespace) == dict.fromkeys(
        ["claude-0", "claude-1"], "ModelNotAdvertised:claude-opus-4-1"
    )
    assert condition({"status": explained["stored"]}, "Routed")["reason"] == "ModelNotAdvertised"

    # A dry run of a manifest, through kubectl's plugin mechanism: the table, and nothing is written.
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job_manifest("dry-run-sonnet", "review-sonnet", "review-probe")))
    profile(kube, namespace, "review-sonnet", envelope="review-probe")
    table = explain_routing(cluster, "-f", str(manifest), "-n", namespace, via_kubectl=True)
    assert table.returncode == 0, table.stdout + table.stderr
    assert "Assigned" in table.stdout
    assert "Selected" in table.stdout
    assert SONNET in table.stdout
    assert "dry-run-sonnet" not in {j["metadata"]["name"] for j in list_jobs(kube, namespace)}


def _settled(kube: Kube, namespace: str, count: int) -> Callable[[], list[dict[str, Any]]]:
    """Every job is assigned or visibly waiting for capacity."""

    def check() -> list[dict[str, Any]]:
        jobs = list_jobs(kube, namespace)
        assert len(jobs) == count
        unsettled = [
            j["metadata"]["name"]
            for j in jobs
            if not (j.get("status") or {}).get("assignment")
            and condition(j, "Routed").get("reason") != "WaitingForCapacity"
        ]
        assert not unsettled, f"{len(unsettled)} jobs not yet assigned or waiting: {unsettled[:5]}"
        return jobs

    return check


def _assigned(jobs: list[dict[str, Any]]) -> dict[str, str]:
    return {
        j["metadata"]["name"]: j["status"]["assignment"]["runner"]
        for j in jobs
        if (j.get("status") or {}).get("assignment")
    }


def test_a_burst_of_fifty_jobs_never_over_commits_even_when_the_operator_is_killed_mid_burst(
    fleet: Fleet, kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    fleet(replicas=2, concurrency=2)
    profile(kube, namespace, "burst", envelope="implementation-probe")
    names = [f"burst-{i:02d}" for i in range(50)]
    for name in names:
        apply(kube, namespace, "agentjobs", job_manifest(name, "burst", "implementation-probe"))

    def some_progress() -> int:
        bound = sum(1 for j in list_jobs(kube, namespace) if (j.get("status") or {}).get("profile"))
        assert bound >= 5, bound
        return bound

    wait_for(some_progress, timeout=60, interval=0.05, describe="the burst to be under way")
    operator.kill()
    operator.start()

    jobs = wait_for(_settled(kube, namespace, 50), timeout=180, interval=1, describe="all 50 jobs settled")
    assigned = _assigned(jobs)
    assert Counter(assigned.values()) == {"claude-0": 2, "claude-1": 2}
    waiting = [j for j in jobs if j["metadata"]["name"] not in assigned]
    assert len(waiting) == 46
    for job in waiting:
        ready = condition(job, "Ready")
        assert (ready["status"], ready["reason"]) == ("Unknown", "WaitingForCapacity")
        routing = job["status"]["routing"]
        assert local_candidates(job["status"], namespace) == dict.fromkeys(
            ["claude-0", "claude-1"], "NoFreeConcurrency"
        )
        assert routing["capacityDeadline"]
    # Exactly one routing audit per assigned job: nothing was assigned twice, across the crash.
    routed_audits = wait_for(
        lambda: (found := audits(kube, namespace, "JobRouted")) and len(found) >= 4 and found,
        timeout=30,
        describe="four JobRouted audit records",
    )
    audited = Counter(a["spec"]["object"]["name"] for a in routed_audits)
    assert audited == dict.fromkeys(assigned, 1)
    for record in routed_audits:
        details = record["spec"]["details"]
        assert (details["provider"], details["model"]) == ("anthropic", SONNET)
        assert details["runner"] == assigned[record["spec"]["object"]["name"]]

    # Waiting jobs are re-decided on their backoff, still without over-committing.
    def retried() -> list[dict[str, Any]]:
        now = list_jobs(kube, namespace)
        assert max(j["status"]["routing"].get("attempts", 0) for j in now) >= 2
        return now

    again = wait_for(retried, timeout=60, describe="a second backoff attempt")
    assert _assigned(again) == assigned

    # A job finishing frees its slot: the job waiting longest on that runner takes it at once.
    done = sorted(assigned)[0]
    runner = assigned[done]
    finished = {
        "type": "Succeeded",
        "status": "True",
        "reason": "Completed",
        "message": "done",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    body = get_job(kube, namespace, done)
    conditions = [*body["status"]["conditions"], finished]
    kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "agentjobs", done, {"status": {"conditions": conditions}}
    )

    def refilled() -> dict[str, str]:
        now = _assigned(list_jobs(kube, namespace))
        assert len(now) == 5, now
        return now

    after = wait_for(refilled, timeout=60, describe="the freed slot to be re-assigned")
    newcomer = (set(after) - set(assigned)).pop()
    assert after[newcomer] == runner
    active = Counter(r for name, r in after.items() if name != done)
    assert active == {"claude-0": 2, "claude-1": 2}


def active_memory(kube: Kube, namespace: str, name: str) -> Callable[[], bool]:
    def check() -> bool:
        obj = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "memoryrecords", name)
        return condition(obj, "Active").get("status") == "True"

    return check


def test_memory_is_injected_into_a_non_governed_job_and_not_into_a_governed_one(
    fleet: Fleet, kube: Kube, namespace: str
) -> None:
    fleet(replicas=1, concurrency=4)
    apply(
        kube,
        namespace,
        "workspaces",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Workspace",
            "metadata": {"name": "shop"},
            "spec": {"repository": {"url": "https://git.example.com/shop.git"}, "services": [{"name": "api"}]},
        },
    )
    for name, kind in (("cents", "constraint"), ("retries", "decision")):
        apply(
            kube,
            namespace,
            "memoryrecords",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "MemoryRecord",
                "metadata": {"name": name},
                "spec": {
                    "workspace": "shop",
                    "scope": {"type": "workspace"},
                    "kind": kind,
                    "text": f"The {name} rule.",
                    "source": {"type": "adr", "url": f"https://example.com/adr/{name}"},
                    "sensitivity": "internal",
                },
            },
        )
    for name in ("cents", "retries"):
        wait_for(
            lambda n=name: (
                condition(  # type: ignore[misc]
                    kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "memoryrecords", n), "Active"
                ).get("status")
                == "True"
            ),
            timeout=30,
            describe=f"memory record {name} Active",
        )
    profile(kube, namespace, "review-memory", envelope="review-probe", memory={"enabled": True})
    profile(kube, namespace, "governed-review", envelope="change-review")
    apply(kube, namespace, "agentjobs", job_manifest("with-memory", "review-memory", "review-probe"))
    apply(kube, namespace, "agentjobs", job_manifest("governed", "governed-review", "change-review"))

    with_memory = wait_for(routed(kube, namespace, "with-memory", "True"), timeout=60)["status"]["assignment"]
    governed = wait_for(routed(kube, namespace, "governed", "True"), timeout=60)["status"]["assignment"]
    assert with_memory["memoryIds"] == ["cents", "retries"]  # constraints first, then decisions
    assert governed.get("memoryIds", []) == []
    assert (with_memory["model"], with_memory["modelSource"]) == (SONNET, "mapping")

    injected = wait_for(lambda: audits(kube, namespace, "MemoryInjected"), timeout=30, describe="MemoryInjected")
    assert [a["spec"]["object"]["name"] for a in injected] == ["with-memory"]
    assert injected[0]["spec"]["details"]["memoryIds"] == "cents,retries"
    routed_jobs = wait_for(
        lambda: (found := audits(kube, namespace, "JobRouted")) and len(found) == 2 and found,
        timeout=30,
        describe="two JobRouted audit records",
    )
    memory_counts = {a["spec"]["object"]["name"]: a["spec"]["details"]["memoryCount"] for a in routed_jobs}
    assert memory_counts == {"with-memory": "2", "governed": "0"}


def test_a_change_review_prefers_a_provider_other_than_the_implementations(
    fleet: Fleet, kube: Kube, namespace: str
) -> None:
    fleet("claude", replicas=1, concurrency=2)
    fleet("codex", provider="openai", replicas=1, concurrency=2, models=["gpt-5"])
    both = [{"provider": "anthropic", "model": SONNET}, {"provider": "openai", "model": "gpt-5"}]
    profile(kube, namespace, "implement", envelope="change-implementation", providerMappings=both)
    profile(kube, namespace, "review", envelope="change-review", providerMappings=both)
    apply(
        kube,
        namespace,
        "agentjobs",
        job_manifest("ch-impl", "implement", "change-implementation", change={"name": "ch", "stage": "implementation"}),
    )
    implementation = wait_for(routed(kube, namespace, "ch-impl", "True"), timeout=60)["status"]["assignment"]
    assert implementation["provider"] == "anthropic"
    apply(
        kube,
        namespace,
        "agentjobs",
        job_manifest("ch-review", "review", "change-review", change={"name": "ch", "stage": "review"}),
    )
    review = wait_for(routed(kube, namespace, "ch-review", "True"), timeout=60)["status"]
    assert (review["assignment"]["provider"], review["assignment"]["model"]) == ("openai", "gpt-5")
    assert review["routing"]["avoidedProvider"] == "anthropic"
    assert local_candidates(review, namespace) == {
        "codex-0": "Selected",
        "claude-0": "NotPreferred:SameProviderAsImplementation",
    }


def test_the_routed_write_is_tracked_as_whole_objects_in_managed_fields(
    fleet: Fleet, kube: Kube, namespace: str
) -> None:
    # The binding, the decision and the assignment are each written whole, so the API server keeps
    # one managedFields entry for each instead of one per leaf (a smaller object on every write).
    fleet("claude", replicas=1, concurrency=1)
    profile(kube, namespace, "probe", envelope="implementation-probe")
    apply(kube, namespace, "agentjobs", job_manifest("atomic", "probe", "implementation-probe"))
    job = wait_for(routed(kube, namespace, "atomic", "True"), timeout=60)
    status = job["status"]
    assert status["routing"]["candidates"] and status["profile"]["snapshot"] and status["assignment"]["runner"]
    tracked = [
        entry["fieldsV1"]["f:status"]
        for entry in job["metadata"]["managedFields"]
        if entry.get("subresource") == "status" and "f:routing" in entry["fieldsV1"].get("f:status", {})
    ]
    assert len(tracked) == 1, job["metadata"]["managedFields"]
    assert {k: tracked[0][k] for k in ("f:profile", "f:routing", "f:assignment")} == {
        "f:profile": {},
        "f:routing": {},
        "f:assignment": {},
    }


def test_the_routed_write_replaces_the_status_and_keeps_the_rest_of_the_job(
    fleet: Fleet, kube: Kube, namespace: str
) -> None:
    # The router PUTs the status subresource with only the name and the resourceVersion in its
    # metadata: the API server must keep the job's labels, annotations, finalizers and spec, and
    # the creator's managedFields entry for them.
    fleet("claude", replicas=1, concurrency=1)
    profile(kube, namespace, "probe", envelope="implementation-probe")
    manifest = job_manifest("kept", "probe", "implementation-probe")
    manifest["metadata"] |= {
        "labels": {"team": "payments"},
        "annotations": {"example.com/ticket": "PAY-1"},
        "finalizers": ["example.com/keep"],
    }
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentjobs", manifest, field_manager="creator"
    )
    try:
        created = get_job(kube, namespace, "kept")
        job = wait_for(routed(kube, namespace, "kept", "True"), timeout=60)
        meta = job["metadata"]
        assert (meta["labels"], meta["annotations"], meta["finalizers"]) == (
            {"team": "payments"},
            {"example.com/ticket": "PAY-1"},
            ["example.com/keep"],
        )
        assert job["spec"] == created["spec"]
        creator = [e for e in meta["managedFields"] if e["manager"] == "creator"]
        assert len(creator) == 1 and not creator[0].get("subresource"), meta["managedFields"]
        owned = creator[0]["fieldsV1"]
        assert {"f:labels", "f:annotations", "f:finalizers"} <= owned["f:metadata"].keys()
        assert {"f:workspace", "f:jobKind", "f:profile", "f:request"} <= owned["f:spec"].keys()
        # The binding made at queue time is written with the decision, in the same write.
        assert job["status"]["profile"]["revision"] and job["status"]["assignment"]["runner"]
    finally:
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentjobs", "kept", {"metadata": {"finalizers": None}}
        )

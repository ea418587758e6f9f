"""A governed change on real pods: a git server pod, plan, approval by digest, implementation,
checks, and a review on a second pool, every job in a job pod of its own (``execution.mode:
JobPod``); the patch taken with ``kubectl helmhive change patch``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_rig import RUNNERS_NS, Rig, reference_documents

from harness.wait import wait_for
from helmhive.devcluster.demo_git import ensure_demo_repository
from helmhive.devcluster.demo_manifests import DEMO_CHANGE, DEMO_REVIEW_POOL, build_change_documents
from helmhive.devcluster.kind.demo_objects import (
    build_git_egress,
    build_git_server,
    git_url,
    in_job_pods,
    with_runner_image,
)

GIT_NS = "git-e2e"


def _ready(rig: Rig) -> str:
    change = rig.get("change", "-n", RUNNERS_NS, DEMO_CHANGE)
    cond = next((c for c in change.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})
    return f"{cond.get('status')} {cond.get('reason')}: {cond.get('message', '')}"


def _runner_schedulable(rig: Rig, pool: str) -> bool:
    runners = [r for r in rig.get("runners", "-n", RUNNERS_NS)["items"] if r["metadata"]["name"] == f"{pool}-0"]
    conditions = [c for r in runners for c in r.get("status", {}).get("conditions", [])]
    return any(c["type"] == "Schedulable" and c["status"] == "True" for c in conditions)


def _routes(jobs: list[dict[str, Any]]) -> list[tuple[str, Any, Any]]:
    """Each job's pool and routing message, for a failure to say where a job went and why."""
    routed = [
        (j["metadata"]["name"], j.get("status", {}).get("assignment", {}).get("pool"), c.get("message"))
        for j in jobs
        for c in j.get("status", {}).get("conditions", [])
        if c["type"] == "Routed"
    ]
    return routed


def _helmhive(rig: Rig, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "helmhive", *args, "-n", RUNNERS_NS, "--kubeconfig", str(rig.env.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def change(runners: Rig, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    rig = runners
    rig.kubectl("create", "namespace", GIT_NS)
    rig.apply(build_git_server(rig.env.images.runner), GIT_NS)
    rig.apply([build_git_egress(GIT_NS)], RUNNERS_NS)
    rig.kubectl("wait", "-n", GIT_NS, "--for=condition=Ready", "pod/git", "--timeout=180s")
    # The same fixed author and dates give the same commit id here as in the pod.
    _bare, commit = ensure_demo_repository(tmp_path_factory.mktemp("git"))
    assert f"serving {commit}" in rig.kubectl("logs", "-n", GIT_NS, "git")
    docs = with_runner_image(build_change_documents(repository=git_url(GIT_NS), commit=commit), rig.env.images.runner)
    # Both pools run each job in a pod of its own from here on (the reference pool's runner rolls).
    docs = in_job_pods([d for d in reference_documents(rig) if d["kind"] == "RunnerPool"] + docs)
    for doc in docs:
        if doc["kind"] == "Change":
            doc["spec"]["approval"] = "Manual"
    rig.apply(docs, RUNNERS_NS)
    return {"commit": commit}


def test_a_governed_change_runs_end_to_end_on_real_pods(runners: Rig, change: dict[str, Any], tmp_path: Path) -> None:
    rig = runners
    # Planned, then waiting for a person: nothing is implemented before the approval.
    wait_for(
        lambda: (st := rig.get("change", "-n", RUNNERS_NS, DEMO_CHANGE).get("status", {})).get("plan") and st,
        timeout=600,
        describe="the change's plan",
    )
    status = rig.get("change", "-n", RUNNERS_NS, DEMO_CHANGE)["status"]
    assert not status.get("patch"), "implemented before approval"
    digest = status["plan"]["digest"]
    # The review prefers the second pool's provider when its runner can take it: have it ready.
    wait_for(
        lambda: _runner_schedulable(rig, DEMO_REVIEW_POOL),
        timeout=300,
        describe=f"runner {DEMO_REVIEW_POOL}-0 Schedulable",
    )
    _helmhive(rig, "change", "approve", DEMO_CHANGE, "--digest", digest)
    final = wait_for(
        lambda: (r := _ready(rig)).startswith("True") and r,
        timeout=900,
        describe=f"change {DEMO_CHANGE} to succeed (last: {_ready(rig)})",
    )
    assert final
    status = rig.get("change", "-n", RUNNERS_NS, DEMO_CHANGE)["status"]
    # Approved in the approver's own name (the admin kubeconfig's user), for exactly that digest.
    assert status["approval"]["digest"] == digest
    assert status["approval"]["by"] not in ("", "Automatic"), status["approval"]
    # The review ran on the second pool's runner, with another provider.
    jobs = rig.get("agentjobs", "-n", RUNNERS_NS)["items"]
    review = [j for j in jobs if j["spec"]["jobKind"] == "change-review"]
    implementation = [j for j in jobs if j["spec"]["jobKind"] == "change-implementation"]
    assert review and all(j["status"]["assignment"]["pool"] == DEMO_REVIEW_POOL for j in review), _routes(jobs)
    assert implementation and all(j["status"]["assignment"]["pool"] != DEMO_REVIEW_POOL for j in implementation)
    assert status["review"]["providerDiffers"] is True, status["review"]
    # Each stage ran in a pod of its own, which its Events name.
    for job in implementation + review:
        name = job["metadata"]["name"]
        events = rig.get("events", "-n", RUNNERS_NS, "--field-selector", f"involvedObject.name={name}")["items"]
        pods = [e for e in events if e["reason"] in {"JobPodClaimed", "JobPodCreated"}]
        assert pods, f"job {name} ran in no job pod: {sorted({e['reason'] for e in events})}"
    # `change status` shows each stage's pod, recorded in its job's result after the pod is gone.
    shown = _helmhive(rig, "change", "status", DEMO_CHANGE)
    for job in implementation + review:
        pod = rig.get("agentjob", "-n", RUNNERS_NS, job["metadata"]["name"])["status"]["result"]["jobPod"]["name"]
        assert pod in shown, shown
    # The patch, taken as a user takes it, applies to the exact commit.
    patch = _helmhive(rig, "change", "patch", DEMO_CHANGE)
    assert "def refund_once" in patch
    bare, commit = ensure_demo_repository(tmp_path / "check")
    assert commit == change["commit"]
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "--quiet", str(bare), str(work)], check=True)
    applied = subprocess.run(
        ["git", "apply", "--check", "-"], input=patch, text=True, cwd=work, capture_output=True, check=False
    )
    assert applied.returncode == 0, applied.stderr

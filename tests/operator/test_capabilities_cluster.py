"""What a runner really offers decides routing at queue time, on a real API server.

The operator, one runner pod started locally as ``helmhive dev run-pod`` does, and the reference
agent in mode ``no-load-session`` (it does not advertise ``loadSession``) with efforts
``reference-small=low,medium`` and none for ``reference-large``. The pool declares
``session-load``, which the agent lacks:

- the Runner offers everything else, withholds ``session-load`` with ``NotAdvertised``, and its
  ``CapabilitiesAdvertised`` condition (and its pool's) is False with ``CapabilityNotAdvertised``;
- a job whose profile resumes its session, one whose profile requires ``session-load``, and one
  asking for an effort the model does not offer are refused at queue time, each with its
  candidate's reason, which ``explain-routing`` shows; none reaches the runner;
- a job asking for an offered effort runs to success on the same runner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from reference_pool import PodStarter, pool_docs, profile_doc, workspace_doc

from harness.cluster import ClusterHandle
from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod
from helmhive.policy.routing.status import build_candidate_rows

API = "helmhive.dev/v1alpha1"
GROUP, VERSION = "helmhive.dev", "v1alpha1"
RUNNER = "reference-0"
CANARY = "canary-capabilities-token-9e27c1"


def _profile(name: str, envelope: str, **spec: Any) -> dict[str, Any]:
    mapping = spec.pop("mapping", {"provider": "reference"})
    doc = profile_doc(name, envelope, purpose="Capabilities test.", **spec)
    doc["spec"]["providerMappings"] = [mapping]
    return doc


def _docs() -> list[dict[str, Any]]:
    return [
        *pool_docs(
            token=CANARY,
            capabilities=("structured-output", "diff-review", "workspace-write", "session-load"),
            agent_env={
                "HELMHIVE_REFERENCE_AGENT_MODE": "no-load-session",
                "HELMHIVE_REFERENCE_AGENT_EFFORTS": "reference-small=low,medium;reference-large=",
            },
        ),
        workspace_doc(
            "payments",
            {
                "review-probe": "resuming",
                "connection-test": "needs-load",
                "implementation-probe": "high-effort",
                "policy-suggestion": "low-effort",
            },
        ),
        _profile("resuming", "review-probe", session={"policy": "resume"}),
        _profile("needs-load", "connection-test", requiredCapabilities=["session-load"]),
        _profile(
            "high-effort",
            "implementation-probe",
            mapping={"provider": "reference", "model": "reference-small", "reasoningEffort": "high"},
        ),
        _profile(
            "low-effort",
            "policy-suggestion",
            mapping={"provider": "reference", "model": "reference-small", "reasoningEffort": "low"},
        ),
    ]


def _job(name: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {"workspace": "payments", "jobKind": kind, "request": {"title": name, "prompt": "Say hello."}},
    }


def _get(kube: Kube, namespace: str, plural: str, name: str) -> dict[str, Any]:
    return dict(kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name))


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _explain(cluster: ClusterHandle, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    cmd = [sys.executable, "-m", "helmhive", "explain-routing", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.fixture
def runner_pod(start_reference_pod: PodStarter) -> Iterator[LocalPod]:
    with start_reference_pod(_docs(), RUNNER) as pod:
        yield pod


def test_a_declared_capability_the_agent_lacks_is_withheld_and_refused_at_queue_time(
    runner_pod: LocalPod, kube: Kube, kubectl: Kubectl, namespace: str, cluster: ClusterHandle
) -> None:
    # The Runner: what the agent advertised, what it offers and from where, what it withholds.
    def withheld() -> dict[str, Any]:
        runner = _get(kube, namespace, "runners", RUNNER)
        cond = _condition(runner, "CapabilitiesAdvertised")
        assert cond.get("status") == "False", cond
        return runner

    runner = wait_for(withheld, timeout=60, describe="the Runner's CapabilitiesAdvertised=False")
    report = runner["status"]["report"]
    assert "session-load" not in report["agentCapabilities"]
    assert "session-fork" in report["agentCapabilities"]
    assert report["capabilities"] == ["structured-output", "diff-review", "workspace-write"]
    assert {"name": "session-load", "reason": "NotAdvertised"} in report["withheldCapabilities"]
    assert all(o["source"] == "Pool" for o in report["offeredCapabilities"])
    models = {m["id"]: m.get("efforts", []) for m in report["catalogue"]["models"]}
    assert models == {"reference-small": ["low", "medium"], "reference-large": []}
    cond = _condition(runner, "CapabilitiesAdvertised")
    assert cond["reason"] == "CapabilityNotAdvertised"
    assert "session-load" in cond["message"]
    # Still schedulable: the runner serves what it does offer.
    assert _condition(runner, "Schedulable")["status"] == "True"

    def pool_says_so() -> dict[str, Any]:
        cond = _condition(_get(kube, namespace, "runnerpools", "reference"), "CapabilitiesAdvertised")
        assert cond.get("reason") == "CapabilityNotAdvertised" and cond["status"] == "False", cond
        return cond

    assert "session-load" in wait_for(pool_says_so, timeout=60, describe="the pool's condition")["message"]

    # Three jobs the runner would refuse at run time are refused at queue time instead.
    refused = {
        "resume-job": ("review-probe", "MissingCapability:session-load"),
        "required-job": ("connection-test", "MissingCapability:session-load"),
        "effort-job": ("implementation-probe", "EffortNotOffered:reference-small/high"),
    }
    ok = _job("offered-job", "policy-suggestion")
    docs = [_job(name, kind) for name, (kind, _) in refused.items()] + [ok]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))

    for name, (_, reason) in refused.items():

        def routed_false(name: str = name) -> dict[str, Any]:
            job = _get(kube, namespace, "agentjobs", name)
            cond = _condition(job, "Routed")
            assert cond.get("status") == "False", cond
            return job

        job = wait_for(routed_false, timeout=90, describe=f"job {name} refused at queue time")
        rows = build_candidate_rows(job["status"]["routing"]["candidates"])
        mine = {row["runner"]: row["reason"] for row in rows if row["namespace"] == namespace}
        assert mine == {RUNNER: reason}, rows
        expected = "EffortNotOffered" if reason.startswith("EffortNotOffered") else "NoEligibleRunner"
        assert _condition(job, "Routed")["reason"] == expected
        assert not (job["status"].get("assignment") or {}).get("runner"), job["status"]
        # explain-routing shows the same candidate and reason.
        shown = _explain(cluster, name, "-n", namespace, "-o", "json")
        assert shown.returncode == 1, shown.stderr
        explained = json.loads(shown.stdout)
        assert explained["decision"]["reason"] == expected
        rows = build_candidate_rows(explained["decision"]["candidates"])
        assert {r["runner"]: r["reason"] for r in rows if r["namespace"] == namespace} == {RUNNER: reason}

    # An offered effort runs, on the same runner.
    def succeeded() -> dict[str, Any]:
        job = _get(kube, namespace, "agentjobs", ok["metadata"]["name"])
        assert _condition(job, "Succeeded").get("status") == "True", job.get("status")
        return job

    job = wait_for(succeeded, timeout=180, describe="the low-effort job's success")
    assert job["status"]["assignment"]["runner"] == RUNNER
    # None of the refused jobs reached the runner: its log names only the one that ran.
    log = (runner_pod.root / "container.log").read_text(encoding="utf-8", errors="replace")
    assert '"job": "offered-job"' in log
    for name in refused:
        assert f'"job": "{name}"' not in log
    # The pool's token is in no status and no Event.
    dumped = json.dumps([_get(kube, namespace, "agentjobs", n) for n in [*refused, "offered-job"]])
    events = kube.core.list_namespaced_event(namespace).items
    dumped += json.dumps([str(e.message) for e in events])
    dumped += json.dumps(_get(kube, namespace, "runners", RUNNER))
    assert CANARY not in dumped

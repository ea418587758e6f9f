"""``helmhive explain-routing`` tells a job that waits for a reference from one that fails closed.

GitOps tools create objects in any order, so a job whose Workspace or Profile does not exist
yet waits (``WaitingForWorkspace``/``WaitingForProfile``) instead of failing. explain-routing
binds the profile with the queue step's own code (:mod:`helmhive.controller.jobs.binding`, no Kopf)
and says the same: it exits 3 ("waits") and names the waiting reason and the final one,
whereas an invalid profile still fails closed (exit 2, a usage error: it cannot be routed).
Only reads: nothing here needs the operator.

``-o json`` prints one object for these outcomes too: the routed case's shape with no profile
bound and no candidates, ``decision.stage: queue`` and ``deadlineReason`` (the reason a waiting
job fails with at its deadline).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from simulated_runner import GROUP, VERSION

from harness.cluster import ClusterHandle
from harness.kube import Kube


def explain(cluster: ClusterHandle, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    cmd = [sys.executable, "-m", "helmhive", "explain-routing", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)


def job(name: str, **spec: Any) -> dict[str, Any]:
    body = {"workspace": "payments", "jobKind": "review-probe", "request": {"title": name, "prompt": "p"}, **spec}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "metadata": {"name": name}, "spec": body}


def explain_json(cluster: ClusterHandle, *args: str) -> tuple[int, dict[str, Any], str]:
    done = explain(cluster, *args, "-o", "json")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip(), f"nothing on stdout (exit {done.returncode}): {done.stderr}"
    return done.returncode, json.loads(done.stdout), done.stderr


def implementation_profile(kube: Kube, namespace: str) -> None:
    """A valid profile, but for the implementation envelope: a review job bound to it fails closed."""
    kube.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "profiles",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Profile",
            "metadata": {"name": "impl"},
            "spec": {
                "envelope": "implementation-probe",
                "purpose": "implementation",
                "providerMappings": [{"provider": "anthropic", "model": "claude-sonnet-4-5"}],
            },
        },
    )


def test_a_missing_workspace_or_profile_is_explained_as_waiting(
    cluster: ClusterHandle, crds: list[str], kube: Kube, namespace: str, tmp_path: Path
) -> None:
    no_workspace = tmp_path / "no-workspace.yaml"
    no_workspace.write_text(yaml.safe_dump(job("needs-workspace")))
    shown = explain(cluster, "-f", str(no_workspace), "-n", namespace)
    assert shown.returncode == 3, shown.stdout + shown.stderr
    assert "waits at queue time: WaitingForWorkspace" in shown.stderr
    assert "payments" in shown.stderr and "WorkspaceNotFound" in shown.stderr
    assert "Traceback" not in shown.stderr

    no_profile = tmp_path / "no-profile.yaml"
    no_profile.write_text(yaml.safe_dump(job("needs-profile", profile="not-yet")))
    shown = explain(cluster, "-f", str(no_profile), "-n", namespace)
    assert shown.returncode == 3, shown.stdout + shown.stderr
    assert "waits at queue time: WaitingForProfile" in shown.stderr and "not-yet" in shown.stderr

    # A profile for another envelope is not a missing reference: it fails closed at once.
    implementation_profile(kube, namespace)
    wrong = tmp_path / "wrong-envelope.yaml"
    wrong.write_text(yaml.safe_dump(job("wrong-envelope", profile="impl")))
    shown = explain(cluster, "-f", str(wrong), "-n", namespace)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "fails closed at queue time: ProfileNotValid" in shown.stderr


def queue_decision(shown: dict[str, Any]) -> dict[str, Any]:
    """The decision, after checking what a queue-time object has in common with a routed one."""
    assert set(shown) == {"job", "profile", "decision", "stored", "notes"}
    assert shown["profile"] is None
    decision = shown["decision"]
    assert decision["stage"] == "queue"
    assert (decision["assignment"], decision["candidates"], decision["consideredRunners"]) == (None, [], 0)
    return dict(decision)


def test_queue_time_outcomes_are_one_json_object(
    cluster: ClusterHandle, crds: list[str], kube: Kube, namespace: str, tmp_path: Path
) -> None:
    # A manifest whose Workspace does not exist yet: it waits (exit 3).
    manifest = tmp_path / "no-workspace.yaml"
    manifest.write_text(yaml.safe_dump(job("needs-workspace")))
    code, shown, stderr = explain_json(cluster, "-f", str(manifest), "-n", namespace)
    assert code == 3, stderr
    assert shown["job"] == {"namespace": namespace, "name": "needs-workspace", "source": "manifest"}
    decision = queue_decision(shown)
    assert (decision["outcome"], decision["reason"], decision["deadlineReason"]) == (
        "WaitingForWorkspace",
        "WaitingForWorkspace",
        "WorkspaceNotFound",
    )
    assert "payments" in decision["message"]

    # A job in the cluster whose Profile does not exist yet: the same, read from the cluster.
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentjobs", job("needs-profile", profile="later")
    )
    code, shown, stderr = explain_json(cluster, "needs-profile", "-n", namespace)
    assert code == 3, stderr
    assert shown["job"] == {"namespace": namespace, "name": "needs-profile", "source": "cluster"}
    decision = queue_decision(shown)
    assert (decision["outcome"], decision["reason"], decision["deadlineReason"]) == (
        "WaitingForProfile",
        "WaitingForProfile",
        "ProfileNotFound",
    )
    assert "later" in decision["message"]

    # A profile for another envelope fails closed at queue time (exit 2, as documented).
    implementation_profile(kube, namespace)
    wrong = tmp_path / "wrong-envelope.yaml"
    wrong.write_text(yaml.safe_dump(job("wrong-envelope", profile="impl")))
    code, shown, stderr = explain_json(cluster, "-f", str(wrong), "-n", namespace)
    assert code == 2, stderr
    decision = queue_decision(shown)
    assert (decision["outcome"], decision["reason"], decision["deadlineReason"]) == (
        "Failed",
        "ProfileNotValid",
        None,
    )
    assert "implementation-probe" in decision["message"]

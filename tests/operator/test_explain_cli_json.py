"""``helmhive explain-routing -o json`` prints one object for every outcome, queue-time ones too.

A job that waits at queue time for a Workspace or Profile that does not exist yet (exit 3), and one
that fails closed there (exit 2), are decided before routing: their object has the routed case's
shape with no profile bound and no candidates, ``decision.stage: queue``, and ``deadlineReason``
(the reason a waiting job fails with at its deadline). Against the real API server; only reads,
so no operator.
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


def explain_json(cluster: ClusterHandle, *args: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    cmd = [sys.executable, "-m", "helmhive", "explain-routing", *args, "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip(), f"nothing on stdout (exit {done.returncode}): {done.stderr}"
    return done.returncode, json.loads(done.stdout), done.stderr


def job(name: str, **spec: Any) -> dict[str, Any]:
    body = {"workspace": "payments", "jobKind": "review-probe", "request": {"title": name, "prompt": "p"}, **spec}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "metadata": {"name": name}, "spec": body}


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

"""``helmhive explain-routing`` tells a job that waits for a reference from one that fails closed.

GitOps tools create objects in any order, so a job whose Workspace or Profile does not exist
yet waits (``WaitingForWorkspace``/``WaitingForProfile``) instead of failing. explain-routing
binds the profile with the queue step's own code (:mod:`helmhive.controller.binding`, no Kopf)
and says the same: it exits 3 ("waits") and names the waiting reason and the final one,
whereas an invalid profile still fails closed (exit 2, a usage error: it cannot be routed).
Only reads: nothing here needs the operator.
"""

from __future__ import annotations

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
    shown = explain(cluster, "-f", str(wrong), "-n", namespace)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "fails closed at queue time: ProfileNotValid" in shown.stderr

"""`helmhive change status` and `sessions list` against a real API server, with hostile text in the object.

A plan summary, a condition message and a review note are written by the agent or from its output:
untrusted. The CLI shows them as text -- rich markup not interpreted, control characters escaped --
on the screen a person reads before ``change approve``. Without ``-n`` the commands work in the
kubeconfig context's namespace, as kubectl does. No operator runs here: the test writes the status.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from harness.cluster import ClusterHandle
from harness.kube import Kube

GROUP, VERSION = "helmhive.dev", "v1alpha1"
AT = "2024-01-01T00:00:00Z"
DIGEST = "sha256:" + "a" * 64
SUMMARY = "x[/i] [bold red]markup[/] \x1b[31mred"


def _cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "helmhive", *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _change(kube: Kube, namespace: str, name: str) -> None:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Change",
        "metadata": {"name": name},
        "spec": {
            "workspace": "payments",
            "request": {"title": "Make refunds idempotent", "description": "POST /refunds takes a key."},
            "criteria": ["A repeated POST /refunds creates exactly one refund."],
            "source": {
                "repository": "https://git.example.com/acme/payments.git",
                "commit": "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
            },
            "approval": "Manual",
        },
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "changes", body)
    status = {
        "iteration": 0,
        "conditions": [
            {
                "type": "Planned",
                "status": "True",
                "reason": "PlanReady",
                "message": "see [/tmp]",
                "lastTransitionTime": AT,
            },
            {
                "type": "Ready",
                "status": "False",
                "reason": "AwaitingApproval",
                "message": "approve [/tmp] \x1b]0;owned\x07",
                "lastTransitionTime": AT,
            },
        ],
        "jobs": [{"stage": "planning", "iteration": 1, "name": f"{name}-plan", "outcome": "Completed"}],
        "plan": {"job": f"{name}-plan", "digest": DIGEST, "summary": SUMMARY, "steps": [{"title": "step [/i]"}]},
        "review": {
            "job": f"{name}-review-1",
            "iteration": 1,
            "verdict": "approve",
            "criteria": [{"criterion": 0, "met": True, "note": "fine [/i] \x1b[2J"}],
        },
    }
    kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "changes", name, {"status": status}, _content_type="application/merge-patch+json"
    )


def test_change_status_shows_agent_text_as_text(
    cluster: ClusterHandle, kube: Kube, namespace: str, crds: list[str]
) -> None:
    _change(kube, namespace, "refund-idempotency")
    shown = _cli(cluster.kubeconfig, "change", "status", "refund-idempotency", "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr and "MarkupError" not in shown.stderr
    out = shown.stdout
    assert "\x1b" not in out and "\x07" not in out
    assert "x[/i] [bold red]markup[/] \\x1b[31mred" in out  # the plan summary, as written, escape shown
    assert "see [/tmp]" in out and "approve [/tmp] \\x1b]0;owned\\x07" in out  # condition messages
    assert "criterion 1: met (fine [/i] \\x1b[2J)" in out  # the review's note
    as_json = _cli(cluster.kubeconfig, "change", "status", "refund-idempotency", "-n", namespace, "-o", "json")
    assert as_json.returncode == 0 and "\x1b" not in as_json.stdout and "\\u001b[31mred" in as_json.stdout


def test_without_n_the_commands_use_the_contexts_namespace(
    cluster: ClusterHandle, kube: Kube, namespace: str, crds: list[str], tmp_path: Path
) -> None:
    _change(kube, namespace, "refund-idempotency")
    doc = yaml.safe_load(cluster.kubeconfig.read_text(encoding="utf-8"))
    for entry in doc["contexts"]:
        if entry["name"] == doc["current-context"]:
            entry["context"]["namespace"] = namespace
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(doc), encoding="utf-8")

    shown = _cli(kubeconfig, "change", "status", "refund-idempotency")
    assert shown.returncode == 0, shown.stderr
    assert f"Change {namespace}/refund-idempotency" in shown.stdout
    refused = _cli(kubeconfig, "change", "approve", "refund-idempotency", "--digest", "sha256:" + "b" * 64)
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"the plan is now {DIGEST}, not sha256:{'b' * 64}; review it again"
    )
    listed = _cli(kubeconfig, "sessions", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"session bindings in {namespace}" in listed.stdout
    explicit = _cli(kubeconfig, "change", "status", "refund-idempotency", "-n", "default")
    assert explicit.returncode == 1 and explicit.stderr.startswith("change default/refund-idempotency: 404 ")

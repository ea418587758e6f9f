"""The demo's own objects, on top of the examples: a reference runner pool and a job it can run.

The examples describe production pools (Anthropic, Google) whose logins the demo does not
have, so their connection test fails closed with a reason, which the demo shows. The
reference pool runs ``helmhive-reference-agent`` (a deterministic ACP agent, not a model)
with a stand-in credential, so one job really runs end to end. Pure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEMO_JOB", "DEMO_POOL", "build_demo_documents"]

DEMO_POOL = "reference"
DEMO_JOB = "hello-reference"
_API = "helmhive.dev/v1alpha1"


def build_demo_documents() -> list[dict[str, Any]]:
    """Secret, RunnerPool, Profile and AgentJob for the reference runner."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "reference-token"},
            "stringData": {"token": "stand-in-credential-for-the-reference-agent"},
        },
        {
            "apiVersion": _API,
            "kind": "RunnerPool",
            "metadata": {"name": DEMO_POOL},
            "spec": {
                "provider": "reference",
                "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
                "image": "ghcr.io/helmhive/helmhive:0.1.0",
                "credential": {
                    "secretRef": {"name": "reference-token", "key": "token"},
                    "envName": "HELMHIVE_REFERENCE_AGENT_TOKEN",
                },
                "placementLabels": {"domain": "code"},
                "capabilities": ["structured-output", "diff-review", "workspace-write"],
                "concurrency": 2,
                "replicas": 1,
            },
        },
        {
            "apiVersion": _API,
            "kind": "Profile",
            "metadata": {"name": "reference-connection-check"},
            "spec": {
                "envelope": "connection-test",
                "purpose": "Prove the reference runner answers.",
                "instructions": "Reply with one short sentence.",
                "providerMappings": [{"provider": "reference"}],
            },
        },
        {
            "apiVersion": _API,
            "kind": "AgentJob",
            "metadata": {"name": DEMO_JOB},
            "spec": {
                "workspace": "payments",
                "jobKind": "connection-test",
                "profile": "reference-connection-check",
                "request": {"title": "Hello", "prompt": "Say hello and name the model you are."},
                "timeoutSeconds": 120,
            },
        },
    ]

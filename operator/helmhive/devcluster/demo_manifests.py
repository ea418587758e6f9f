"""The demo's own objects, on top of the examples: a reference runner pool and a job it can run.

The examples describe production pools (Anthropic, Google) whose logins the demo does not
have, so their connection test waits for a runner with a visible reason (and fails closed
``NoEligibleRunner`` at the capacity deadline), which the demo shows. The
reference pool runs ``helmhive-reference-agent`` (a deterministic ACP agent, not a model)
with a stand-in credential, so one job really runs end to end. Pure.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEMO_CHANGE",
    "DEMO_JOB",
    "DEMO_POOL",
    "DEMO_REVIEW_POOL",
    "build_change_documents",
    "build_demo_documents",
]

DEMO_POOL = "reference"
DEMO_REVIEW_POOL = "reference-b"
DEMO_JOB = "hello-reference"
DEMO_CHANGE = "demo-refunds"
_API = "helmhive.dev/v1alpha1"


def _pool(name: str, provider: str, concurrency: int) -> dict[str, Any]:
    return {
        "apiVersion": _API,
        "kind": "RunnerPool",
        "metadata": {"name": name},
        "spec": {
            "provider": provider,
            "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
            "image": "ghcr.io/helmhive/helmhive:0.1.0",
            "credential": {
                "secretRef": {"name": "reference-token", "key": "token"},
                "envName": "HELMHIVE_REFERENCE_AGENT_TOKEN",
            },
            "placementLabels": {"domain": "code"},
            "capabilities": ["structured-output", "diff-review", "workspace-write"],
            "concurrency": concurrency,
            "replicas": 1,
        },
    }


def _profile(name: str, envelope: str, providers: list[str], purpose: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": _API,
        "kind": "Profile",
        "metadata": {"name": name},
        "spec": {
            "envelope": envelope,
            "purpose": purpose,
            "instructions": "Follow the request and the confirmed criteria exactly.",
            "providerMappings": [{"provider": p} for p in providers],
            **extra,
        },
    }


def build_change_documents(*, repository: str, commit: str) -> list[dict[str, Any]]:
    """A second reference pool (another provider name, for the review), governed profiles, a Workspace
    and a Change against the demo's own repository at its exact commit."""
    description = "\n".join(
        [
            "refund() must take an idempotency key, so that a retried request refunds only once.",
            "APPEND-LINE: refunds.py :: ",
            "APPEND-LINE: refunds.py :: _SEEN: dict[str, dict[str, object]] = {}",
            "APPEND-LINE: refunds.py :: ",
            "APPEND-LINE: refunds.py :: ",
            "APPEND-LINE: refunds.py :: def refund_once(idempotency_key: str, order_id: str, amount: int) -> "
            "dict[str, object]: return _SEEN.setdefault(idempotency_key, refund(order_id, amount))",
        ]
    )
    return [
        _pool(DEMO_REVIEW_POOL, "reference-b", 1),
        _profile("reference-plan", "change-planning", ["reference"], "Plan a governed change."),
        _profile("reference-implement", "change-implementation", ["reference"], "Implement an approved plan."),
        _profile(
            "reference-review",
            "change-review",
            ["reference", "reference-b"],
            "Review a patch against its criteria.",
            filesystem="read",
        ),
        {
            "apiVersion": _API,
            "kind": "Workspace",
            "metadata": {"name": "reference-shop"},
            "spec": {
                "repository": {"url": repository},
                "profiles": [
                    {"jobKind": "change-planning", "profile": "reference-plan"},
                    {"jobKind": "change-implementation", "profile": "reference-implement"},
                    {"jobKind": "change-review", "profile": "reference-review"},
                ],
            },
        },
        {
            "apiVersion": _API,
            "kind": "Change",
            "metadata": {"name": DEMO_CHANGE},
            "spec": {
                "workspace": "reference-shop",
                "request": {"title": "Idempotent refunds", "description": description},
                "criteria": [
                    "A repeated refund with the same idempotency key refunds once.",
                    "refund() itself keeps its signature.",
                ],
                "source": {"repository": repository, "commit": commit},
                "approval": "Automatic",
                "checks": [
                    {"name": "has-refund-once", "command": ["grep", "-q", "def refund_once", "refunds.py"]},
                    {"name": "signature-kept", "command": ["grep", "-q", "def refund(order_id: str", "refunds.py"]},
                ],
            },
        },
    ]


def build_demo_documents() -> list[dict[str, Any]]:
    """Secret, RunnerPool, Profile and AgentJob for the reference runner."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "reference-token"},
            "stringData": {"token": "stand-in-credential-for-the-reference-agent"},
        },
        _pool(DEMO_POOL, "reference", 2),
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

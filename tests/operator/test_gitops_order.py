"""Applying a directory in one go: whatever the order, everything converges to the same state.

``kubectl apply -f examples/``, Argo CD and Flux create objects in an order nobody controls.
Here the example set (a Workspace, two Profiles, three MemoryRecords, two AgentJobs; shapes
copied from ``examples/``, with provider names no runner serves) is applied to a fresh
namespace per order: all at once in one ``kubectl apply`` (dependants first in the stream),
dependencies first, and in reverse (jobs and memory first, seen waiting by the operator, the
Workspace last). Every order must end in the same conditions and reasons on every object,
the same profile bindings, the same routing outcome (``NoEligibleRunner``, as the README
promises for ``check-anthropic-login`` when no runner serves the provider, once the job has
waited for one until its deadline: a runner is a reference too), the same audit trail, and
nothing failed for an ordering reason.

This module's operator waits :data:`WAIT_SECONDS` for a missing reference and for a runner (not
the default 600 s and 900 s), so the test of a Workspace that never appears ends in about half a
minute, and the jobs no runner serves fail closed about half a minute after they were bound. Each
step that must happen while something waits (the next apply, a restart) takes a few seconds even
on a loaded machine: several times less than the wait.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.policy.audit.routing import iter_routing_decisions

GROUP, VERSION = "helmhive.dev", "v1alpha1"
WAIT_SECONDS = 30
OPERATOR_ENV = {
    "HELMHIVE_REFERENCE_WAIT_SECONDS": str(WAIT_SECONDS),
    "HELMHIVE_ROUTING_CAPACITY_DEADLINE_SECONDS": str(WAIT_SECONDS),
}
# Generous: the machine is shared, and convergence is waited for, never timed.
CONVERGE = 180

Doc = dict[str, Any]
Summary = dict[tuple[str, str], dict[str, Any]]
PLURALS = {
    "Workspace": "workspaces",
    "Profile": "profiles",
    "MemoryRecord": "memoryrecords",
    "AgentJob": "agentjobs",
}
ORDERING_REASONS = {"WorkspaceNotFound", "ProfileNotFound", "WaitingForWorkspace", "WaitingForProfile"}


def _obj(kind: str, name: str, spec: dict[str, Any]) -> Doc:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "spec": spec}


def workspace(*, bind_connection_test: bool = True) -> Doc:
    profiles = [{"jobKind": "review-probe", "profile": "quick-review"}]
    if bind_connection_test:
        profiles.insert(0, {"jobKind": "connection-test", "profile": "connection-check"})
    return _obj(
        "Workspace",
        "payments",
        {
            "repository": {"url": "https://git.example.com/acme/payments.git", "defaultBranch": "main"},
            "services": [
                {"name": "api", "path": "services/api", "description": "Public payments API."},
                {"name": "ledger", "path": "services/ledger", "description": "Double-entry ledger."},
            ],
            "profiles": profiles,
        },
    )


def profiles() -> list[Doc]:
    return [
        _obj(
            "Profile",
            "connection-check",
            {
                "envelope": "connection-test",
                "purpose": "Prove that a runner's provider login works.",
                "instructions": "Reply with one short sentence that names your model.",
                "providerMappings": [{"provider": "gitops-nobody-a"}, {"provider": "gitops-nobody-b"}],
            },
        ),
        _obj(
            "Profile",
            "quick-review",
            {
                "envelope": "review-probe",
                "purpose": "Fast read-only review of a small diff, with team memory.",
                "instructions": "Review the diff for correctness and security issues only.",
                "providerMappings": [
                    {
                        "provider": "gitops-nobody-c",
                        "model": "model-one",
                        "fallbackModels": ["model-two"],
                        "reasoningEffort": "medium",
                    }
                ],
                "tools": ["read", "search"],
                "memory": {"enabled": True, "maxSensitivity": "internal", "maxRecords": 10},
            },
        ),
    ]


def memory() -> list[Doc]:
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = {"type": "adr", "url": "https://git.example.com/acme/payments/-/blob/main/docs/adr/0004-money.md"}
    return [
        _obj(
            "MemoryRecord",
            "money-is-integer-cents",
            {
                "workspace": "payments",
                "scope": {"type": "workspace"},
                "kind": "constraint",
                "text": "Money is stored and computed as integer minor units (cents).",
                "source": {**source, "approvedBy": "architecture-board"},
                "sensitivity": "internal",
            },
        ),
        _obj(
            "MemoryRecord",
            "ledger-append-only",
            {
                "workspace": "payments",
                "scope": {"type": "service", "service": "ledger"},
                "kind": "decision",
                "text": "Ledger entries are append-only.",
                "source": {"type": "pull-request", "url": "https://git.example.com/acme/payments/-/merge_requests/812"},
                "sensitivity": "internal",
            },
        ),
        _obj(
            "MemoryRecord",
            "api-freeze-q4",
            {
                "workspace": "payments",
                "scope": {"type": "service", "service": "api"},
                "kind": "constraint",
                "text": "No breaking changes to the public API until the end of the freeze.",
                "source": {"type": "issue", "url": "https://git.example.com/acme/payments/-/issues/1290"},
                "sensitivity": "public",
                "expiresAt": expires,
            },
        ),
    ]


def jobs() -> list[Doc]:
    return [
        # As examples/agentjob.yaml: its profile comes from the Workspace's binding for the kind.
        _obj(
            "AgentJob",
            "check-anthropic-login",
            {
                "workspace": "payments",
                "jobKind": "connection-test",
                "request": {"title": "Connection test", "prompt": "Say hello and name the model you are."},
                "timeoutSeconds": 120,
            },
        ),
        # Names its profile itself: it waits for the Profile, not for the Workspace.
        _obj(
            "AgentJob",
            "review-diff",
            {
                "workspace": "payments",
                "jobKind": "review-probe",
                "profile": "quick-review",
                "service": "api",
                "request": {"title": "Review", "prompt": "Review the diff."},
            },
        ),
    ]


EXPECTED: Summary = {
    ("Workspace", "payments"): {"conditions": {"Ready": ("True", "Reconciled")}},
    ("Profile", "connection-check"): {"conditions": {"Valid": ("True", "Valid")}},
    ("Profile", "quick-review"): {"conditions": {"Valid": ("True", "Valid")}},
    ("MemoryRecord", "money-is-integer-cents"): {"conditions": {"Active": ("True", "InEffect")}},
    ("MemoryRecord", "ledger-append-only"): {"conditions": {"Active": ("True", "InEffect")}},
    ("MemoryRecord", "api-freeze-q4"): {"conditions": {"Active": ("True", "InEffect")}},
    ("AgentJob", "check-anthropic-login"): {
        "conditions": {
            "Routed": ("False", "NoEligibleRunner"),
            "Ready": ("False", "NoEligibleRunner"),
            "Stalled": ("True", "NoEligibleRunner"),  # kstatus: failed closed, Failed
        },
        "profile": "connection-check",
        "assignment": None,
    },
    ("AgentJob", "review-diff"): {
        "conditions": {
            "Routed": ("False", "NoEligibleRunner"),
            "Ready": ("False", "NoEligibleRunner"),
            "Stalled": ("True", "NoEligibleRunner"),  # kstatus: failed closed, Failed
        },
        "profile": "quick-review",
        "assignment": None,
    },
}
EXPECTED_AUDITS = Counter(
    {
        ("ProfileRevisionCreated", "connection-check"): 1,
        ("ProfileRevisionCreated", "quick-review"): 1,
        ("MemoryCreated", "money-is-integer-cents"): 1,
        ("MemoryCreated", "ledger-append-only"): 1,
        ("MemoryCreated", "api-freeze-q4"): 1,
        ("JobRoutingFailed", "check-anthropic-login"): 1,
        ("JobRoutingFailed", "review-diff"): 1,
    }
)


# -- reading the cluster --------------------------------------------------------------------------


def _get(kube: Kube, ns: str, kind: str, name: str) -> Doc:
    result: Doc = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURALS[kind], name)
    return result


def _conditions(obj: Doc) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in (obj.get("status") or {}).get("conditions") or []}


def _condition(obj: Doc, ctype: str) -> dict[str, Any] | None:
    return next((dict(c) for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def summarize(kube: Kube, ns: str) -> Summary:
    """Every object's conditions (type -> status, reason), and each job's bound profile and assignment."""
    summary: Summary = {}
    for kind, plural in PLURALS.items():
        for obj in kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, plural)["items"]:
            entry: dict[str, Any] = {"conditions": _conditions(obj)}
            if kind == "AgentJob":
                status = obj.get("status") or {}
                entry["profile"] = (status.get("profile") or {}).get("name")
                entry["assignment"] = status.get("assignment")
            summary[(kind, obj["metadata"]["name"])] = entry
    return summary


def audits(kube: Kube, ns: str) -> Counter[tuple[str, str]]:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "auditrecords")["items"]
    # Routing decisions are entries of RoutingDecisions batches: one item per decision.
    return Counter((a["spec"]["action"], a["spec"]["object"]["name"]) for a in iter_routing_decisions(items))


def reason_is(kube: Kube, ns: str, kind: str, name: str, ctype: str, reason: str) -> Callable[[], Any]:
    def check() -> Any:
        cond = _condition(_get(kube, ns, kind, name), ctype)
        return cond if cond and cond["reason"] == reason else None

    check.__name__ = f"{kind} {name} {ctype} reason {reason}"
    return check


def apply(kubectl: Kubectl, ns: str, docs: list[Doc]) -> None:
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))


def webhook_ready(kubectl: Kubectl) -> bool:
    proc = kubectl("get", "validatingwebhookconfiguration", "helmhive.dev", "-o", "json", check=False)
    return proc.returncode == 0 and bool(json.loads(proc.stdout).get("webhooks"))


@pytest.fixture
def ready(operator: OperatorProcess, kubectl: Kubectl) -> OperatorProcess:
    """The operator, with its profile webhook registered (profiles are refused while it starts)."""
    wait_for(lambda: webhook_ready(kubectl), timeout=60, describe="the operator's validating webhook")
    return operator


# -- the orders -----------------------------------------------------------------------------------


def all_at_once(kube: Kube, kubectl: Kubectl, ns: str) -> None:
    """One ``kubectl apply`` of everything, dependants first in the stream."""
    apply(kubectl, ns, [*jobs(), *memory(), *profiles(), workspace()])


def dependencies_first(kube: Kube, kubectl: Kubectl, ns: str) -> None:
    """Profiles, then the Workspace, then memory, then jobs, each once the previous is reconciled."""
    apply(kubectl, ns, profiles())
    for doc in profiles():
        wait_for(reason_is(kube, ns, "Profile", doc["metadata"]["name"], "Valid", "Valid"), timeout=CONVERGE)
    apply(kubectl, ns, [workspace()])
    wait_for(reason_is(kube, ns, "Workspace", "payments", "Ready", "Reconciled"), timeout=CONVERGE)
    apply(kubectl, ns, memory())
    for doc in memory():
        wait_for(reason_is(kube, ns, "MemoryRecord", doc["metadata"]["name"], "Active", "InEffect"), timeout=CONVERGE)
    apply(kubectl, ns, jobs())


def reverse(kube: Kube, kubectl: Kubectl, ns: str) -> None:
    """Jobs and memory first, and seen waiting by the operator; then the profiles; the Workspace last."""
    apply(kubectl, ns, [*jobs(), *memory()])
    waiting = [
        ("AgentJob", "check-anthropic-login", "Routed", "WaitingForWorkspace"),
        ("AgentJob", "check-anthropic-login", "Ready", "WaitingForWorkspace"),
        ("AgentJob", "review-diff", "Routed", "WaitingForProfile"),
        ("AgentJob", "review-diff", "Ready", "WaitingForProfile"),
        *(("MemoryRecord", doc["metadata"]["name"], "Active", "WaitingForWorkspace") for doc in memory()),
    ]
    for kind, name, ctype, reason in waiting:
        cond = wait_for(reason_is(kube, ns, kind, name, ctype, reason), timeout=CONVERGE)
        assert cond["status"] == "False"
    message = _condition(_get(kube, ns, "AgentJob", "check-anthropic-login"), "Routed")
    assert message is not None
    assert f"workspace payments does not exist in {ns}; waiting until " in message["message"]
    assert _get(kube, ns, "AgentJob", "check-anthropic-login")["status"].get("profile") is None

    apply(kubectl, ns, profiles())

    # The job that names its profile binds (and is routed: it waits for a runner, then fails closed)
    # without the Workspace.
    def routed_without_workspace() -> Any:
        cond = _condition(_get(kube, ns, "AgentJob", "review-diff"), "Routed")
        return cond if cond and cond["reason"] in ("WaitingForCapacity", "NoEligibleRunner") else None

    wait_for(routed_without_workspace, timeout=CONVERGE, describe="review-diff routed without the Workspace")
    assert _condition(_get(kube, ns, "AgentJob", "check-anthropic-login"), "Routed")["reason"] == (
        "WaitingForWorkspace"
    )
    apply(kubectl, ns, [workspace()])


ORDERS = {"all-at-once": all_at_once, "dependencies-first": dependencies_first, "reverse": reverse}


@pytest.mark.parametrize("order", list(ORDERS))
def test_every_order_converges_to_the_same_state(
    order: str, ready: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    ORDERS[order](kube, kubectl, namespace)

    def converged() -> Summary | None:
        summary = summarize(kube, namespace)
        return summary if summary == EXPECTED else None

    try:
        wait_for(converged, timeout=CONVERGE, describe=f"{order}: every object in its final state")
    except AssertionError:
        raise AssertionError(f"{order} did not converge:\n{summarize(kube, namespace)}") from None
    wait_for(
        lambda: audits(kube, namespace) == EXPECTED_AUDITS,
        timeout=CONVERGE,
        describe=f"{order}: the audit trail {dict(EXPECTED_AUDITS)}",
    )
    final = summarize(kube, namespace)
    reasons = {reason for entry in final.values() for _, reason in entry["conditions"].values()}
    assert not reasons & ORDERING_REASONS
    # The README's promise for check-anthropic-login: it fails closed because no runner serves it.
    routed = _condition(_get(kube, namespace, "AgentJob", "check-anthropic-login"), "Routed")
    assert routed is not None
    assert routed["reason"] == "NoEligibleRunner"


def test_a_workspace_named_without_a_binding_waits_for_the_profile_until_the_workspace_names_it(
    ready: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    apply(kubectl, namespace, [*profiles(), workspace(bind_connection_test=False), jobs()[0]])
    cond = wait_for(
        reason_is(kube, namespace, "AgentJob", "check-anthropic-login", "Routed", "WaitingForProfile"),
        timeout=CONVERGE,
    )
    assert "workspace payments names no active profile for connection-test" in cond["message"]
    apply(kubectl, namespace, [workspace()])
    wait_for(
        reason_is(kube, namespace, "AgentJob", "check-anthropic-login", "Routed", "NoEligibleRunner"),
        timeout=CONVERGE,
    )
    job = _get(kube, namespace, "AgentJob", "check-anthropic-login")
    assert job["status"]["profile"]["name"] == "connection-check"
    assert _conditions(job) == EXPECTED[("AgentJob", "check-anthropic-login")]["conditions"]


def test_a_workspace_that_never_appears_fails_closed_at_the_deadline_counted_from_creation(
    ready: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    job, record = jobs()[0], memory()[0]
    apply(kubectl, namespace, [job, record])
    name = "check-anthropic-login"
    waiting = wait_for(reason_is(kube, namespace, "AgentJob", name, "Routed", "WaitingForWorkspace"), timeout=CONVERGE)
    created = dt.datetime.fromisoformat(
        _get(kube, namespace, "AgentJob", name)["metadata"]["creationTimestamp"].replace("Z", "+00:00")
    )
    deadline = (created + dt.timedelta(seconds=WAIT_SECONDS)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert waiting["message"] == f"workspace payments does not exist in {namespace}; waiting until {deadline}"
    wait_for(
        reason_is(kube, namespace, "MemoryRecord", "money-is-integer-cents", "Active", "WaitingForWorkspace"),
        timeout=CONVERGE,
    )

    # A restart while it waits neither loses the deadline nor moves it.
    ready.restart()
    still = _condition(_get(kube, namespace, "AgentJob", name), "Routed")
    assert still is not None
    assert still["reason"] in ("WaitingForWorkspace", "WorkspaceNotFound")

    failed = wait_for(
        reason_is(kube, namespace, "AgentJob", name, "Routed", "WorkspaceNotFound"), timeout=WAIT_SECONDS + CONVERGE
    )
    assert failed["status"] == "False"
    assert f"until {deadline}" in failed["message"]
    job_now = _get(kube, namespace, "AgentJob", name)
    assert _conditions(job_now) == {
        "Routed": ("False", "WorkspaceNotFound"),
        "Ready": ("False", "WorkspaceNotFound"),
        "Stalled": ("True", "WorkspaceNotFound"),
    }
    assert job_now["status"].get("profile") is None
    gone = wait_for(
        reason_is(kube, namespace, "MemoryRecord", "money-is-integer-cents", "Active", "WorkspaceNotFound"),
        timeout=CONVERGE,
    )
    assert gone["status"] == "False"

    # Failing closed is final for the job; a memory record follows its Workspace whenever it comes.
    apply(kubectl, namespace, [*profiles(), workspace()])
    wait_for(
        reason_is(kube, namespace, "MemoryRecord", "money-is-integer-cents", "Active", "InEffect"), timeout=CONVERGE
    )
    wait_for(reason_is(kube, namespace, "Workspace", "payments", "Ready", "Reconciled"), timeout=CONVERGE)
    after = _get(kube, namespace, "AgentJob", name)
    assert _conditions(after) == {
        "Routed": ("False", "WorkspaceNotFound"),
        "Ready": ("False", "WorkspaceNotFound"),
        "Stalled": ("True", "WorkspaceNotFound"),
    }
    assert after["status"].get("profile") is None

"""An upgraded operator does not re-run old failures: the re-run window, on a real API server.

Two jobs end ``AgentCrashed`` while no operator runs (as before an upgrade to the operator that
re-runs failures): one three hours ago, one a minute ago. The operator started afterwards sees
both in its initial listing; it re-queues the recent one (``RetryAllowed``) and closes the old
one with the ``RetryWindowPassed`` verdict and Event, once, even across its own restart. The
window is set through ``HELMHIVE_RETRY_WINDOW_SECONDS`` (30 minutes here).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import yaml

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorFactory
from harness.wait import wait_for

API = "helmhive.dev/v1alpha1"
GROUP, VERSION = "helmhive.dev", "v1alpha1"

DOCS: list[dict[str, Any]] = [
    {
        "apiVersion": API,
        "kind": "Workspace",
        "metadata": {"name": "payments"},
        "spec": {
            "repository": {"url": "https://git.example.com/payments.git"},
            "profiles": [{"jobKind": "review-probe", "profile": "ref-review"}],
        },
    },
    {
        "apiVersion": API,
        "kind": "Profile",
        "metadata": {"name": "ref-review"},
        "spec": {
            "envelope": "review-probe",
            "purpose": "Window test.",
            "instructions": "Answer briefly.",
            "providerMappings": [{"provider": "reference"}],
        },
    },
]


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {"workspace": "payments", "jobKind": "review-probe", "request": {"title": name, "prompt": "Review."}},
    }


def _get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return dict(kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", name))


def _condition(job: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _reasons(kube: Kube, namespace: str, name: str) -> list[str]:
    events = kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [str(e.reason) for e in events if e.type == "Warning"]


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _end_crashed(kube: Kube, namespace: str, name: str, *, ended: dt.datetime) -> None:
    """Write what the runner writes when the agent crashes: Succeeded=False AgentCrashed, no verdict."""
    at = _stamp(ended)
    conditions = [
        {
            "type": t,
            "status": "False",
            "reason": "AgentCrashed",
            "message": "the agent exited with exit code 70",
            "lastTransitionTime": at,
        }
        for t in ("Running", "Succeeded", "Ready")
    ]
    status = {
        "conditions": conditions,
        "result": {"outcome": "AgentCrashed", "startedAt": _stamp(ended - dt.timedelta(seconds=30)), "completedAt": at},
    }
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "agentjobs", name, {"status": status})


@pytest.mark.timeout(300)
def test_an_operator_started_after_failures_reruns_only_the_recent_one(
    operator_factory: OperatorFactory, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    before = operator_factory("before")
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([*DOCS, _job("old"), _job("recent")]))
    for name in ("old", "recent"):
        wait_for(
            lambda name=name: (_get(kube, namespace, name).get("status") or {}).get("profile"),
            timeout=60,
            describe=f"job {name} bound to its profile",
        )
    before.stop()
    now = dt.datetime.now(dt.UTC)
    _end_crashed(kube, namespace, "old", ended=now - dt.timedelta(hours=3))
    _end_crashed(kube, namespace, "recent", ended=now - dt.timedelta(minutes=1))

    # The setting is read from the environment, as the chart and docs say (the default is 15m).
    upgraded = operator_factory("upgraded", env={"HELMHIVE_RETRY_WINDOW_SECONDS": "1800"})

    def requeued() -> dict[str, Any]:
        job = _get(kube, namespace, "recent")
        assert (job.get("status") or {}).get("attempts") == 1, json.dumps(job.get("status"))
        return job

    wait_for(requeued, timeout=90, describe="the recent failure re-queued")
    wait_for(lambda: "RetryAllowed" in _reasons(kube, namespace, "recent"), timeout=60, describe="RetryAllowed Event")

    def closed() -> dict[str, Any]:
        cond = _condition(_get(kube, namespace, "old"), "Succeeded")
        assert "RetryWindowPassed" in cond.get("message", ""), cond
        return cond

    verdict = wait_for(closed, timeout=90, describe="the old failure closed with RetryWindowPassed")
    assert (verdict["status"], verdict["reason"]) == ("False", "AgentCrashed"), verdict
    assert verdict["message"].startswith("the agent exited with exit code 70; not re-run: failed 3h")
    assert verdict["message"].endswith("ago, outside the 30m re-run window (RetryWindowPassed)")
    old = _get(kube, namespace, "old")
    assert not old["status"].get("attempts") and old["status"]["result"]["outcome"] == "AgentCrashed"
    wait_for(
        lambda: "RetryWindowPassed" in _reasons(kube, namespace, "old"), timeout=60, describe="RetryWindowPassed Event"
    )

    # Written once: a restarted operator lists the closed job again and writes nothing more. A third
    # failure, ended after the restart, shows the restarted operator is past its initial listing.
    upgraded.restart()
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_job("probe")))
    wait_for(
        lambda: (_get(kube, namespace, "probe").get("status") or {}).get("profile"),
        timeout=60,
        describe="job probe bound to its profile",
    )
    _end_crashed(kube, namespace, "probe", ended=dt.datetime.now(dt.UTC))
    wait_for(lambda: "RetryAllowed" in _reasons(kube, namespace, "probe"), timeout=90, describe="probe re-queued")
    after = _get(kube, namespace, "old")
    assert _condition(after, "Succeeded")["message"] == verdict["message"]
    assert _reasons(kube, namespace, "old").count("RetryWindowPassed") == 1
    assert "RetryAllowed" not in _reasons(kube, namespace, "old")

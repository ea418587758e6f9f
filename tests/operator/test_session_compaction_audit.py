"""Session compactions are audited by the operator: one SessionCompacted per count, figures only.

The binding's status is written as a runner leaves it after compacting (``compactions`` and
``lastCompaction`` in one write), with a token of the runner pod its ``spec.runner`` names: the
``helmhive-session-compactions`` policy lets nobody else write them. The runner's sessions
Secret holds a planted canary session id under the binding's key; the operator reads bindings,
not the Secret, and the canary must be in no AuditRecord, Event or operator log line.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from kubernetes import client
from runner_pod import runner_pod_api

from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.policy.sessions.compaction import compacted_audit_name

GROUP, VERSION = "helmhive.dev", "v1alpha1"
BINDINGS = "sessionbindings"
NAME = "sb-00000000000000c0ffee"
CANARY = "canary-sid-a0d17c"


def _compactions(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    items = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "auditrecords", label_selector="helmhive.dev/audit-action=SessionCompacted"
    )["items"]
    return {a["metadata"]["name"]: a["spec"] for a in items}


def _record(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found = wait_for(
        lambda: _compactions(kube, namespace).get(name), timeout=60, describe=f"SessionCompacted record {name}"
    )
    assert isinstance(found, dict)
    return found


def _patch(custom: client.CustomObjectsApi, namespace: str, status: dict[str, Any]) -> None:
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, BINDINGS, NAME, {"status": status})


def _compaction(method: str, job: str, before: int, after: int | None) -> dict[str, Any]:
    """``lastCompaction`` as the runner writes it (an unreported ``usedAfter`` is null, clearing the last)."""
    last = {"method": method, "at": "2026-12-01T22:00:00Z", "job": job, "usedBefore": before, "contextSize": 5000}
    return last | {"usedAfter": after, "reason": "context 3000 of 5000 tokens (60%) is at or past the 50% watermark"}


def test_each_compaction_is_recorded_once_without_the_session_id(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="helmhive-sessions-pool-a-0"),
        data={NAME: base64.b64encode(CANARY.encode()).decode()},
    )
    kube.core.create_namespaced_secret(namespace, secret)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SessionBinding",
        "metadata": {"name": NAME},
        "spec": {
            "workspace": "payments",
            "profile": "quick-review",
            "provider": "reference",
            "runner": "pool-a-0",
            "credentialGeneration": 1,
            "scope": "workspace",
        },
    }
    created = kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, BINDINGS, body)
    uid = created["metadata"]["uid"]
    runner = runner_pod_api(kube, namespace, service_account_identity)
    wait_for(lambda: runner.get_namespaced_custom_object(GROUP, VERSION, namespace, BINDINGS, NAME), timeout=30)
    _patch(runner, namespace, {"stored": True, "turns": 2})
    _patch(
        runner,
        namespace,
        {"compactions": 1, "lastCompaction": _compaction("compact-command", "second", 3000, 2000)},
    )
    first = _record(kube, namespace, compacted_audit_name(NAME, uid, 1))
    assert first["actor"]["username"] == "helmhive-runner:pool-a-0"
    assert first["object"]["kind"] == "SessionBinding" and first["object"]["name"] == NAME
    details = first["details"]
    assert (details["method"], details["compactions"], details["job"]) == ("compact-command", "1", "second")
    assert (details["usedBefore"], details["usedAfter"], details["contextSize"]) == ("3000", "2000", "5000")
    assert first["before"]["value"] == "context 3000 of 5000 tokens"
    assert first["after"]["value"] == "context 2000 tokens (compact-command)"

    # Another status write without a new compaction records nothing; the next compaction does.
    _patch(runner, namespace, {"turns": 3})
    _patch(runner, namespace, {"compactions": 2, "lastCompaction": _compaction("archive", "third", 3000, None)})
    second = _record(kube, namespace, compacted_audit_name(NAME, uid, 2))
    assert (second["details"]["method"], second["details"]["usedAfter"]) == ("archive", "unreported")
    assert len(_compactions(kube, namespace)) == 2

    def event_posted() -> list[str]:
        events = kube.core.list_namespaced_event(namespace).items
        found = [str(e.message) for e in events if e.reason == "SessionCompacted"]
        assert len(found) == 2, found
        return found

    events = wait_for(event_posted, timeout=60, describe="two SessionCompacted Events")
    places = {
        "audit records": json.dumps(_compactions(kube, namespace)),
        "events": json.dumps(events),
        "operator log": operator.log_text(),
    }
    assert {where: CANARY in text for where, text in places.items()} == dict.fromkeys(places, False)

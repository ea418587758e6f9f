"""Profiles, memory and audit on a real API server with the real operator (and its webhooks)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for

GROUP, VERSION = "helmhive.dev", "v1alpha1"
# A missing profile is waited for (GitOps order) before failing closed; 30 s here rather than 600.
OPERATOR_ENV = {"HELMHIVE_REFERENCE_WAIT_SECONDS": "30"}


def _profile(name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "envelope": "review-probe",
        "purpose": "Review small diffs.",
        "instructions": "Look for bugs.",
        "providerMappings": [{"provider": "anthropic", "model": "claude-sonnet-4-5"}],
    }
    body.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Profile", "metadata": {"name": name}, "spec": body}


def _get(kube: Kube, ns: str, plural: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
    return result


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return dict(cond)
    return None


def _condition_is(kube: Kube, ns: str, plural: str, name: str, ctype: str, status: str) -> Callable[[], Any]:
    def check() -> Any:
        cond = _condition(_get(kube, ns, plural, name), ctype)
        return cond if cond and cond["status"] == status else None

    return check


def _audits(kube: Kube, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "auditrecords")["items"]
    return items


def _webhook_ready(kubectl: Kubectl) -> Callable[[], bool]:
    def check() -> bool:
        proc = kubectl("get", "validatingwebhookconfiguration", "helmhive.dev", "-o", "json", check=False)
        return proc.returncode == 0 and bool(json.loads(proc.stdout).get("webhooks"))

    return check


def test_admission_refuses_a_widening_profile_with_field_paths(
    operator: OperatorProcess, kubectl: Kubectl, namespace: str
) -> None:
    wait_for(_webhook_ready(kubectl), timeout=30, describe="the operator's validating webhook configuration")
    bad = _profile("too-wide", envelope="change-review", filesystem="write", tools=["read", "edit"])
    proc = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert proc.returncode != 0
    assert "spec.filesystem: FilesystemWiderThanEnvelope" in proc.stderr
    assert "spec.tools[1]: ToolOutsideEnvelope" in proc.stderr
    assert "ReviewProfileWrites" in proc.stderr
    assert "too-wide" not in kubectl("get", "profiles", "-n", namespace, "-o", "name").stdout


def test_revisions_are_immutable_snapshots_and_audited_with_the_actor(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    wait_for(_webhook_ready(kubectl), timeout=30, describe="the webhook")
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_profile("quick-review")))
    wait_for(_condition_is(kube, namespace, "profiles", "quick-review", "Valid", "True"), timeout=30)
    first = _get(kube, namespace, "profiles", "quick-review")["status"]
    assert first["effective"]["filesystem"] == "read"
    assert "diff-review" in first["effective"]["requiredCapabilities"]

    apps = client.AppsV1Api(kube.api_client)
    revision = apps.read_namespaced_controller_revision(first["currentRevision"], namespace)
    assert revision.data["hash"] == first["currentHash"]
    assert revision.data["spec"]["instructions"] == "Look for bugs."
    assert revision.metadata.owner_references[0].kind == "Profile"
    with pytest.raises(ApiException) as info:
        apps.patch_namespaced_controller_revision(
            first["currentRevision"], namespace, {"data": {"hash": "sha256:forged"}}
        )
    assert info.value.status == 422

    kubectl(
        "patch",
        "profile",
        "quick-review",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"instructions":"Be brief."}}',
    )

    def second_revision() -> dict[str, Any] | None:
        status = _get(kube, namespace, "profiles", "quick-review").get("status") or {}
        return status if status.get("currentRevision") not in (None, first["currentRevision"]) else None

    second = wait_for(second_revision, timeout=30, describe="a second revision")
    assert second["revisions"] == [first["currentRevision"], second["currentRevision"]]
    old = apps.read_namespaced_controller_revision(first["currentRevision"], namespace)
    assert old.data["spec"]["instructions"] == "Look for bugs."

    def two_audits() -> list[dict[str, Any]]:
        found = [a for a in _audits(kube, namespace) if a["spec"]["action"] == "ProfileRevisionCreated"]
        return found if len(found) == 2 else []

    audits = sorted(
        wait_for(two_audits, timeout=60, describe="two revision audit records"), key=lambda a: a["spec"]["time"]
    )
    latest = next(a for a in audits if a["spec"]["after"]["revision"] == second["currentRevision"])
    assert latest["spec"]["before"]["revision"] == first["currentRevision"]
    assert latest["spec"]["after"]["hash"] == second["currentHash"]
    # The mutating webhook stamped who changed it, as the API server authenticated them.
    assert latest["spec"]["actor"]["username"] not in ("unknown", "helmhive-operator")
    assert "system:masters" in latest["spec"]["actor"]["groups"]

    with pytest.raises(ApiException) as info:
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "auditrecords", latest["metadata"]["name"], {"spec": {"message": "rewritten"}}
        )
    assert info.value.status == 422
    assert "append-only" in info.value.body


def test_a_job_keeps_its_profile_snapshot_when_the_profile_changes(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    wait_for(_webhook_ready(kubectl), timeout=30, describe="the webhook")
    workspace = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workspace",
        "metadata": {"name": "payments"},
        "spec": {
            "repository": {"url": "https://git.example.com/payments.git"},
            "profiles": [{"jobKind": "review-probe", "profile": "quick-review"}],
        },
    }
    job = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentJob",
        "metadata": {"name": "review-1"},
        "spec": {"workspace": "payments", "jobKind": "review-probe", "request": {"title": "r", "prompt": "review"}},
    }
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([workspace, _profile("quick-review")]))
    wait_for(_condition_is(kube, namespace, "profiles", "quick-review", "Valid", "True"), timeout=30)
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))

    def bound() -> dict[str, Any] | None:
        return (_get(kube, namespace, "agentjobs", "review-1").get("status") or {}).get("profile")

    binding = wait_for(bound, timeout=30, describe="the job's profile binding")
    ready = wait_for(_condition_is(kube, namespace, "workspaces", "payments", "Ready", "True"), timeout=40)
    assert ready["message"] == "1 active profiles resolve"
    assert binding["snapshot"]["instructions"] == "Look for bugs."
    kubectl(
        "patch",
        "profile",
        "quick-review",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"instructions":"Changed."}}',
    )
    wait_for(
        lambda: _get(kube, namespace, "profiles", "quick-review")["status"]["currentRevision"] != binding["revision"],
        timeout=30,
        describe="the profile's next revision",
    )
    after = _get(kube, namespace, "agentjobs", "review-1")["status"]["profile"]
    assert after == binding
    # The revision the job runs with is still there to read back.
    apps = client.AppsV1Api(kube.api_client)
    assert apps.read_namespaced_controller_revision(binding["revision"], namespace).data["hash"] == binding["hash"]

    # A job whose profile does not exist fails closed at queue time, with a reason, once its wait ends.
    orphan = dict(job, metadata={"name": "orphan"})
    orphan["spec"] = dict(job["spec"], profile="no-such-profile")
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(orphan))

    def failed_closed() -> dict[str, Any] | None:
        cond = _condition(_get(kube, namespace, "agentjobs", "orphan"), "Routed")
        waiting = cond is not None and str(cond["reason"]).startswith("WaitingFor")
        return cond if cond and cond["status"] == "False" and not waiting else None

    cond = wait_for(failed_closed, timeout=150, describe="the orphan job to fail closed after its wait")
    assert cond["reason"] == "ProfileNotFound"
    assert "no-such-profile" in cond["message"]


def test_a_profile_created_while_the_operator_was_down_is_marked_invalid(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    wait_for(_webhook_ready(kubectl), timeout=30, describe="the webhook")
    operator.stop()
    try:
        # With the operator down its webhook fails closed; bypass it as a restore from backup would.
        kubectl("delete", "validatingwebhookconfiguration", "helmhive.dev")
        kubectl("delete", "mutatingwebhookconfiguration", "helmhive.dev", check=False)
        bad = _profile("sneaky", envelope="change-planning", memory={"enabled": True}, session={"policy": "resume"})
        kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(bad))
    finally:
        operator.start()
    cond = wait_for(_condition_is(kube, namespace, "profiles", "sneaky", "Valid", "False"), timeout=40)
    assert cond["reason"] in ("MemoryForbidden", "SessionPolicyForbidden")
    assert "spec.memory.enabled: MemoryForbidden" in cond["message"]
    assert "spec.session.policy: SessionPolicyForbidden" in cond["message"]
    assert (_get(kube, namespace, "profiles", "sneaky").get("status") or {}).get("effective") is None
    wait_for(_webhook_ready(kubectl), timeout=30, describe="the webhook to be re-registered on startup")


def _memory(name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "workspace": "payments",
        "scope": {"type": "workspace"},
        "kind": "constraint",
        "text": "Amounts are integer cents.",
        "source": {"type": "adr", "url": "https://example.com/adr/4"},
        "sensitivity": "internal",
    }
    body.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MemoryRecord", "metadata": {"name": name}, "spec": body}


def test_memory_expires_on_time_and_every_change_is_audited(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    workspace = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workspace",
        "metadata": {"name": "payments"},
        "spec": {"repository": {"url": "https://git.example.com/payments.git"}, "services": [{"name": "api"}]},
    }
    # Far enough ahead that the record is seen Active first even on a loaded machine.
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=15)).strftime("%Y-%m-%dT%H:%M:%SZ")
    docs = [
        workspace,
        _memory("short-lived", expiresAt=expires),
        _memory("wrong-service", scope={"type": "service", "service": "billing"}),
    ]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))
    wait_for(_condition_is(kube, namespace, "memoryrecords", "short-lived", "Active", "True"), timeout=60)
    scoped = wait_for(_condition_is(kube, namespace, "memoryrecords", "wrong-service", "Active", "False"), timeout=60)
    assert scoped["reason"] == "ServiceNotInWorkspace"

    expired = wait_for(
        _condition_is(kube, namespace, "memoryrecords", "short-lived", "Active", "False"), timeout=90, interval=0.25
    )
    assert expired["reason"] == "Expired"
    # Never before expiresAt: that lower bound is the rule. The upper bound only tells "at its
    # time" from "whenever something else happens"; it is many times the second it takes.
    transition = dt.datetime.fromisoformat(expired["lastTransitionTime"].replace("Z", "+00:00"))
    assert transition >= dt.datetime.fromisoformat(expires.replace("Z", "+00:00"))
    assert (transition - dt.datetime.fromisoformat(expires.replace("Z", "+00:00"))).total_seconds() < 30

    kubectl(
        "patch",
        "memoryrecord",
        "wrong-service",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"scope":{"service":"api"}}}',
    )
    wait_for(_condition_is(kube, namespace, "memoryrecords", "wrong-service", "Active", "True"), timeout=40)
    kubectl("delete", "memoryrecord", "wrong-service", "-n", namespace)

    def actions() -> set[tuple[str, str]]:
        return {(a["spec"]["action"], a["spec"]["object"]["name"]) for a in _audits(kube, namespace)}

    wanted = {
        ("MemoryCreated", "short-lived"),
        ("MemoryExpired", "short-lived"),
        ("MemoryCreated", "wrong-service"),
        ("MemoryUpdated", "wrong-service"),
        ("MemoryDeleted", "wrong-service"),
    }
    wait_for(lambda: wanted <= actions(), timeout=30, describe=f"audit records {sorted(wanted)}")
    updated = next(a for a in _audits(kube, namespace) if a["spec"]["action"] == "MemoryUpdated")
    assert updated["spec"]["before"]["hash"] != updated["spec"]["after"]["hash"]


def test_a_namespace_holding_memory_records_can_be_deleted(operator: OperatorProcess, kube: Kube) -> None:
    # The delete handler audits each record, but a terminating namespace refuses new objects: the
    # operator must let the records (and so the namespace) go rather than retry forever.
    name = kube.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(generate_name="t-memory-ns-delete-"))
    ).metadata.name
    for i in range(3):
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, name, "memoryrecords", _memory(f"m{i}"))

    def finalized() -> bool:
        items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, name, "memoryrecords")["items"]
        return len(items) == 3 and all(i["metadata"].get("finalizers") for i in items)

    wait_for(finalized, timeout=60, describe="the operator to hold the records with its finalizer")
    kube.core.delete_namespace(name)

    def gone() -> bool:
        try:
            kube.core.read_namespace(name)
        except ApiException as err:
            return err.status == 404
        return False

    wait_for(gone, timeout=180, describe=f"namespace {name} to be deleted with its memory records")
    # The operator shares this module with other tests: look only at this namespace's records.
    retried = [r for r in operator.log_records() if name in r.get("message", "") and "will try again" in r["message"]]
    assert not retried, retried


def test_no_secret_or_instruction_text_reaches_audit_events_or_logs(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    secret_canary = "CANARY-SECRET-7f3a9c2e"
    instruction_canary = "CANARY-INSTRUCTION-51bd"
    kube.core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="provider-key"), string_data={"api-key": secret_canary}),
    )
    wait_for(_webhook_ready(kubectl), timeout=30, describe="the webhook")
    profile = _profile("canary-profile", instructions=f"Never print {instruction_canary}.")
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([profile, _memory("canary-memory")]))
    wait_for(_condition_is(kube, namespace, "profiles", "canary-profile", "Valid", "True"), timeout=30)
    kubectl(
        "patch",
        "profile",
        "canary-profile",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"purpose": f"p {instruction_canary}"}}),
    )
    wait_for(
        lambda: len([a for a in _audits(kube, namespace) if a["spec"]["action"] == "ProfileRevisionCreated"]) == 2,
        timeout=30,
    )
    wait_for(lambda: any(a["spec"]["action"] == "MemoryCreated" for a in _audits(kube, namespace)), timeout=30)

    audits = json.dumps(_audits(kube, namespace))
    events = json.dumps(kube.api_client.sanitize_for_serialization(kube.core.list_namespaced_event(namespace)))
    log = operator.log_text()
    for canary in (secret_canary, instruction_canary):
        assert canary not in audits
        assert canary not in events
        assert canary not in log
    # The instructions are part of the profile (and its snapshot); that is where they belong.
    assert instruction_canary in json.dumps(_get(kube, namespace, "profiles", "canary-profile"))

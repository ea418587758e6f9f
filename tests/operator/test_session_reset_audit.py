"""Session resets are audited by the operator, however they are done, with the actor from the request.

A ServiceAccount that RBAC lets patch a binding's status and delete bindings resets one with
``kubectl patch --subresource=status`` and deletes another; the operator writes ``SessionReset``
naming that ServiceAccount (as its admission webhook saw the request), once per reset, also
across a restart. A reset made while the operator is down is recorded when it starts, with the
actor ``unknown`` (nobody witnessed it). The admission policy keeps the count honest.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from session_witness import witnesses_ready

from harness.identity import Identity
from harness.kube import IdentityFactory, Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.policy.sessions.audit import deleted_audit_name, reset_audit_name

GROUP, VERSION = "helmhive.dev", "v1alpha1"
BINDINGS = "sessionbindings"


def make_binding(kube: Kube, namespace: str, name: str, *, stored: bool = True) -> dict[str, Any]:
    """A SessionBinding as a runner leaves it (created, a session stored), once the operator has seen it."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SessionBinding",
        "metadata": {"name": name},
        "spec": {
            "workspace": "payments",
            "profile": "quick-review",
            "provider": "anthropic",
            "runner": "pool-a-0",
            "credentialGeneration": 1,
            "scope": "workspace",
        },
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, BINDINGS, body)
    if stored:
        kube.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, BINDINGS, name, {"status": {"stored": True, "turns": 1}}
        )

    def seen() -> dict[str, Any] | None:
        obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, BINDINGS, name)
        meta = obj["metadata"]
        handled = "helmhive.dev/last-handled-configuration" in (meta.get("annotations") or {})
        return obj if meta.get("finalizers") and handled else None

    return wait_for(seen, timeout=60, describe=f"the operator to take binding {name} in (finalizer, handled)")


def resetter(kube: Kube, namespace: str, identities: IdentityFactory) -> Identity:
    """A ServiceAccount RBAC lets read, patch the status of, and delete session bindings."""
    who = identities(namespace, "resetter")
    kube.rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="session-resetter"),
            rules=[
                client.V1PolicyRule(api_groups=[GROUP], resources=[BINDINGS], verbs=["get", "list", "delete"]),
                client.V1PolicyRule(api_groups=[GROUP], resources=[f"{BINDINGS}/status"], verbs=["get", "patch"]),
            ],
        ),
    )
    kube.rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="session-resetter"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="session-resetter"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="resetter", namespace=namespace)],
        ),
    )
    return who


def session_resets(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    items = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "auditrecords", label_selector="helmhive.dev/audit-action=SessionReset"
    )["items"]
    return {a["metadata"]["name"]: a["spec"] for a in items}


def record(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found = wait_for(
        lambda: session_resets(kube, namespace).get(name), timeout=60, describe=f"SessionReset record {name}"
    )
    assert isinstance(found, dict)
    return found


def patch_status(kubectl: Kubectl, namespace: str, name: str, status: dict[str, Any]) -> Any:
    return kubectl(
        "patch",
        "sessionbinding",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        check=False,
    )


def test_a_kubectl_reset_and_a_deletion_are_recorded_with_the_caller(
    operator: OperatorProcess,
    kube: Kube,
    kubectl: Kubectl,
    namespace: str,
    service_account_identity: IdentityFactory,
) -> None:
    witnesses_ready(kube)
    who = resetter(kube, namespace, service_account_identity)
    as_resetter = kubectl.as_user(who.kubeconfig)
    binding = make_binding(kube, namespace, "sb-0000000000000000aaaa")
    uid = binding["metadata"]["uid"]

    # Turning stored off without counting the reset is refused: every reset has a count.
    refused = patch_status(as_resetter, namespace, "sb-0000000000000000aaaa", {"stored": False})
    assert refused.returncode != 0
    assert "is a reset: count it by setting status.resets to 1" in refused.stderr

    done = patch_status(as_resetter, namespace, "sb-0000000000000000aaaa", {"stored": False, "resets": 1})
    assert done.returncode == 0, done.stderr
    first = record(kube, namespace, reset_audit_name("sb-0000000000000000aaaa", uid, 1))
    assert first["actor"]["username"] == who.username
    assert "system:serviceaccounts" in first["actor"]["groups"]
    assert first["details"]["actorSource"] == "admission" and first["details"]["via"] == "status"
    assert (first["details"]["resets"], first["details"]["resetsBefore"]) == ("1", "0")
    assert first["object"] == {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SessionBinding",
        "namespace": namespace,
        "name": "sb-0000000000000000aaaa",
        "uid": uid,
    }

    # The count never goes down (so a count names one reset, and its record, for good).
    lower = patch_status(as_resetter, namespace, "sb-0000000000000000aaaa", {"resets": 0})
    assert lower.returncode != 0 and "only grows (from 1)" in lower.stderr

    # Deleting a binding is a reset too; the finalizer holds it until the operator has recorded it.
    other = make_binding(kube, namespace, "sb-0000000000000000bbbb")
    as_resetter("delete", "sessionbinding", "sb-0000000000000000bbbb", "-n", namespace, "--wait=false")
    deleted = record(kube, namespace, deleted_audit_name("sb-0000000000000000bbbb", other["metadata"]["uid"]))
    assert deleted["actor"]["username"] == who.username
    assert deleted["details"]["via"] == "delete" and deleted["after"] == {"value": "deleted"}

    def gone() -> bool:
        with pytest.raises(ApiException) as err:
            kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, BINDINGS, "sb-0000000000000000bbbb")
        return err.value.status == 404

    wait_for(gone, timeout=60, describe="the deleted binding to go once recorded")
    assert len(session_resets(kube, namespace)) == 2


def test_each_reset_is_recorded_once_across_restarts_and_one_made_while_down_is_not_lost(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    bundle = witnesses_ready(kube)
    binding = make_binding(kube, namespace, "sb-0000000000000000cccc")
    name, uid = "sb-0000000000000000cccc", binding["metadata"]["uid"]
    assert patch_status(kubectl, namespace, name, {"stored": False, "resets": 1}).returncode == 0
    first = record(kube, namespace, reset_audit_name(name, uid, 1))
    assert "system:masters" in first["actor"]["groups"]

    # While the operator is down its webhook is not called (failurePolicy Ignore): the reset
    # goes through, and nobody witnessed who made it.
    operator.stop()
    try:
        assert patch_status(kubectl, namespace, name, {"resets": 2}).returncode == 0
    finally:
        operator.start()
    second = record(kube, namespace, reset_audit_name(name, uid, 2))
    assert second["actor"] == {"username": "unknown", "groups": []}
    assert second["details"]["actorSource"] == "notWitnessed"
    assert second["details"]["resetsBefore"] == "1"

    # After the restart, a new reset is witnessed again, and nothing was recorded twice.
    witnesses_ready(kube, not_bundle=bundle)
    assert patch_status(kubectl, namespace, name, {"resets": 3}).returncode == 0
    third = record(kube, namespace, reset_audit_name(name, uid, 3))
    assert third["details"]["actorSource"] == "admission"
    assert sorted(session_resets(kube, namespace)) == sorted(reset_audit_name(name, uid, n) for n in (1, 2, 3))

"""Nobody but the operator writes the audit trail: the ``helmhive-audit-trail`` admission policy.

A ServiceAccount that RBAC allows every verb on AuditRecords, and the cluster admin
(``system:masters``), are both refused when they create, change or delete one, with the policy's
message. The operator still writes its records and its retention still deletes them, and
deleting a namespace still takes the namespace's records with it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.api.audit import AuditAction, AuditActor
from helmhive.controller.audit import patch_audit_retention
from helmhive.controller.kube.door import Kube as OperatorKube
from helmhive.kubeclient import load_api_client
from helmhive.policy.audit.records import build_audit_record

GROUP, VERSION = "helmhive.dev", "v1alpha1"
WRITTEN_ONLY_BY_OPERATOR = (
    "the audit trail is written only by the Helmhive operator (system:serviceaccount:helmhive-system:helmhive-operator)"
)
APPEND_ONLY = "the audit trail is append-only"


def _forged(namespace: str, name: str) -> dict[str, Any]:
    record = build_audit_record(
        action=AuditAction.SESSION_RESET,
        obj={"apiVersion": f"{GROUP}/{VERSION}", "kind": "SessionBinding", "metadata": {"name": "sb-x"}},
        actor=AuditActor(username="someone-else"),
        message="a reset that never happened",
        now=dt.datetime.now(dt.UTC),
        namespace=namespace,
    )
    record["metadata"].pop("generateName")
    record["metadata"]["name"] = name
    return record


def _refused(call: Callable[[], Any]) -> tuple[int, str]:
    with pytest.raises(ApiException) as info:
        call()
    return info.value.status, str(json.loads(info.value.body).get("message", ""))


def _profile(kube: Kube, namespace: str, name: str) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Profile",
        "metadata": {"name": name},
        "spec": {
            "envelope": "connection-test",
            "purpose": "An audited profile.",
            "instructions": "Answer briefly.",
            "providerMappings": [{"provider": "anthropic"}],
        },
    }
    wait_for(
        lambda: kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "profiles", body),
        timeout=30,
        describe=f"profile {name} accepted (the operator's webhook up)",
    )


def _operator_records(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "auditrecords")[
        "items"
    ]
    return items


def _forger(kube: Kube, namespace: str, identities: IdentityFactory) -> client.CustomObjectsApi:
    """A ServiceAccount that RBAC allows everything on AuditRecords in ``namespace``."""
    who = identities(namespace, "forger")
    kube.rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="audit-writer"),
            rules=[
                client.V1PolicyRule(
                    api_groups=[GROUP],
                    resources=["auditrecords"],
                    verbs=["get", "list", "create", "update", "patch", "delete", "deletecollection"],
                )
            ],
        ),
    )
    kube.rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="audit-writer"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="audit-writer"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="forger", namespace=namespace)],
        ),
    )
    custom = client.CustomObjectsApi(who.api_client())
    wait_for(
        lambda: custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "auditrecords") is not None,
        timeout=30,
        describe="the forger's Role to take effect",
    )
    return custom


def test_another_service_account_and_the_cluster_admin_cannot_create_change_or_delete_records(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    forger = _forger(kube, namespace, service_account_identity)
    for who, custom in (("forger", forger), ("admin", kube.custom)):
        create = functools.partial(
            custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "auditrecords",
            _forged(namespace, f"forged-by-{who}"),
        )
        status, message = _refused(create)
        assert status == 403, (who, message)
        assert WRITTEN_ONLY_BY_OPERATOR in message and "may not create an AuditRecord" in message
    assert not [r for r in _operator_records(kube, namespace) if r["metadata"]["name"].startswith("forged-")]

    # The operator's own records are still written.
    _profile(kube, namespace, "audited")
    written = wait_for(
        lambda: [r for r in _operator_records(kube, namespace) if r["spec"]["action"] == "ProfileRevisionCreated"],
        timeout=60,
        describe="the operator's ProfileRevisionCreated record",
    )
    name = written[0]["metadata"]["name"]

    for who, custom in (("forger", forger), ("admin", kube.custom)):
        label = {"metadata": {"labels": {"helmhive.dev/audit-action": "Nothing"}}}
        patch = functools.partial(
            custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, "auditrecords", name, label
        )
        status, message = _refused(patch)
        assert status == 403 and "may not update an AuditRecord" in message, (who, message)
        delete = functools.partial(
            custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, "auditrecords", name
        )
        status, message = _refused(delete)
        assert status == 403, (who, message)
        assert APPEND_ONLY in message and f"may not delete AuditRecord {name}" in message
    status, message = _refused(
        lambda: forger.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, "auditrecords")
    )
    assert status == 403 and APPEND_ONLY in message, message
    kept = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "auditrecords", name)
    assert kept["metadata"]["labels"]["helmhive.dev/audit-action"] == "ProfileRevisionCreated"


def test_the_operator_s_retention_still_deletes_records(operator: OperatorProcess, kube: Kube, namespace: str) -> None:
    _profile(kube, namespace, "kept-briefly")
    wait_for(lambda: _operator_records(kube, namespace), timeout=60, describe="an operator record")
    # Retention as the operator runs it, with the operator's own token: keep none.
    as_operator = OperatorKube(load_api_client(str(operator.kubeconfig)))
    deleted = asyncio.run(
        patch_audit_retention(
            as_operator,
            namespace=namespace,
            now=dt.datetime.now(dt.UTC),
            max_age=dt.timedelta(days=90),
            max_count=0,
        )
    )
    assert deleted >= 1
    assert _operator_records(kube, namespace) == []


def test_a_deleted_namespace_takes_its_records_with_it(operator: OperatorProcess, kube: Kube) -> None:
    name = kube.core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(generate_name="t-audit-ns-gone-", labels={"helmhive.dev/test": "true"})
        )
    ).metadata.name
    _profile(kube, name, "goes-with-its-namespace")
    wait_for(lambda: _operator_records(kube, name), timeout=60, describe="an operator record in the namespace")
    kube.core.delete_namespace(name)

    def gone() -> bool:
        with pytest.raises(ApiException) as err:
            kube.core.read_namespace(name)
        return err.value.status == 404

    wait_for(gone, timeout=120, describe=f"namespace {name} (and its AuditRecords) deleted")

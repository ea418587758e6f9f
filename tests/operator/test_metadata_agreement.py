"""The API server and ``helmhive validate`` agree on a manifest's ``metadata``.

The API server decodes ``metadata`` strictly into ObjectMeta and validates names, labels,
annotations and finalizers; ``helmhive validate`` checks the same offline
(:data:`helmhive.api.object_meta.OBJECT_META_SCHEMA`). Each edge is sent to the real API server as
a dry run and to ``validate_documents``: both accept or both refuse.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from harness.kube import Kube
from helmhive.policy.validation.manifests import SourceDocument, validate_documents

GROUP, VERSION = "helmhive.dev", "v1alpha1"
WORKSPACE: dict[str, Any] = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "Workspace",
    "metadata": {"name": "payments"},
    "spec": {"repository": {"url": "https://git.example.com/payments.git"}},
}
OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "0b9e6a4e-0000-4000-8000-000000000001"}

_EDGES: list[tuple[str, dict[str, Any]]] = [
    ("a name of 253", {"name": "a" * 253}),
    ("a name of 254", {"name": "a" * 254}),
    ("a name with a capital", {"name": "Payments"}),
    ("labels at their bounds", {"labels": {"b" * 63: "v" * 63, "example.com/" + "c" * 63: ""}}),
    ("a label value of 64", {"labels": {"a": "v" * 64}}),
    ("a label key name of 64", {"labels": {"a" * 64: "v"}}),
    ("a label key prefix of 254", {"labels": {"b" * 254 + "/x": "v"}}),
    ("a label key prefix of 253", {"labels": {"b" * 253 + "/x": "v"}}),
    ("a label key with a capital prefix", {"labels": {"Example.com/x": "v"}}),
    ("a label key with a space", {"labels": {"bad key": "v"}}),
    ("a label key with an empty name", {"labels": {"a/": "v"}}),
    ("a label value with a space", {"labels": {"a": "bad value"}}),
    ("a label value that is a list", {"labels": {"a": [1]}}),
    ("a label value that is a number", {"labels": {"a": 5}}),
    ("a null label value", {"labels": {"a": None}}),
    ("labels that are a list", {"labels": ["a"]}),
    ("an annotation key with a capital prefix", {"annotations": {"Example.com/x": "v"}}),
    ("an annotation key with a space", {"annotations": {"bad key": "v"}}),
    ("an annotation value that is a number", {"annotations": {"a": 5}}),
    ("a long annotation value", {"annotations": {"a": "v" * 20000}}),
    ("finalizers, plain and qualified", {"finalizers": ["plain", "example.com/cleanup"]}),
    ("a finalizer with a space", {"finalizers": ["bad name"]}),
    ("a finalizer that is a number", {"finalizers": [5]}),
    ("a generateName with a dash", {"generateName": "pay-"}),
    ("a generateName with a capital", {"generateName": "Pay-"}),
    ("an unknown metadata field", {"unknownMeta": 1}),
    ("a null creationTimestamp", {"creationTimestamp": None}),
    ("a creationTimestamp that is not a time", {"creationTimestamp": "junk"}),
    ("an owner without its name", {"ownerReferences": [{k: v for k, v in OWNER.items() if k != "name"}]}),
    ("an owner", {"ownerReferences": [OWNER]}),
    ("a uid that is a number", {"uid": 5}),
    ("a generation that is a string", {"generation": "x"}),
]


@pytest.mark.parametrize(("meta", "why"), [(meta, why) for why, meta in _EDGES], ids=[why for why, _ in _EDGES])
def test_the_api_server_and_validate_agree_on_metadata(
    kube: Kube, namespace: str, crds: list[str], meta: dict[str, Any], why: str
) -> None:
    body = copy.deepcopy(WORKSPACE)
    body["metadata"].update(meta)
    body["metadata"]["namespace"] = namespace
    try:
        kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "workspaces", body, dry_run="All", field_validation="Strict"
        )
        server = "accepted"
    except ApiException as err:
        assert err.status in (400, 422), err.body  # 400: ObjectMeta could not be decoded
        server = "refused"
    report = validate_documents(documents=[SourceDocument(file="ws.yaml", index=0, body=body)])
    offline = "refused" if report.issues else "accepted"
    assert (why, server) == (why, offline), [i.render() for i in report.issues]
    if report.issues:
        assert all(i.field_path.startswith("metadata") for i in report.issues), [i.render() for i in report.issues]

"""What the API server accepts in a manifest's ``metadata``, as JSON Schema for offline validation.

A CRD's schema says nothing of ``metadata``: the API server decodes it into ObjectMeta (strictly:
an unknown field or a wrong type is refused) and validates it (names, label and annotation keys
and values). :data:`OBJECT_META_SCHEMA` is that, for ``helmhive validate``: the fields a manifest
may set, their types, and Kubernetes' rules for names, namespaces, labels, annotation keys and
finalizers. ``name`` is required: ``kubectl apply`` (and GitOps tools) cannot apply a manifest
with only ``generateName``. Not checked offline (the API server does): the 256 KiB total of a
manifest's annotations, the ``ownerReferences`` rules beyond their required fields, and the shape
of ``managedFields`` entries.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ANNOTATION_KEY", "DNS_SUBDOMAIN", "LABEL_VALUE", "OBJECT_META_SCHEMA", "QUALIFIED_NAME"]

DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
_PREFIX = rf"(?=[^/]{{1,253}}/){DNS_SUBDOMAIN}/"
"""A qualified name's optional prefix: a DNS subdomain of at most 253 characters, then ``/``."""

QUALIFIED_NAME = rf"^({_PREFIX})?{_NAME_PART}$"
"""Kubernetes' ``IsQualifiedName``: label keys and finalizers."""
_ANY_CASE_SUBDOMAIN = r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*"
ANNOTATION_KEY = rf"^((?=[^/]{{1,253}}/){_ANY_CASE_SUBDOMAIN}/)?{_NAME_PART}$"
"""An annotation key: a qualified name once lower-cased, so its prefix may have capitals."""
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_STRING: dict[str, Any] = {"type": "string"}
_TIME: dict[str, Any] = {"type": "string", "format": "date-time"}
_INTEGER: dict[str, Any] = {"type": "integer"}

OBJECT_META_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": f"^{DNS_SUBDOMAIN}$"},
        "generateName": {"type": "string", "maxLength": 253, "pattern": f"^({DNS_SUBDOMAIN})?-?$"},
        "namespace": {"type": "string", "maxLength": 63, "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$"},  # "": unset
        "labels": {
            "type": "object",
            "propertyNames": {"pattern": QUALIFIED_NAME},
            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
        },
        "annotations": {
            "type": "object",
            "propertyNames": {"pattern": ANNOTATION_KEY},
            "additionalProperties": _STRING,
        },
        "finalizers": {"type": "array", "items": {"type": "string", "pattern": QUALIFIED_NAME}},
        "ownerReferences": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["apiVersion", "kind", "name", "uid"],
                "additionalProperties": False,
                "properties": {
                    "apiVersion": {"type": "string", "minLength": 1},
                    "kind": {"type": "string", "minLength": 1},
                    "name": {"type": "string", "minLength": 1},
                    "uid": {"type": "string", "minLength": 1},
                    "controller": {"type": "boolean"},
                    "blockOwnerDeletion": {"type": "boolean"},
                },
            },
        },
        "uid": _STRING,
        "resourceVersion": _STRING,
        "selfLink": _STRING,
        "generation": _INTEGER,
        "deletionGracePeriodSeconds": _INTEGER,
        "creationTimestamp": _TIME,
        "deletionTimestamp": _TIME,
        "managedFields": {"type": "array", "items": {"type": "object"}},
    },
}
"""``metadata`` as the API server takes it from a manifest (nulls are absent, as there)."""

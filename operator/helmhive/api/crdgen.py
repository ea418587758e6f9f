"""Generates structural CustomResourceDefinitions from the pydantic models.

The models are the single source of truth; ``crds/*.yaml`` (and the chart's copy) are
written from :func:`build_crds` and checked for drift. Pydantic's JSON Schema is turned
into the structural OpenAPI v3 subset the API server accepts:

* ``$ref``/``$defs`` are inlined, ``Optional`` (``anyOf`` with null) becomes "not required";
* ``propertyNames`` constraints on maps become CEL rules (structural schemas lack them);
* free-form objects become ``x-kubernetes-preserve-unknown-fields``;
* only scalar defaults are kept, so stored objects stay close to what users wrote.

:func:`build_offline_schema` returns the same schema for ``jsonschema``, with unknown
fields refused, as ``kubectl apply``'s strict field validation does.

This module does no I/O.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from helmhive.api.kinds import CATEGORY, GROUP, KINDS, VERSION, KindDef
from helmhive.api.manifest_yaml import ManifestDumper
from helmhive.api.object_meta import OBJECT_META_SCHEMA

__all__ = [
    "build_crd",
    "build_crds",
    "build_offline_schema",
    "build_openapi_schema",
    "render_crd_yaml",
]

_DROP_KEYS = {"title", "examples"}
_GENERATED_BY = "helmhive crds generate"


class SchemaError(ValueError):
    """A model uses a construct that has no structural-schema equivalent."""


def _cel_string(pattern: str) -> str:
    if "'" in pattern:
        raise SchemaError(f"pattern cannot contain a single quote: {pattern!r}")
    return f"r'{pattern}'"


def _property_names_rule(names: dict[str, Any]) -> dict[str, Any]:
    checks = []
    if "maxLength" in names:
        checks.append(f"size(k) <= {int(names['maxLength'])}")
    if "minLength" in names:
        checks.append(f"size(k) >= {int(names['minLength'])}")
    if "pattern" in names:
        checks.append(f"k.matches({_cel_string(names['pattern'])})")
    if not checks:
        raise SchemaError(f"unsupported propertyNames: {names}")
    return {
        "rule": f"self.all(k, {' && '.join(checks)})",
        "message": "every key must be a valid name" + (f" matching {names['pattern']}" if "pattern" in names else ""),
    }


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline ``$ref`` and single-item ``allOf``, keeping sibling keys."""
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        merged = _resolve(target, defs)
        extra_rules = node.pop("x-kubernetes-validations", [])
        merged = {**merged, **node}
        if extra_rules:
            merged["x-kubernetes-validations"] = [*merged.get("x-kubernetes-validations", []), *extra_rules]
        return merged
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = _resolve(node.pop("allOf")[0], defs)
        return {**inner, **node}
    return node


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise SchemaError(f"unions are not structural: {options}")
        inner = _convert(options[0], defs)
        rules = [*inner.get("x-kubernetes-validations", []), *node.pop("x-kubernetes-validations", [])]
        merged = {**inner, **{k: v for k, v in node.items() if k not in _DROP_KEYS}}
        if rules:
            merged["x-kubernetes-validations"] = rules
        if merged.get("default") is None:
            merged.pop("default", None)
        return merged

    out: dict[str, Any] = {}
    key_rule: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out["properties"] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs)
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out["additionalProperties"] = _convert(value, defs)
        elif key == "patternProperties":
            if len(value) != 1:
                raise SchemaError(f"only one key pattern per map is supported: {list(value)}")
            ((pattern, sub),) = value.items()
            out["additionalProperties"] = _convert(sub, defs)
            key_rule["pattern"] = pattern
        elif key == "propertyNames":
            key_rule.update(value)
        elif key == "x-kubernetes-validations":
            out.setdefault("x-kubernetes-validations", []).extend(value)
        elif key == "default":
            if value is not None and not isinstance(value, dict | list):
                out["default"] = value
        else:
            out[key] = value
    if key_rule:
        out.setdefault("x-kubernetes-validations", []).append(_property_names_rule(key_rule))
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def build_openapi_schema(model: type[Any]) -> dict[str, Any]:
    """Return the structural OpenAPI v3 schema of a pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs)


def _root_schema(kind: KindDef) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string", "description": "APIVersion of this representation."},
        "kind": {"type": "string", "description": "Kind of this representation."},
        "metadata": {"type": "object"},
        "spec": build_openapi_schema(kind.spec),
    }
    if kind.status is not None:
        properties["status"] = build_openapi_schema(kind.status)
    schema: dict[str, Any] = {
        "type": "object",
        "description": kind.description,
        "properties": properties,
        "required": ["spec"] if kind.spec_required else [],
    }
    if kind.root_validations:
        schema["x-kubernetes-validations"] = [dict(v) for v in kind.root_validations]
    return schema


def build_crd(kind: KindDef) -> dict[str, Any]:
    """Return the CustomResourceDefinition for one kind, as a plain dict."""
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": _root_schema(kind)},
        "additionalPrinterColumns": [
            {
                "name": c.name,
                "type": c.type,
                "jsonPath": c.json_path,
                **({"priority": c.priority} if c.priority else {}),
                **({"description": c.description} if c.description else {}),
            }
            for c in kind.columns
        ],
    }
    if kind.status is not None:
        version["subresources"] = {"status": {}}
    if kind.selectable_fields:
        version["selectableFields"] = [{"jsonPath": path} for path in kind.selectable_fields]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": kind.crd_name,
            "labels": {"app.kubernetes.io/name": "helmhive", "app.kubernetes.io/part-of": "helmhive"},
            "annotations": {"helmhive.dev/generated-by": _GENERATED_BY},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if kind.namespaced else "Cluster",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": [CATEGORY],
            },
            "versions": [version],
        },
    }


def build_crds() -> dict[str, dict[str, Any]]:
    """Return every CRD keyed by its file name in ``crds/``."""
    return {f"{k.crd_name}.yaml": build_crd(k) for k in KINDS}


def render_crd_yaml(crd: dict[str, Any]) -> str:
    """Render a CRD as stable YAML with a do-not-edit header."""
    header = f"# Generated by `{_GENERATED_BY}` from helmhive.api; do not edit by hand.\n"
    return header + yaml.dump(crd, sort_keys=False, width=120, allow_unicode=True, Dumper=ManifestDumper)


def _close_objects(node: Any) -> None:
    if isinstance(node, dict):
        if (
            node.get("type") == "object"
            and "properties" in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            _close_objects(value)
    elif isinstance(node, list):
        for value in node:
            _close_objects(value)


def build_offline_schema(kind: KindDef) -> dict[str, Any]:
    """Return the CRD's schema for ``jsonschema``, refusing unknown fields like strict apply does."""
    schema = copy.deepcopy(build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": f"{GROUP}/{VERSION}"}
    schema["properties"]["kind"] = {"const": kind.kind}
    schema["properties"]["metadata"] = copy.deepcopy(OBJECT_META_SCHEMA)
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    _close_objects(schema)
    # Round-trip to plain JSON so enum members and tuples never leak into the validator.
    result: dict[str, Any] = json.loads(json.dumps(schema))
    return result

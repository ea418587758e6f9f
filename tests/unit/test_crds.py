"""The generated CRDs: no drift, structural, bounded everywhere, and examples validate offline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from helmhive.api.crdgen import build_crd, build_offline_schema
from helmhive.api.kinds import KINDS, kind_by_name
from helmhive.cli.crds import decide_drift

REPO = Path(__file__).resolve().parents[2]


def test_generated_files_match_the_models() -> None:
    assert decide_drift(REPO) == []


def test_drift_is_reported_per_file(tmp_path: Path) -> None:
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / "profiles.helmhive.dev.yaml").write_text("# hand edited\n")
    (tmp_path / "crds" / "extra.yaml").write_text("{}\n")
    problems = decide_drift(tmp_path)
    assert "differs: crds/profiles.helmhive.dev.yaml" in problems
    assert "stray: crds/extra.yaml" in problems
    assert "missing: crds/runners.helmhive.dev.yaml" in problems


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if "type" in node or "enum" in node:
            yield path, node
        for key in ("properties",):
            for name, sub in (node.get(key) or {}).items():
                yield from _walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_every_string_list_and_map_is_bounded(kind: Any) -> None:
    root = build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    unbounded = []
    for path, node in _walk(root["properties"]["spec"], "spec"):
        if node.get("type") == "string" and "enum" not in node and "format" not in node and "maxLength" not in node:
            unbounded.append(path)
        if node.get("type") == "array" and "maxItems" not in node:
            unbounded.append(path)
        if isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
            unbounded.append(path)
    assert unbounded == []


FORBIDDEN_KEYWORDS = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "patternProperties", "propertyNames", "title"}


def _schema_keys(node: Any) -> Iterator[str]:
    """Every keyword used by a schema node, but not the property names under ``properties``."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key
            if key == "properties":
                for sub in value.values():
                    yield from _schema_keys(sub)
            elif key in ("items", "additionalProperties"):
                yield from _schema_keys(value)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_schemas_are_structural(kind: Any) -> None:
    root = build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert set(_schema_keys(root)) & FORBIDDEN_KEYWORDS == set()


def test_status_subresource_except_audit_records() -> None:
    for kind in KINDS:
        version = build_crd(kind)["spec"]["versions"][0]
        assert ("subresources" in version) == (kind.kind != "AuditRecord")


def _example_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


@pytest.mark.parametrize(
    ("file", "doc"), _example_docs(), ids=lambda v: v if isinstance(v, str) else v["metadata"]["name"]
)
def test_examples_validate_against_the_generated_schema(file: str, doc: dict[str, Any]) -> None:
    schema = build_offline_schema(kind_by_name(doc["kind"]))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
    assert errors == [], f"{file}: {[e.message for e in errors]}"


def test_offline_schema_reports_field_paths_and_refuses_unknown_fields() -> None:
    schema = build_offline_schema(kind_by_name("MemoryRecord"))
    doc = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "MemoryRecord",
        "metadata": {"name": "m"},
        "spec": {
            "workspace": "w",
            "scope": {"type": "workspace"},
            "kind": "decision",
            "text": "x" * 2001,
            "source": {"type": "adr", "url": "https://example.com"},
            "sensitivity": "internal",
            "colour": "blue",
        },
    }
    errors = {
        ".".join(map(str, e.absolute_path)): e.validator
        for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)
    }
    assert errors == {"spec.text": "maxLength", "spec": "additionalProperties"}

"""What fuzzing found in ``helmhive validate``, pinned: each case disagreed with the API server or crashed.

* ``payments\\n`` passed the name pattern offline (Python's ``$`` matches before a final newline;
  the API server's RE2 does not), and the text output then printed an issue over two lines.
* A null optional field was refused offline; the API server prunes it and accepts the object.
* ``2027-01-15`` passed as a date-time offline (pydantic parses it); the API server refuses it.
  The other way round, the API server's date-time takes ``…ZTjunk`` and a ``+25:00`` offset,
  which the operator cannot parse: the CRD's pattern now refuses those too.
* YAML nested thousands of levels deep crashed the command with a RecursionError.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from helmhive.api.crdgen import build_crd
from helmhive.api.kinds import kind_by_name
from helmhive.cli.main import app
from helmhive.policy.validation.apiserver import is_api_date_time
from helmhive.policy.validation.manifests import SourceDocument, validate_documents

from .mutants import example_set, go_pattern


def _seed(name: str) -> dict[str, Any]:
    return copy.deepcopy(next(d for d in example_set() if d["metadata"]["name"] == name))


def _issues(doc: dict[str, Any]) -> list[tuple[str, str]]:
    report = validate_documents(documents=[SourceDocument(file="x.yaml", body=doc)])
    return [(i.field_path, i.reason.value) for i in report.issues if i.reason.value != "ProfileNotFound"]


@pytest.mark.parametrize("field", ["metadata.name", "spec.workspace", "spec.source.commit"])
def test_a_final_newline_does_not_pass_a_pattern(field: str) -> None:
    doc = _seed("refund-idempotency")
    parent: Any = doc
    *path, last = field.split(".")
    for key in path:
        parent = parent[key]
    parent[last] += "\n"
    assert (field, "InvalidSpec") in _issues(doc)


def test_an_issue_is_one_line_in_text_output_whatever_the_name_holds(tmp_path: Path) -> None:
    doc = _seed("check-anthropic-login")
    doc["metadata"]["name"] = "bad\nname"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    lines = [line for line in result.stdout.splitlines() if line]
    assert len(lines) == 1 and "AgentJob/bad\\nname: metadata.name: InvalidSpec" in lines[0], lines


def test_null_optional_fields_are_absent_as_the_api_server_prunes_them() -> None:
    profile = _seed("suggest-policy")
    profile["spec"]["memory"]["enabled"] = None
    profile["spec"]["instructions"] = None
    assert _issues(profile) == []
    profile["spec"]["purpose"] = None  # required: pruned, then missing
    assert _issues(profile) == [("spec.purpose", "InvalidSpec")]
    profile["spec"]["purpose"] = "p"
    profile["spec"]["providerMappings"].append(None)  # a list item is not a field: it stays and is refused
    assert ("spec.providerMappings[1]", "InvalidSpec") in _issues(profile)


@pytest.mark.parametrize(
    ("text", "api_server"),
    [
        ("2027-01-15T00:00:00Z", True),
        ("2027-01-15t00:00:00.5+01:00", True),
        ("2027-01-15T00:00:00ZTjunk", True),
        ("2027-01-15", False),
        ("2027-01-15 00:00", False),
        ("2027-01-15T00:00:00", False),
        ("1700000000", False),
        ("2027-02-30T00:00:00Z", False),
        ("2027-01-15T24:00:00Z", False),
    ],
)
def test_date_times_are_read_as_the_api_server_reads_them(text: str, api_server: bool) -> None:
    assert is_api_date_time(text) is api_server


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("2027-01-15T00:00:00Z", True),
        ("2027-01-15T00:00:00.123+05:30", True),
        ("2027-01-15", False),
        ("2027-01-15T00:00:00ZTjunk", False),
        ("2027-01-15T00:00:00+25:00", False),
        ("2027-01-15T00:00:00x5Z", False),
    ],
)
def test_a_time_in_a_spec_is_one_the_operator_can_parse(text: str, valid: bool) -> None:
    record = _seed("api-freeze-q4")
    record["spec"]["expiresAt"] = text
    assert (_issues(record) == []) is valid
    audit = _seed("job-routed-check-anthropic-login")
    audit["spec"]["time"] = text
    assert (_issues(audit) == []) is valid


def test_the_crds_carry_the_time_pattern_to_the_api_server() -> None:
    for kind, field in (("MemoryRecord", "expiresAt"), ("AuditRecord", "time")):
        node = build_crd(kind_by_name(kind))["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        pattern = node["properties"]["spec"]["properties"][field]["pattern"]
        assert go_pattern(pattern).search("2027-01-15T00:00:00Z") and not go_pattern(pattern).search("2027-01-15")


def test_yaml_nested_too_deeply_is_an_issue_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 50000 + "]" * 50000, encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path), "-o", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1 and '"InvalidYaml"' in result.stdout


def test_a_key_that_is_a_digit_but_not_a_number_is_a_field_not_a_crash(tmp_path: Path) -> None:
    """``"²".isdigit()`` is true, ``int("²")`` fails: finding the line of ``spec[²]`` crashed the command."""
    doc = _seed("check-anthropic-login")
    doc["spec"]["²"] = None
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path), "-o", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    issues = json.loads(result.stdout)["issues"]
    assert result.exit_code == 1 and [(i["fieldPath"], i["reason"]) for i in issues] == [("spec[²]", "UnknownField")]
    assert issues[0]["line"] >= 1
    text = CliRunner().invoke(app, ["validate", str(path)])
    assert text.exception is None or isinstance(text.exception, SystemExit), text.exception
    assert text.exit_code == 1 and "spec[²]: UnknownField" in text.stdout

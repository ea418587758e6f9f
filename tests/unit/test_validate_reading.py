"""``helmhive validate`` reads what kubectl sends: JSON streams, each file once, broken links, metadata."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from helmhive.api.manifest_yaml import JsonStreamError, load_json_stream
from helmhive.cli.main import app

API = "helmhive.dev/v1alpha1"
REPO = Path(__file__).resolve().parents[2]


def workspace(name: str = "w", **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Workspace",
        "metadata": {"name": name, **metadata},
        "spec": {"repository": {"url": "https://git.example.com/r.git"}},
    }


def run(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["validate", *args, "-o", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    payload: dict[str, Any] = json.loads(result.stdout)
    return result.exit_code, payload


def issues(payload: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(Path(i["file"]).name, i["fieldPath"], i["reason"]) for i in payload["issues"]]


def test_json_indented_with_tabs_is_read_as_json_with_its_lines(tmp_path: Path) -> None:
    doc = workspace()
    doc["spec"]["unknown"] = 1
    path = tmp_path / "ws.json"
    path.write_text(json.dumps(doc, indent="\t"), encoding="utf-8")
    code, payload = run(str(path))
    assert code == 1
    (issue,) = payload["issues"]
    assert (issue["fieldPath"], issue["reason"]) == ("spec.unknown", "UnknownField")
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if '"unknown"' in text)
    assert issue["line"] == line


def test_a_stream_of_json_objects_and_numbers_as_kubectl_sends_them() -> None:
    assert load_json_stream('{"a": 1e3, "b": 1.5}\n {"c": 18446744073709551615}') == [
        {"a": 1000, "b": 1.5},
        {"c": 18446744073709552000},
    ]
    for bad in ('{"a": NaN}', '{"a": Infinity}', '{"a": 1e400}', '{"a": 1', '{"a": "x\ty"}'):
        with pytest.raises(JsonStreamError, match="JSON"):
            load_json_stream(bad)


def test_json_that_is_not_json_is_refused_with_its_place(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n\t"apiVersion": NaN\n}\n', encoding="utf-8")
    code, payload = run(str(path))
    assert code == 1 and issues(payload) == [("bad.json", "", "InvalidYaml")]
    assert "NaN is not JSON" in payload["issues"][0]["message"]


@pytest.mark.skipif(os.name != "posix", reason="symbolic links")
def test_broken_links_in_a_folder_are_reported_not_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "ws.yaml").write_text(json.dumps(workspace()), encoding="utf-8")
    (folder / "dangling.yaml").symlink_to(tmp_path / "nowhere.yaml")
    (folder / "loop1.yaml").symlink_to(folder / "loop2.yaml")
    (folder / "loop2.yaml").symlink_to(folder / "loop1.yaml")
    code, payload = run(str(folder))
    assert code == 1
    assert sorted(issues(payload)) == [
        ("dangling.yaml", "", "UnreadableFile"),
        ("loop1.yaml", "", "UnreadableFile"),
        ("loop2.yaml", "", "UnreadableFile"),
    ]
    assert all("symbolic link that leads nowhere" in i["message"] for i in payload["issues"])
    assert payload["objects"] == 1
    code, payload = run(str(folder / "loop1.yaml"))
    assert code == 1 and "Too many levels of symbolic links" in payload["issues"][0]["message"]


def test_a_file_named_twice_is_read_once(tmp_path: Path) -> None:
    code, payload = run(str(REPO / "examples"), str(REPO / "examples" / "." / "agentjob.yaml"))
    alone_code, alone = run(str(REPO / "examples"))
    assert (code, payload["files"], payload["objects"]) == (alone_code, alone["files"], alone["objects"])
    assert code == 0, payload["issues"]


@pytest.mark.parametrize(
    ("metadata", "path", "reason"),
    [
        ({"labels": {"tier": ["gold"]}}, "metadata.labels.tier", "InvalidSpec"),
        ({"annotations": {"replicas": 5}}, "metadata.annotations.replicas", "InvalidSpec"),
        ({"labels": {"bad key!": "v"}}, "metadata.labels", "InvalidSpec"),
        ({"labels": {"tier": "gold plated"}}, "metadata.labels.tier", "InvalidSpec"),
        ({"namespace": "Team_A"}, "metadata.namespace", "InvalidSpec"),
        ({"finalizers": ["bad name"]}, "metadata.finalizers[0]", "InvalidSpec"),
        ({"lables": {"tier": "gold"}}, "metadata.lables", "UnknownField"),
    ],
)
def test_metadata_the_api_server_refuses_is_refused(
    tmp_path: Path, metadata: dict[str, Any], path: str, reason: str
) -> None:
    # tests/operator/test_metadata_agreement.py sends the same kinds of edge to the API server.
    file = tmp_path / "ws.yaml"
    file.write_text(json.dumps(workspace(**metadata)), encoding="utf-8")
    code, payload = run(str(file))
    assert (code, issues(payload)) == (1, [("ws.yaml", path, reason)])


def test_metadata_the_api_server_takes_is_taken(tmp_path: Path) -> None:
    meta = {
        "labels": {"app.kubernetes.io/part-of": "payments", "tier": ""},
        "annotations": {"Example.com/Owner": "Team A: payments"},
        "finalizers": ["example.com/cleanup"],
        "namespace": "team-a",
    }
    file = tmp_path / "ws.yaml"
    file.write_text(json.dumps(workspace(**meta)), encoding="utf-8")
    code, payload = run(str(file))
    assert (code, payload["issues"], payload["objects"]) == (0, [], 1)


CANARY = "sk-ant-api03-CANARY+validate/echo"


@pytest.mark.parametrize(
    ("credential", "path"),
    [
        ({"secretRef": {"name": "k", "key": CANARY}}, "spec.credential.secretRef.key"),
        ({"secretRef": {"name": CANARY, "key": "api-key"}}, "spec.credential.secretRef.name"),
        ({"secretRef": {"name": "k"}, "envName": CANARY}, "spec.credential.envName"),
    ],
)
def test_a_value_pasted_where_a_secrets_name_goes_is_not_echoed(
    tmp_path: Path, credential: dict[str, Any], path: str
) -> None:
    # A key pasted into the field for its Secret's name would otherwise reach the CI log.
    pool = {
        "apiVersion": API,
        "kind": "RunnerPool",
        "metadata": {"name": "p"},
        "spec": {
            "provider": "anthropic",
            "adapter": {"type": "claude-cli"},
            "image": "ghcr.io/helmhive/runner:0.1.0",
            "credential": credential,
        },
    }
    file = tmp_path / "pool.yaml"
    file.write_text(json.dumps(pool), encoding="utf-8")
    for output in ("json", "text"):
        result = CliRunner().invoke(app, ["validate", str(file), "-o", output])
        assert result.exit_code == 1, result.output
        assert CANARY not in result.output and "CANARY" not in result.output
        assert path in result.output


def test_json_that_fails_early_is_read_as_yaml_from_there_as_kubectl_does(tmp_path: Path) -> None:
    # apimachinery's YAMLOrJSONDecoder: when the first or second object is not JSON, the rest is YAML.
    good = json.dumps(workspace("one"))
    trailing_comma = json.dumps(workspace("two"))[:-1] + ",}"  # not JSON; YAML takes a trailing comma
    path = tmp_path / "stream.json"
    path.write_text(f"{good}\n{trailing_comma}\n", encoding="utf-8")
    code, payload = run(str(path))
    assert (code, payload["objects"], payload["issues"]) == (0, 2, [])
    # A third object that fails: by then kubectl is reading JSON only, and so is validate.
    path.write_text(f"{good}\n{json.dumps(workspace('two'))}\n{trailing_comma}\n", encoding="utf-8")
    code, payload = run(str(path))
    assert code == 1 and issues(payload) == [("stream.json", "", "InvalidYaml")]
    assert payload["issues"][0]["message"].startswith("line 3, column")

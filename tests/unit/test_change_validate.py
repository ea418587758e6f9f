"""``helmhive validate`` on Changes: the exact source must be a full commit id; the new fields are bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helmhive.cli.main import app

API = "helmhive.dev/v1alpha1"


def change(commit: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": API,
        "kind": "Change",
        "metadata": {"name": "c"},
        "spec": {
            "workspace": "shop",
            "request": {"title": "t", "description": "d"},
            "criteria": ["works"],
            "source": {"repository": "https://example.com/shop.git", "commit": commit},
            **spec,
        },
    }


def validate(tmp_path: Path, doc: dict[str, object]) -> tuple[int, str]:
    path = tmp_path / "change.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


@pytest.mark.parametrize(
    "commit",
    [
        "main",
        "v1.2.0",
        "4b825dc",
        "4B825DC642CB6EB9A060E54BF8D69288FBEE4904",
        "4b825dc642cb6eb9a060e54bf8d69288fbee490",
    ],
)
def test_a_branch_tag_or_short_or_uppercase_commit_is_refused_with_its_field_path(tmp_path: Path, commit: str) -> None:
    code, out = validate(tmp_path, change(commit))
    assert code == 1
    assert "Change/c: spec.source.commit: InvalidSpec:" in out
    assert "never a branch, tag or short id" in out


@pytest.mark.parametrize("commit", ["4b825dc642cb6eb9a060e54bf8d69288fbee4904", "a" * 64])
def test_a_full_sha1_or_sha256_commit_passes_the_schema(tmp_path: Path, commit: str) -> None:
    code, out = validate(tmp_path, change(commit))
    assert "spec.source.commit" not in out, out
    assert code == 0, out


def test_approval_iterations_and_checks_are_checked_with_field_paths(tmp_path: Path) -> None:
    doc = change(
        "a" * 40,
        approval="Sometimes",
        maxIterations=4,
        checks=[{"name": "Bad Name", "command": []}],
    )
    code, out = validate(tmp_path, doc)
    assert code == 1
    for path in ("spec.approval", "spec.maxIterations", "spec.checks[0].name", "spec.checks[0].command"):
        assert f"Change/c: {path}:" in out, out


def test_an_approval_must_name_a_plan_digest(tmp_path: Path) -> None:
    code, out = validate(tmp_path, change("a" * 40, approvedPlan={"digest": "abc", "by": "alice"}))
    assert code == 1 and "spec.approvedPlan.digest" in out


@pytest.mark.parametrize(
    "url",
    ["https://user:secret@git.example.com/a.git", "ssh://git.example.com/a.git", "file:///srv/a.git", "/srv/a.git"],
)
def test_a_repository_with_credentials_or_another_scheme_is_refused(tmp_path: Path, url: str) -> None:
    doc = change("a" * 40)
    doc["spec"]["source"]["repository"] = url  # type: ignore[index]
    code, out = validate(tmp_path, doc)
    assert code == 1 and "spec.source.repository" in out and "no credentials" in out
    assert "secret@" not in out.split("does not match")[-1]


@pytest.mark.parametrize("url", ["https://git.example.com/acme/payments.git", "git://127.0.0.1:9418/shop.git"])
def test_an_https_or_git_url_is_accepted(tmp_path: Path, url: str) -> None:
    doc = change("a" * 40)
    doc["spec"]["source"]["repository"] = url  # type: ignore[index]
    code, out = validate(tmp_path, doc)
    assert code == 0, out

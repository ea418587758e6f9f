"""``helmhive validate`` on fuzzed manifests: it accepts or refuses with field paths, and never crashes.

The mutants (:mod:`fuzz.mutants`) start from the shipped examples. Each is validated inside the
whole example set (so references between objects count), through the pure rule book and through
the real command line (``-o json`` and text). A targeted mutant must be refused at its path with
one of its reasons; a random one only has to get an answer. Raw YAML text, cut and garbled, goes
through the command line too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from helmhive.api.manifest_yaml import ManifestDumper
from helmhive.api.reasons import Reason
from helmhive.cli.main import app
from helmhive.policy.validation.manifests import SourceDocument, ValidationIssue, validate_documents
from helmhive.policy.violations import split_field_path

from .budget import Tally, fuzz_settings
from .mutants import CROSS_OBJECT, EXAMPLES, Mutant, example_set, mutants, seed_key, targeted, wrong_reference

ROOTS = {"apiVersion", "kind", "metadata", "spec", "status"}


def validate_in_set(mutant: Mutant) -> list[ValidationIssue]:
    """Validate the example set with ``mutant`` in place of its seed; return the mutant's issues."""
    docs = [mutant.body if seed_key(d) == mutant.seed else d for d in example_set()]
    report = validate_documents(documents=[SourceDocument(file=f"d{i}.yaml", body=d) for i, d in enumerate(docs)])
    index = next(i for i, d in enumerate(example_set()) if seed_key(d) == mutant.seed)
    # Another object may only suffer through its references to the mutant (a renamed profile, say).
    others = [i for i in report.issues if i.file != f"d{index}.yaml" and i.reason not in CROSS_OBJECT]
    assert not others, f"{mutant.describe()}: issues reported against other objects: {others}"
    return [i for i in report.issues if i.file == f"d{index}.yaml"]


def under(issue_path: str, expected: str) -> bool:
    """Whether ``issue_path`` is ``expected`` or a field inside it."""
    got, want = split_field_path(issue_path), split_field_path(expected)
    return got[: len(want)] == want


def check_issues(mutant: Mutant, issues: list[ValidationIssue]) -> None:
    for issue in issues:
        assert isinstance(issue.reason, Reason), issue
        assert issue.message, issue
        if mutant.body is None or not isinstance(mutant.body, dict):
            continue
        if issue.reason not in (Reason.INVALID_DOCUMENT, Reason.WRONG_API_VERSION, Reason.UNKNOWN_KIND):
            segments = split_field_path(issue.field_path)
            assert issue.field_path and segments, f"{mutant.describe()}: no field path in {issue}"
            # An unknown field at the top is named by itself; anything else lies under a known root.
            assert issue.reason is Reason.UNKNOWN_FIELD or segments[0] in ROOTS, f"{mutant.describe()}: {issue}"
    for expect in mutant.expect:
        matching = [i for i in issues if under(i.field_path, expect.path) and i.reason in expect.reasons]
        assert matching, (
            f"{mutant.describe()}: expected {sorted(r.value for r in expect.reasons)} at {expect.path}, got "
            + "; ".join(f"{i.field_path}: {i.reason.value}: {i.message}" for i in issues)
        )
    not_over = mutant.notes.get("not_over")
    if not_over:
        assert not [i for i in issues if i.field_path == not_over and i.reason is Reason.OVER_LIMIT], (
            f"{mutant.describe()}: a value at its bound is over the limit: {issues}"
        )


def test_every_seed_is_valid_alone_and_together() -> None:
    docs = example_set()
    report = validate_documents(documents=[SourceDocument(file=f"d{i}.yaml", body=d) for i, d in enumerate(docs)])
    assert report.ok, report.issues
    assert {d["kind"] for d in docs} >= {
        "Envelope",
        "Profile",
        "MemoryRecord",
        "Workspace",
        "RunnerPool",
        "Runner",
        "AgentJob",
        "Change",
        "SessionBinding",
        "AuditRecord",
    }


def test_mutants_are_accepted_or_refused_with_field_paths() -> None:
    tally = Tally("validate: rule book, mutants in the example set")

    @fuzz_settings(500)
    @given(mutant=st.one_of(mutants(), wrong_reference()))
    def run(mutant: Mutant) -> None:
        issues = validate_in_set(mutant)
        check_issues(mutant, issues)
        tally.add("tried")
        tally.add("refused" if issues else "accepted")
        tally.add("targeted" if mutant.expect else "untargeted")

    run()
    assert tally.report()["tried"] > 0


def _write(path: Path, docs: list[Any]) -> Path:
    # As a user would write it for kubectl: a string that kubectl reads as something else is quoted.
    path.write_text(yaml.dump_all(docs, sort_keys=False, allow_unicode=True, Dumper=ManifestDumper), encoding="utf-8")
    return path


def test_the_command_answers_every_mutant_in_json_and_text(tmp_path_factory: pytest.TempPathFactory) -> None:
    tally = Tally("validate: command line, -o json and text")

    @fuzz_settings(100)
    @given(mutant=st.one_of(targeted(example_set()), mutants()))
    def run(mutant: Mutant) -> None:
        folder = tmp_path_factory.mktemp("cli")
        docs = [mutant.body if seed_key(d) == mutant.seed else d for d in example_set()]
        path = _write(folder / "set.yaml", docs)
        runner = CliRunner()
        result = runner.invoke(app, ["validate", str(path), "-o", "json"])
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            mutant.describe(),
            result.exception,
        )
        payload = json.loads(result.stdout)
        assert result.exit_code == (0 if payload["valid"] else 1), (mutant.describe(), result.exit_code)
        for issue in payload["issues"]:
            assert issue["reason"] in {r.value for r in Reason} and issue["message"], issue
            assert issue["fieldPath"] or issue["reason"] in ("InvalidDocument", "WrongApiVersion", "UnknownKind"), issue
            assert isinstance(issue["line"], int) and issue["line"] >= 1, issue
        text = runner.invoke(app, ["validate", str(path)])
        assert text.exception is None or isinstance(text.exception, SystemExit), (mutant.describe(), text.exception)
        assert text.exit_code == result.exit_code
        assert "Traceback" not in text.output
        assert len([line for line in text.stdout.splitlines() if line]) == len(payload["issues"])
        for expect in mutant.expect:
            assert any(under(i["fieldPath"], expect.path) for i in payload["issues"]), (mutant.describe(), payload)
        tally.add("tried")
        tally.add("refused" if result.exit_code else "accepted")

    run()
    assert tally.report()["tried"] > 0


def _garble(text: str, data: st.DataObject) -> str:
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        where = data.draw(st.integers(min_value=0, max_value=len(text)))
        action = data.draw(st.sampled_from(["cut", "insert", "repeat", "truncate", "nest", "tab"]))
        if action == "cut":
            text = text[:where] + text[where + data.draw(st.integers(1, 40)) :]
        elif action == "insert":
            junk = data.draw(st.text(alphabet=st.sampled_from(list("ab:-[]{}'\"&*!|>#%@ \n\t,?0.~")), max_size=20))
            text = text[:where] + junk + text[where:]
        elif action == "repeat":
            text = text[:where] + text[where : where + 60] * data.draw(st.integers(2, 5)) + text[where:]
        elif action == "truncate":
            text = text[:where]
        elif action == "nest":
            depth = data.draw(st.sampled_from([10, 100, 2000, 20000]))
            text = text[:where] + "[" * depth + "]" * depth + text[where:]
        else:
            text = text[:where] + "\t" + text[where:]
    return text


def test_garbled_yaml_text_never_crashes_the_command(tmp_path_factory: pytest.TempPathFactory) -> None:
    tally = Tally("validate: command line, garbled YAML text")

    @fuzz_settings(150)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        source = data.draw(st.sampled_from(sorted(EXAMPLES.glob("*.yaml"))))
        text = _garble(source.read_text(encoding="utf-8"), data)
        path = tmp_path_factory.mktemp("text") / source.name
        path.write_text(text, encoding="utf-8")
        result = CliRunner().invoke(app, ["validate", str(path), "-o", "json"])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        assert result.exit_code in (0, 1)
        payload = json.loads(result.stdout)
        assert payload["valid"] == (result.exit_code == 0)
        tally.add("tried")
        tally.add("refused" if result.exit_code else "accepted")

    run()
    assert tally.report()["tried"] > 0


@pytest.mark.parametrize("depth", [100, 5000, 100000])
def test_the_real_program_reports_deep_nesting_without_a_traceback(tmp_path: Path, depth: int) -> None:
    """The installed entry point, as CI runs it: exit 1 with a reason, never a Python traceback."""
    path = tmp_path / "deep.yaml"
    path.write_text(
        "apiVersion: helmhive.dev/v1alpha1\nkind: Workspace\nmetadata:\n  name: deep\nspec:\n  x: "
        + "[" * depth
        + "]" * depth
        + "\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "helmhive", "validate", str(path), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-2000:]
    assert done.returncode == 1, done.stderr[-2000:]
    issues = json.loads(done.stdout)["issues"]
    assert issues and all(i["reason"] and i["message"] for i in issues)

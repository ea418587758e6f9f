"""``helmhive validate``: the real command on real files, good and bad, and the docs' examples."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from helmhive.api.common import JobKind
from helmhive.api.crdgen import build_crds
from helmhive.api.reasons import Reason
from helmhive.cli.main import app
from helmhive.cli.validate import load_documents
from helmhive.policy.envelopes import ENVELOPES
from helmhive.policy.validation.manifests import SourceDocument, cel_rule_supported, validate_documents

REPO = Path(__file__).resolve().parents[2]
API = "helmhive.dev/v1alpha1"
LINE = re.compile(r"^(?P<file>[^:]+):(?P<kind>[^/]+)/(?P<name>[^:]+): (?P<path>\S+): (?P<reason>\w+): (?P<msg>.+)$")


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def found(self) -> set[tuple[str, str, str]]:
        """(kind/name, field path, reason) of every issue line."""
        out = set()
        for line in self.stdout.splitlines():
            m = LINE.match(line)
            assert m, f"not an issue line: {line!r}"
            out.add((f"{m['kind']}/{m['name']}", m["path"], m["reason"]))
        return out


def cli(*args: str) -> Outcome:
    result = CliRunner().invoke(app, ["validate", *args])
    # Bad input is reported, never raised: the only exception is typer's exit.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def write(path: Path, *docs: dict[str, Any] | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = [d if isinstance(d, str) else yaml.safe_dump(d, sort_keys=False) for d in docs]
    path.write_text("---\n".join(parts), encoding="utf-8")
    return path


def obj(kind: str, name: str, spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name, **metadata}, "spec": spec}


def profile(name: str, envelope: str, **spec: Any) -> dict[str, Any]:
    return obj(
        "Profile",
        name,
        {"envelope": envelope, "purpose": "p", "providerMappings": [{"provider": "anthropic"}], **spec},
    )


def workspace(name: str = "shop", bindings: dict[str, str] | None = None, **metadata: Any) -> dict[str, Any]:
    return obj(
        "Workspace",
        name,
        {
            "repository": {"url": "https://example.com/shop.git"},
            "services": [{"name": "api"}, {"name": "ledger"}],
            "profiles": [{"jobKind": k, "profile": p} for k, p in (bindings or {}).items()],
        },
        **metadata,
    )


def memory(name: str, *, service: str | None = None, text: str = "Use integer cents.") -> dict[str, Any]:
    return obj(
        "MemoryRecord",
        name,
        {
            "workspace": "shop",
            "scope": {"type": "service", "service": service} if service else {"type": "workspace"},
            "kind": "constraint",
            "text": text,
            "source": {"type": "adr", "url": "https://example.com/adr/1"},
            "sensitivity": "internal",
        },
    )


def job(name: str, *, kind: str = "review-probe", **spec: Any) -> dict[str, Any]:
    return obj(
        "AgentJob",
        name,
        {"workspace": "shop", "jobKind": kind, "request": {"title": "t", "prompt": "p"}, **spec},
    )


def change(name: str, **spec: Any) -> dict[str, Any]:
    return obj(
        "Change",
        name,
        {
            "workspace": "shop",
            "request": {"title": "t", "description": "d"},
            "criteria": ["it works"],
            "source": {"repository": "https://example.com/shop.git", "commit": "a" * 40},
            **spec,
        },
    )


GOVERNED = {
    "change-planning": "plan",
    "change-implementation": "implement",
    "change-review": "review",
}


def good_set() -> list[dict[str, Any]]:
    return [
        workspace(bindings={**GOVERNED, "review-probe": "quick-review"}),
        profile("plan", "change-planning"),
        profile("implement", "change-implementation", tools=["read", "edit"]),
        profile("review", "change-review", filesystem="read"),
        profile("quick-review", "review-probe", memory={"enabled": True}),
        memory("cents"),
        memory("ledger-append-only", service="ledger"),
        job("check", service="api"),
        change("refunds", service="api"),
    ]


# --- good input ---------------------------------------------------------------------------------


def test_the_shipped_examples_are_valid() -> None:
    outcome = cli(str(REPO / "examples"))
    assert outcome.exit_code == 0, outcome.stdout
    assert outcome.stdout == ""
    assert re.search(r"^\d+ Helmhive objects in \d+ files are valid$", outcome.stderr, re.M)


def test_a_consistent_set_is_valid(tmp_path: Path) -> None:
    path = write(tmp_path / "set.yaml", *good_set())
    outcome = cli(str(path))
    assert (outcome.exit_code, outcome.stdout) == (0, "")
    assert "9 Helmhive objects in 1 files are valid" in outcome.stderr


def test_directories_are_searched_recursively_skipping_hidden_ones(tmp_path: Path) -> None:
    write(tmp_path / "a" / "b" / "p.yml", profile("p", "connection-test"))
    write(tmp_path / ".git" / "x.yaml", "not: [valid")
    write(tmp_path / "notes.txt", "ignored")
    outcome = cli(str(tmp_path))
    assert outcome.exit_code == 0
    assert "1 Helmhive objects in 1 files are valid" in outcome.stderr


def test_foreign_objects_and_non_manifests_are_skipped_not_failed(tmp_path: Path) -> None:
    path = write(
        tmp_path / "mixed.yaml",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}},
        {"apiVersion": "kubeflow.org/v1", "kind": "Profile", "metadata": {"name": "kf"}},
        {"name": "ci", "on": ["pull_request"], "jobs": {}},
        profile("p", "connection-test"),
    )
    outcome = cli(str(path))
    assert outcome.exit_code == 0, outcome.stdout
    assert "skipped" in outcome.stderr and "v1 Secret" in outcome.stderr
    assert "not a Kubernetes object" in outcome.stderr


# --- schema ---------------------------------------------------------------------------------------


def test_schema_errors_have_field_paths_and_reasons(tmp_path: Path) -> None:
    bad = profile("p", "review-probe", tolls=["read"])
    bad["spec"]["providerMappings"] = [{"provider": "Anthropic!"}]
    long_memory = memory("long", text="x" * 2001)
    del long_memory["spec"]["sensitivity"]
    path = write(tmp_path / "bad.yaml", bad, long_memory, workspace(bindings={}))
    outcome = cli(str(path))
    assert outcome.exit_code == 1
    assert outcome.found == {
        ("Profile/p", "spec.tolls", "UnknownField"),
        ("Profile/p", "spec.providerMappings[0].provider", "InvalidSpec"),
        ("MemoryRecord/long", "spec.text", "OverLimit"),
        ("MemoryRecord/long", "spec.sensitivity", "InvalidSpec"),
    }
    assert "2001 characters; at most 2000 allowed" in outcome.stdout


def test_create_time_cel_rules_are_checked_offline(tmp_path: Path) -> None:
    record = memory("m")
    record["spec"]["scope"] = {"type": "service"}
    pool = obj(
        "RunnerPool",
        "pool",
        {
            "provider": "anthropic",
            "adapter": {"type": "claude-cli", "acp": {"command": "agent"}},
            "image": "helmhive/runner:dev",
            "credential": {"secretRef": {"name": "key"}, "volume": {"claimName": "c", "mountPath": "/home"}},
        },
    )
    bad_label = profile("p", "review-probe", requiredLabels={"not a key!": "x"})
    outcome = cli(str(write(tmp_path / "cel.yaml", record, pool, bad_label)))
    assert outcome.found == {
        ("MemoryRecord/m", "spec.scope", "InvalidSpec"),
        ("RunnerPool/pool", "spec.adapter", "InvalidSpec"),
        ("RunnerPool/pool", "spec.credential", "InvalidSpec"),
        ("Profile/p", "spec.requiredLabels", "InvalidSpec"),
    }
    assert "credential needs exactly one of secretRef or volume" in outcome.stdout


@pytest.mark.parametrize(
    ("claude_cli", "problem"),
    [
        (
            {"models": ["sonnet"], "defaultModel": "opus"},
            {("RunnerPool/pool", "spec.adapter.claudeCli.defaultModel", "InvalidSpec")},
        ),
        ({"models": ["sonnet", "claude-sonnet-5-5"], "defaultModel": "sonnet"}, set()),
        ({"defaultModel": "opus"}, set()),
    ],
)
def test_a_claude_cli_default_outside_the_pinned_models_is_refused_offline(
    tmp_path: Path, claude_cli: dict[str, Any], problem: set[tuple[str, str, str]]
) -> None:
    spec = {
        "provider": "anthropic",
        "adapter": {"type": "claude-cli", "claudeCli": claude_cli},
        "image": "helmhive/runner:dev",
        "credential": {"secretRef": {"name": "key"}},
    }
    outcome = cli(str(write(tmp_path / "pool.yaml", obj("RunnerPool", "pool", spec))))
    assert outcome.found == problem, outcome.stdout
    if problem:
        assert "defaultModel must be one of models" in outcome.stdout


def test_every_cel_rule_in_the_crds_is_understood_offline() -> None:
    rules: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            rules.extend(r["rule"] for r in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(build_crds())
    assert len(rules) > 10
    assert [r for r in rules if not cel_rule_supported(r)] == []
    assert not cel_rule_supported("self.size() > 2")


def test_keyed_lists_must_not_repeat_a_key(tmp_path: Path) -> None:
    ws = workspace(bindings={"review-probe": "a"})
    ws["spec"]["services"].append({"name": "api"})
    ws["spec"]["profiles"].append({"jobKind": "review-probe", "profile": "b"})
    outcome = cli(str(write(tmp_path / "ws.yaml", ws)))
    assert outcome.found == {
        ("Workspace/shop", "spec.services[2]", "InvalidSpec"),
        ("Workspace/shop", "spec.profiles[1]", "InvalidSpec"),
    }


def test_model_only_rules_are_reported_after_the_schema(tmp_path: Path) -> None:
    record = memory("m")
    record["spec"]["expiresAt"] = "next tuesday"
    outcome = cli(str(write(tmp_path / "m.yaml", record)))
    assert outcome.found == {("MemoryRecord/m", "spec.expiresAt", "InvalidSpec")}


def test_unquoted_timestamps_are_strings_as_kubectl_reads_them(tmp_path: Path) -> None:
    text = yaml.safe_dump(memory("m"), sort_keys=False) + "  expiresAt: 2027-01-15T00:00:00Z\n"
    outcome = cli(str(write(tmp_path / "ts.yaml", text)))
    assert outcome.exit_code == 0, outcome.stdout


# --- documents that are not objects ------------------------------------------------------------------


def test_broken_documents_are_reported_with_reason_names(tmp_path: Path) -> None:
    write(tmp_path / "syntax.yaml", profile("ok", "connection-test"), "spec: [unclosed\n")
    write(
        tmp_path / "kinds.yaml",
        {"apiVersion": "helmhive.dev/v1beta1", "kind": "Profile", "metadata": {"name": "old"}},
        {"apiVersion": API, "kind": "Profle", "metadata": {"name": "typo"}},
        {"apiVersion": "v1alpha1", "kind": "Workspace", "metadata": {"name": "nogroup"}},
        {"apiVersion": API, "metadata": {"name": "nokind"}},
        "- just\n- a list\n",
    )
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00bad")
    outcome = cli(str(tmp_path), str(tmp_path / "missing.yaml"))
    assert outcome.exit_code == 1
    assert outcome.found == {
        ("?/#1", "-", "UnreadableFile"),
        ("?/#2", "-", "InvalidYaml"),
        ("Profile/old", "apiVersion", "WrongApiVersion"),
        ("Profle/typo", "kind", "UnknownKind"),
        ("Workspace/nogroup", "apiVersion", "WrongApiVersion"),
        ("?/nokind", "kind", "InvalidDocument"),
        ("?/#5", "-", "InvalidDocument"),
    }
    lines = outcome.stdout.splitlines()
    assert any(line.startswith(f"{tmp_path / 'missing.yaml'}:") for line in lines)
    assert any(line.startswith(f"{tmp_path / 'binary.yaml'}:") for line in lines)
    assert any("syntax.yaml:?/#2: -: InvalidYaml: line" in line for line in lines)


def test_no_objects_at_all_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    outcome = cli(str(tmp_path / "empty"))
    assert outcome.exit_code == 1
    assert "NoObjects" in outcome.stdout


# --- cross-object rules ------------------------------------------------------------------------------------


def test_profile_violations_are_reported_against_the_catalogue(tmp_path: Path) -> None:
    bad = profile(
        "review",
        "change-review",
        tools=["read", "edit"],
        session={"policy": "resume"},
        memory={"enabled": True},
        providerMappings=[{"provider": "anthropic", "model": "m", "fallbackModels": ["m"]}, {"provider": "openai"}],
    )
    outcome = cli(str(write(tmp_path / "p.yaml", bad)))
    assert outcome.exit_code == 1
    assert outcome.found == {
        ("Profile/review", "spec.tools[1]", "ToolOutsideEnvelope"),
        ("Profile/review", "spec.tools[1]", "ReviewProfileWrites"),
        ("Profile/review", "spec.session.policy", "SessionPolicyForbidden"),
        ("Profile/review", "spec.memory.enabled", "MemoryForbidden"),
        ("Profile/review", "spec.providerMappings[0].fallbackModels[0]", "FallbackEqualsPrimary"),
    }
    first = outcome.stdout.splitlines()[0]
    assert first == (
        f"{tmp_path / 'p.yaml'}:Profile/review: spec.tools[1]: ToolOutsideEnvelope: "
        "tool 'edit' is outside envelope change-review (allowed: read, search, think)"
    )


def test_missing_profiles_fail_unless_marked_external(tmp_path: Path) -> None:
    ws = workspace(bindings={"review-probe": "elsewhere"})
    standalone = job("j", profile="team-profile")
    path = write(tmp_path / "refs.yaml", ws, standalone)
    assert cli(str(path)).found == {
        ("Workspace/shop", "spec.profiles[0].profile", "ProfileNotFound"),
        ("AgentJob/j", "spec.profile", "ProfileNotFound"),
    }
    flagged = cli(str(path), "--external-profile", "elsewhere", "--external-profile", "team-profile")
    assert flagged.exit_code == 0, flagged.stdout

    ws_annotated = workspace(
        bindings={"review-probe": "elsewhere"}, annotations={"helmhive.dev/external-profiles": "*"}
    )
    job_annotated = job("j", profile="team-profile")
    job_annotated["metadata"]["annotations"] = {"helmhive.dev/external-profiles": "other, team-profile"}
    assert cli(str(write(tmp_path / "annotated.yaml", ws_annotated, job_annotated))).exit_code == 0


def test_external_profile_can_be_namespaced(tmp_path: Path) -> None:
    ws = workspace(bindings={"review-probe": "shared"}, namespace="team-a")
    path = write(tmp_path / "ns.yaml", ws)
    assert cli(str(path), "--external-profile", "team-b/shared").exit_code == 1
    assert cli(str(path), "--external-profile", "team-a/shared").exit_code == 0


def test_references_resolve_within_one_namespace(tmp_path: Path) -> None:
    ws = workspace(bindings={"review-probe": "quick"}, namespace="team-a")
    other = profile("quick", "review-probe")
    other["metadata"]["namespace"] = "team-b"
    outcome = cli(str(write(tmp_path / "ns.yaml", ws, other)))
    assert outcome.found == {("Workspace/shop", "spec.profiles[0].profile", "ProfileNotFound")}


def test_bound_profile_must_be_for_that_job_kind(tmp_path: Path) -> None:
    ws = workspace(bindings={"change-review": "plan"})
    bad_job = job("j", kind="review-probe", profile="plan")
    outcome = cli(str(write(tmp_path / "k.yaml", ws, bad_job, profile("plan", "change-planning"))))
    assert outcome.found == {
        ("Workspace/shop", "spec.profiles[0].profile", "ProfileKindMismatch"),
        ("AgentJob/j", "spec.profile", "ProfileKindMismatch"),
    }


def test_jobs_and_changes_need_bindings_and_known_services(tmp_path: Path) -> None:
    ws = workspace(bindings={"change-planning": "plan"})
    docs = [
        ws,
        profile("plan", "change-planning"),
        job("no-binding", kind="connection-test"),
        job("bad-service", kind="change-planning", service="billing"),
        change("c", service="billing"),
        memory("m", service="billing"),
    ]
    outcome = cli(str(write(tmp_path / "x.yaml", *docs)))
    assert outcome.found == {
        ("AgentJob/no-binding", "spec.jobKind", "ProfileNotFound"),
        ("AgentJob/bad-service", "spec.service", "ServiceNotInWorkspace"),
        ("Change/c", "spec.workspace", "ProfileNotFound"),
        ("Change/c", "spec.service", "ServiceNotInWorkspace"),
        ("MemoryRecord/m", "spec.scope.service", "ServiceNotInWorkspace"),
    }
    change_lines = [line for line in outcome.stdout.splitlines() if "Change/c: spec.workspace" in line]
    assert len(change_lines) == 2  # implementation and review are unbound
    assert any("change-implementation" in line for line in change_lines)


def test_without_the_workspace_in_the_set_its_rules_are_not_guessed(tmp_path: Path) -> None:
    docs = [memory("m", service="anything"), job("j", service="anything"), change("c")]
    assert cli(str(write(tmp_path / "x.yaml", *docs))).exit_code == 0


def test_an_object_may_be_defined_once(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", profile("p", "connection-test"))
    write(tmp_path / "b.yaml", profile("p", "connection-test"), memory("p"))
    outcome = cli(str(tmp_path))
    assert outcome.found == {("Profile/p", "metadata.name", "DuplicateObject")}
    assert str(tmp_path / "b.yaml") in outcome.stdout and "a.yaml" in outcome.stdout


def test_envelope_objects_must_equal_the_code(tmp_path: Path) -> None:
    def envelope(name: str, kind: JobKind) -> dict[str, Any]:
        return {"apiVersion": API, "kind": "Envelope", "metadata": {"name": name}, "spec": ENVELOPES[kind].to_wire()}

    exact = envelope("review-probe", JobKind.REVIEW_PROBE)
    edited = envelope("change-review", JobKind.CHANGE_REVIEW)
    edited["spec"]["filesystem"] = "write"
    unknown = envelope("deploy", JobKind.CHANGE_REVIEW)
    outcome = cli(str(write(tmp_path / "env.yaml", exact, edited, unknown)))
    assert outcome.found == {
        ("Envelope/change-review", "spec.filesystem", "EnvelopeDiffersFromCode"),
        ("Envelope/deploy", "metadata.name", "UnknownEnvelope"),
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.none() | st.booleans() | st.integers() | st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["Profile", "MemoryRecord", "Workspace", "AgentJob", "Change", "RunnerPool", "Envelope"]),
    spec=json_values,
    metadata=json_values,
)
def test_arbitrary_documents_never_raise(kind: str, spec: Any, metadata: Any) -> None:
    body = {"apiVersion": API, "kind": kind, "metadata": metadata, "spec": spec}
    report = validate_documents(documents=[SourceDocument(file="f", body=body)])
    assert report.issues, "a random document is never valid"
    assert all(isinstance(i.reason, Reason) and i.render().startswith("f:") for i in report.issues)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


@settings(max_examples=300, deadline=None)
@given(data=st.data(), replacement=json_values)
def test_mutating_a_valid_set_never_raises(data: st.DataObject, replacement: Any) -> None:
    docs = good_set()
    target = data.draw(st.sampled_from(docs))
    path = data.draw(st.sampled_from(_paths(target)[1:]))
    parent = target
    for segment in path[:-1]:
        parent = parent[segment]
    parent[path[-1]] = replacement
    report = validate_documents(documents=[SourceDocument(file="f", index=i, body=d) for i, d in enumerate(docs)])
    assert report.objects == len(docs) or report.issues
    assert all(isinstance(i.reason, Reason) for i in report.issues)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab:-[]{}'\"&*!|>#%@ \n\t")), max_size=60))
def test_arbitrary_yaml_text_never_raises(text: str) -> None:
    documents, _ = load_documents(text=text, file="f.yaml")
    report = validate_documents(documents=documents)
    for issue in report.issues:
        assert isinstance(issue.reason, Reason)


# --- output -------------------------------------------------------------------------------------------


def test_json_output_carries_lines_for_annotations(tmp_path: Path) -> None:
    text = (
        "apiVersion: helmhive.dev/v1alpha1\n"
        "kind: Profile\n"
        "metadata:\n"
        "  name: p\n"
        "spec:\n"
        "  envelope: review-probe\n"
        "  purpose: p\n"
        "  providerMappings: [{provider: anthropic}]\n"
        "  network: enabled\n"
        "---\n"
        "apiVersion: helmhive.dev/v1alpha1\n"
        "kind: Profile\n"
        "metadata:\n"
        "  name: q\n"
        "spec:\n"
        "  envelope: review-probe\n"
        "  purpose: p\n"
        "  providerMappings: [{provider: anthropic}]\n"
        "  colour: blue\n"
    )
    path = tmp_path / "lines.yaml"
    path.write_text(text, encoding="utf-8")
    outcome = cli(str(path), "--output", "json")
    assert outcome.exit_code == 1
    payload = json.loads(outcome.stdout)
    assert payload["valid"] is False and payload["objects"] == 2
    assert [(i["name"], i["fieldPath"], i["reason"], i["line"]) for i in payload["issues"]] == [
        ("p", "spec.network", "NetworkWiderThanEnvelope", 9),
        ("q", "spec.colour", "UnknownField", 19),
    ]
    assert payload["issues"][0]["file"] == str(path)


def test_json_output_on_success(tmp_path: Path) -> None:
    outcome = cli(str(write(tmp_path / "ok.yaml", *good_set())), "-o", "json")
    assert outcome.exit_code == 0
    assert json.loads(outcome.stdout) == {"valid": True, "files": 1, "objects": 9, "issues": [], "skipped": []}


def test_the_pure_core_takes_documents_not_files() -> None:
    docs = [SourceDocument(file="mem", index=i, body=d) for i, d in enumerate(good_set())]
    report = validate_documents(documents=docs)
    assert report.ok and report.objects == 9
    broken = [SourceDocument(file="mem", index=0, body=profile("p", "connection-test", network="enabled"))]
    (issue,) = validate_documents(documents=broken).issues
    assert (issue.reason, issue.field_path, issue.kind, issue.name) == (
        Reason.NETWORK_WIDER_THAN_ENVELOPE,
        "spec.network",
        "Profile",
        "p",
    )
    assert issue.render().startswith("mem:Profile/p: spec.network: NetworkWiderThanEnvelope: ")


def test_the_ci_example_runs_validate_on_pull_requests() -> None:
    workflow = yaml.safe_load((REPO / "examples" / "ci" / "validate.yaml").read_text(encoding="utf-8"))
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "pull_request" in triggers
    steps = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    assert any("pip install" in s for s in steps)
    assert any("helmhive validate examples/" in s for s in steps)


# --- the docs' examples --------------------------------------------------------------------------------

DOCS = ("docs/profiles.md", "docs/memory.md")
MARKER = re.compile(
    r"<!--\s*helmhive-validate(?::\s*fails\s+(?P<reasons>[\w ,]+?))?\s*-->\s*\n```ya?ml\n(?P<body>.*?)\n```"
    r"(?:\n+```text\n(?P<output>[\w.-]+\.yaml:.*?)\n```)?",
    re.S,
)


def _doc_blocks() -> list[Any]:
    cases = []
    for doc in DOCS:
        for n, m in enumerate(MARKER.finditer((REPO / doc).read_text(encoding="utf-8")), start=1):
            expected = sorted(set(re.split(r"[\s,]+", m["reasons"].strip()))) if m["reasons"] else []
            cases.append(pytest.param(m["body"], expected, m["output"], id=f"{doc}#{n}"))
    return cases


def test_the_docs_have_checked_examples() -> None:
    blocks = _doc_blocks()
    assert len(blocks) >= 10
    assert sum(1 for b in blocks if b.values[2] is not None) >= 2  # documented outputs are checked too
    per_doc = {doc: sum(1 for b in blocks if str(b.id).startswith(doc)) for doc in DOCS}
    assert all(count >= 3 for count in per_doc.values()), per_doc


@pytest.mark.parametrize(("body", "expected", "output"), _doc_blocks())
def test_every_doc_example_gives_the_documented_result(
    tmp_path: Path, body: str, expected: list[str], output: str | None
) -> None:
    """A ```text block right after a failing example is its exact output, under that file name."""
    name = output.split(":", 1)[0] if output else "example.yaml"
    path = tmp_path / name
    path.write_text(body + "\n", encoding="utf-8")
    outcome = cli(str(path))
    reasons = sorted({reason for _, _, reason in outcome.found})
    assert reasons == expected, outcome.stdout
    assert outcome.exit_code == (1 if expected else 0)
    if output is not None:
        assert outcome.stdout.replace(f"{path}:", f"{name}:") == output + "\n"


def test_every_reason_the_rules_can_give_is_documented() -> None:
    text = "".join((REPO / doc).read_text(encoding="utf-8") for doc in DOCS)
    profile_and_memory = [
        Reason.UNKNOWN_ENVELOPE,
        Reason.TOOL_OUTSIDE_ENVELOPE,
        Reason.FILESYSTEM_WIDER_THAN_ENVELOPE,
        Reason.NETWORK_WIDER_THAN_ENVELOPE,
        Reason.OUTPUT_CONTRACT_MISMATCH,
        Reason.INVALID_OUTPUT_SCHEMA,
        Reason.REVIEW_PROFILE_WRITES,
        Reason.SESSION_POLICY_FORBIDDEN,
        Reason.MEMORY_FORBIDDEN,
        Reason.NO_PROVIDER_MAPPINGS,
        Reason.DUPLICATE_MAPPING,
        Reason.FALLBACK_EQUALS_PRIMARY,
        Reason.LABEL_CONFLICTS_WITH_ENVELOPE,
        Reason.PROFILE_NOT_FOUND,
        Reason.PROFILE_KIND_MISMATCH,
        Reason.IN_EFFECT,
        Reason.EXPIRED,
        Reason.OUT_OF_SCOPE,
        Reason.MEMORY_DISABLED,
        Reason.SENSITIVITY_ABOVE_POLICY,
        Reason.OVER_LIMIT,
        Reason.SERVICE_NOT_IN_WORKSPACE,
        Reason.INVALID_YAML,
        Reason.INVALID_DOCUMENT,
        Reason.UNKNOWN_KIND,
        Reason.WRONG_API_VERSION,
        Reason.UNKNOWN_FIELD,
        Reason.INVALID_SPEC,
        Reason.DUPLICATE_OBJECT,
        Reason.ENVELOPE_DIFFERS_FROM_CODE,
        Reason.UNREADABLE_FILE,
        Reason.NO_OBJECTS,
    ]
    assert [r.value for r in profile_and_memory if f"`{r.value}`" not in text] == []


def test_usage_errors_exit_2() -> None:
    assert cli().exit_code == 2
    assert cli(str(REPO / "examples"), "--output", "xml").exit_code == 2


def test_public_surfaces_are_pinned() -> None:
    from helmhive.policy import violations
    from helmhive.policy.memory import selection as memory
    from helmhive.policy.profiles import narrowing as profiles
    from helmhive.policy.validation import manifests as validation

    assert profiles.__all__ == [
        "LABEL_LIMIT",
        "WRITE_TOOLS",
        "ProfileVerdict",
        "Violation",
        "as_profile_spec",
        "compose_output_schema",
        "decide_profile",
        "decide_profile_body",
        "format_violations",
    ]
    assert memory.__all__ == [
        "MAX_INJECTED_RECORDS",
        "MemoryActivity",
        "MemoryExclusion",
        "MemorySelection",
        "NamedMemoryRecord",
        "decide_memory_active",
        "decide_memory_scope",
        "render_memory_context",
        "select_memory",
    ]
    assert validation.__all__ == [
        "EXTERNAL_PROFILES_ANNOTATION",
        "GOVERNED_STAGES",
        "SkippedDocument",
        "SourceDocument",
        "ValidationIssue",
        "ValidationReport",
        "cel_rule_supported",
        "validate_documents",
    ]
    assert violations.__all__ == ["PathSegment", "Violation", "field_path", "split_field_path"]


def test_a_login_volume_with_the_proxy_is_refused_offline_with_its_reason(tmp_path: Path) -> None:
    base = {"adapter": {"type": "claude-cli"}, "image": "helmhive/runner:dev"}
    volume = {"volume": {"claimName": "c", "mountPath": "/home/runner/.claude"}}
    proxied_login = obj(
        "RunnerPool", "login", {**base, "provider": "anthropic", "credential": volume, "credentialIsolation": "Proxy"}
    )
    unknown = obj(
        "RunnerPool",
        "acme",
        {**base, "provider": "acme", "credential": {"secretRef": {"name": "k"}}, "credentialIsolation": "Proxy"},
    )
    fine = obj("RunnerPool", "fine", {**base, "provider": "acme", "credential": {"secretRef": {"name": "k"}}})
    outcome = cli(str(write(tmp_path / "pools.yaml", proxied_login, unknown, fine)))
    assert outcome.exit_code == 1
    assert {(where, reason) for where, _, reason in outcome.found} == {
        ("RunnerPool/login", "InvalidSpec"),
        ("RunnerPool/acme", "InvalidSpec"),
    }
    assert "Proxy needs an API key (credential.secretRef)" in outcome.stdout
    assert "spec.egress.upstream: required with credentialIsolation Proxy" in outcome.stdout


def test_a_login_volume_shared_by_two_replicas_is_refused_offline_with_its_field(tmp_path: Path) -> None:
    base = {"adapter": {"type": "claude-cli"}, "image": "helmhive/runner:dev", "provider": "anthropic"}
    volume = {"volume": {"claimName": "c", "mountPath": "/home/runner/.claude"}}
    shared = obj("RunnerPool", "shared", {**base, "credential": volume, "replicas": 2})
    single = obj("RunnerPool", "single", {**base, "credential": volume, "replicas": 1})
    keyed = obj("RunnerPool", "keyed", {**base, "credential": {"secretRef": {"name": "k"}}, "replicas": 3})
    outcome = cli(str(write(tmp_path / "pools.yaml", shared, single, keyed)))
    assert outcome.exit_code == 1
    assert outcome.found == {("RunnerPool/shared", "spec.replicas", "InvalidSpec")}, outcome.stdout
    assert "pods sharing it would race each other's token refreshes" in outcome.stdout


@pytest.mark.parametrize(
    "api_version", ["0/", "/v1", "helmhive.dev/", "a/b/c", "Apps/v1", "v1 ", "helmhive.dev/v1alpha1/x"]
)
def test_a_malformed_api_version_is_an_issue_not_a_skipped_document(api_version: str) -> None:
    """Hypothesis found ``0/`` skipped as another group's object: a document no server can take is reported."""
    body = {"apiVersion": api_version, "kind": "Profile", "metadata": {"name": "p"}, "spec": {}}
    report = validate_documents(documents=[SourceDocument(file="f", index=0, body=body)])
    assert not report.skipped
    (issue,) = report.issues
    assert (issue.field_path, issue.reason) == ("apiVersion", Reason.INVALID_DOCUMENT), issue
    assert "is not an apiVersion" in issue.message


@pytest.mark.parametrize("api_version", ["v1", "apps/v1", "networking.k8s.io/v1", "argoproj.io/v1alpha1"])
def test_other_groups_well_formed_objects_are_still_skipped(api_version: str) -> None:
    body = {"apiVersion": api_version, "kind": "Thing", "metadata": {"name": "t"}}
    report = validate_documents(documents=[SourceDocument(file="f", index=0, body=body)])
    assert not report.issues and len(report.skipped) == 1

"""The reference agent's documented reply rule, tested as pure functions."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from helmhive.reference_agent import rules


def test_directives_are_read_from_magic_lines() -> None:
    prompt = "\n".join(
        [
            "Fix it",
            "  USE-TOOL: Bash",
            "USE-TOOL: Read",
            "USE-TOOL: Bash",
            "OUTPUT-CONTRACT: json",
            "REFERENCE-AGENT: slow",
        ]
    )
    directives = rules.parse_directives(prompt)
    assert directives.json_output is True
    assert directives.tools == ("Bash", "Read")
    assert directives.behaviour == "slow"


def test_unknown_or_inline_directives_are_ignored() -> None:
    directives = rules.parse_directives("say USE-TOOL: Bash\nREFERENCE-AGENT: explode\nOUTPUT-CONTRACT: yaml")
    assert directives == rules.Directives()


def test_digest_is_sha256_prefix() -> None:
    assert rules.prompt_digest("héllo") == hashlib.sha256("héllo".encode()).hexdigest()[:16]


def test_text_reply_states_turn_model_effort_digest_and_tools() -> None:
    prompt = "Explain the build\nUSE-TOOL: Bash"
    reply = rules.render_reply(prompt, turn=3, model="reference-large", effort="high", tool_results={"Bash": False})
    assert reply.splitlines() == [
        "helmhive-reference-agent: deterministic reference agent, not a model.",
        "turn=3 model=reference-large effort=high",
        f"prompt sha256={rules.prompt_digest(prompt)} lines=2 words=5",
        "first line: Explain the build",
        "tool Bash: denied",
    ]


def test_json_reply_is_deterministic_and_derived_from_prompt() -> None:
    prompt = "OUTPUT-CONTRACT: json\nList the services"
    first = rules.render_reply(prompt, turn=1, model="reference-small", effort="low", tool_results={})
    again = rules.render_reply(prompt, turn=1, model="reference-small", effort="low", tool_results={})
    assert first == again
    data = json.loads(first)
    assert data == {
        "agent": "helmhive-reference-agent",
        "turn": 1,
        "model": "reference-small",
        "effort": "low",
        "promptSha256": rules.prompt_digest(prompt),
        "promptLines": 2,
        "promptWords": 5,
        "firstLine": "List the services",
        "tools": {},
    }
    other = rules.render_reply(prompt + "!", turn=1, model="reference-small", effort="low", tool_results={})
    assert json.loads(other)["promptSha256"] != data["promptSha256"]


def test_new_directives_are_read_and_unsafe_ones_ignored() -> None:
    prompt = "\n".join(
        [
            "Do things",
            "WRITE-FILE: a.txt",
            "WRITE-FILE: ../escape.txt",
            "ACP-WRITE-FILE: b.txt",
            "CONNECT: 8443",
            "CONNECT: 99999",
            "READ-FILE: /etc/hostname",
            "READ-FILE: relative",
            "PAD-REPLY: 12",
            "REFERENCE-AGENT: invalid-output",
        ]
    )
    directives = rules.parse_directives(prompt)
    assert directives.write_files == ("a.txt",)
    assert directives.acp_write_files == ("b.txt",)
    assert directives.connects == (8443,)
    assert directives.read_files == ("/etc/hostname",)
    assert directives.pad == 12 and directives.invalid_output
    assert directives.behaviour is None  # invalid-output is not a flow behaviour
    assert rules.first_content_line(prompt) == "Do things"
    assert rules.tool_kind("read") == "read" and rules.tool_kind("Read") == "other"


def test_a_json_answer_satisfies_the_schema_in_the_prompt() -> None:
    from jsonschema import Draft202012Validator

    from helmhive.api.common import JobKind
    from helmhive.api.envelope import OutputContract
    from helmhive.api.job import JobRequest
    from helmhive.policy.agentjob.prompts import build_agent_prompt, check_output
    from helmhive.policy.envelopes import ENVELOPES

    for kind in JobKind:
        contract = ENVELOPES[kind].output_contract
        if contract.json_schema is None:
            continue
        narrowed = OutputContract.model_validate(
            {"format": "structured", "schema": {"allOf": [contract.json_schema, {"required": ["extra"]}]}}
        )
        for used in (contract, narrowed):
            prompt = build_agent_prompt(
                instructions="", request=JobRequest(title="t", prompt="do it"), memory_context="", contract=used
            )
            assert rules.find_schema(prompt) == used.json_schema
            reply = rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={})
            assert check_output(text=reply, contract=used).ok, (kind, reply)
            Draft202012Validator(used.json_schema or {}).validate(json.loads(reply))
            broken = rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={}, invalid_output=True)
            assert not check_output(text=broken, contract=used).ok


def test_a_closed_schema_gets_only_its_own_properties() -> None:
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer", "minimum": 3}}}
    schema["additionalProperties"] = False
    prompt = "OUTPUT-CONTRACT: json\n```json\n" + json.dumps(schema) + "\n```"
    assert json.loads(rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={})) == {"a": 3}
    assert rules.minimal_instance({"type": "string", "minLength": 20, "maxLength": 25}) == "reference answer...."
    assert rules.minimal_instance({"type": "array", "minItems": 2, "items": {"enum": ["x"]}}) == ["x", "x"]


def test_padding_is_deterministic_and_exact() -> None:
    reply = rules.render_reply("hi\nPAD-REPLY: 1000", turn=1, model="m", effort="e", tool_results={})
    assert reply.endswith(rules.filler(1000)) and len(rules.filler(1000)) == 1000
    assert rules.filler(1000) == rules.filler(1000)


# -- governed change: plan, implement, review ----------------------------------------------------

SOURCE_COMMIT = "0123456789abcdef0123456789abcdef01234567"
CRITERIA = ("The greeting ends with a newline", "The data file is binary")
PASSING = (("unit", "Passed"),)
PATCH = (
    "diff --git a/app.txt b/app.txt\n--- a/app.txt\n+++ b/app.txt\n@@ -1 +1,2 @@\n hello\n+world\n"
    "diff --git a/data/blob.bin b/data/blob.bin\nnew file mode 100644\nGIT binary patch\nliteral 3\n"
    "KcmZQzVE_OC00IC2\n\nliteral 0\nKcmV+b0RR6000031\n"
)


def governed_prompt(
    stage: str,
    *,
    description: str = "",
    criteria: tuple[str, ...] = CRITERIA,
    iteration: int = 1,
    findings: bool = False,
    checks: tuple[tuple[str, str], ...] | None = PASSING,
    check_tail: str = "ok",
    patch: str | None = PATCH,
    patch_after_contract: bool = False,
    title: str = "Greet politely",
) -> str:
    """A governed-change prompt in the operator's format, wrapped as the operator wraps every job."""
    from helmhive.api.common import JobKind
    from helmhive.api.job import JobRequest
    from helmhive.policy.agentjob.prompts import build_agent_prompt
    from helmhive.policy.envelopes import ENVELOPES

    lines = [
        f"Governed change stage: {stage}",
        f"Change: greet   Iteration: {iteration}",
        "",
        "## Change request",
        f"Title: {title}",
        description,
        "",
        "## Confirmed criteria",
        *(f"{n}. {text}" for n, text in enumerate(criteria, start=1)),
        "",
        "## Exact source",
        "Repository: git://127.0.0.1:9418/app.git",
        f"Commit: {SOURCE_COMMIT}",
    ]
    if stage != "planning":
        lines += ["", f"## Plan (digest sha256:{'a' * 64})", "Plan summary", "1. Criterion 1: greet: app.txt"]
    if findings:
        lines += [
            "",
            "## Review findings to address",
            "- [major] app.txt:1 Check unit ended Failed",
            "Criteria not met: 1",
        ]
    if stage == "review":
        lines += ["", "## Check evidence"]
        if not checks:
            lines.append("No checks were declared.")
        for name, outcome in checks or ():
            lines.append(f"- check {name}: {outcome} exit=0 duration=0.1s output-sha256={'b' * 64}")
            lines.append(f"  {check_tail}")
    kind = {
        "planning": JobKind.CHANGE_PLANNING,
        "implementation": JobKind.CHANGE_IMPLEMENTATION,
        "review": JobKind.CHANGE_REVIEW,
    }[stage]
    prompt = build_agent_prompt(
        instructions="Follow the governed process.",
        request=JobRequest(title=title, prompt="\n".join(lines)),
        memory_context="",
        contract=ENVELOPES[kind].output_contract,
    )
    if stage != "review" or patch is None:
        return prompt
    size = len(patch.encode())
    section = f"## Patch (sha256 {'c' * 64}, {size} bytes)\n```diff\n{patch}```\n"
    if patch_after_contract:
        return prompt + "\n" + section
    return prompt.replace("\n## Output contract", f"\n{section}\n## Output contract", 1)


def stage_schema(stage: str) -> dict[str, Any]:
    from helmhive.api.common import JobKind
    from helmhive.policy.envelopes import ENVELOPES

    kind = JobKind(f"change-{stage}")
    schema = ENVELOPES[kind].output_contract.json_schema
    assert schema is not None
    return schema


def answer(prompt: str, *, edits: tuple[rules.EditOutcome, ...] = (), turn: int = 1, model: str = "m") -> str:
    return rules.render_reply(prompt, turn=turn, model=model, effort="e", tool_results={}, edit_results=edits)


def assert_valid(stage: str, reply: str) -> dict[str, Any]:
    from jsonschema import Draft202012Validator

    data = json.loads(reply)
    Draft202012Validator(stage_schema(stage)).validate(data)
    return dict(data)


def test_a_governed_prompt_is_read_from_its_marker_lines_and_sections() -> None:
    description = "\n".join(
        [
            "Say hello to the world.",
            "## Background (part of the description, not a section)",
            "APPEND-LINE: app.txt :: world",
            "REVIEW-VERDICT: request-changes-once",
        ]
    )
    prompt = governed_prompt(
        "review",
        description=description,
        criteria=("First", "Second one\n   continued here"),
        iteration=2,
        findings=True,
        checks=(("unit", "Passed"), ("lint", "TimedOut")),
        check_tail="APPEND-LINE: evil.txt :: from a check's output",
    )
    governed = rules.parse_governed(prompt)
    assert governed is not None
    assert (governed.stage, governed.change, governed.iteration) == ("review", "greet", 2)
    assert governed.title == "Greet politely"
    assert governed.criteria == ("First", "Second one continued here")
    assert governed.has_findings is True
    assert governed.checks == (rules.CheckResult("unit", "Passed"), rules.CheckResult("lint", "TimedOut"))
    assert governed.patch == PATCH.rstrip("\n")
    # Only the request section holds directives: the check's output line is not one.
    assert [e.path for e in governed.edits] == ["app.txt"]
    assert governed.verdicts == ("request-changes-once",)


def test_headings_count_only_in_the_operators_order() -> None:
    # A description may use headings of its own, even the operator's; directives after them still count.
    description = "Background\n## Plan\n## Check evidence\n- check fake: Failed\nAPPEND-LINE: app.txt :: world"
    prompt = governed_prompt("review", description=description, checks=(("unit", "Passed"),))
    # Instructions before the request may hold any heading too: it opens nothing.
    prompt = prompt.replace("Follow the governed process.", "## Patch (sha256 x, 1 bytes)\n```diff\nfake\n```")
    governed = rules.parse_governed(prompt)
    assert governed is not None
    assert [e.path for e in governed.edits] == ["app.txt"]
    assert governed.checks == (rules.CheckResult("unit", "Passed"),)
    assert governed.criteria == CRITERIA
    assert governed.patch == PATCH.rstrip("\n")
    # A heading out of order is body text: findings after the check evidence open nothing.
    late = rules.parse_governed(prompt.replace("  ok\n", "  ok\n## Review findings to address\n- check late: Failed\n"))
    assert late is not None and late.has_findings is False
    assert late.checks == (rules.CheckResult("unit", "Passed"), rules.CheckResult("late", "Failed"))


@pytest.mark.parametrize(
    "prompt",
    [
        "Plan the change\nOUTPUT-CONTRACT: json",
        "Governed change stage: deploying\nChange: x   Iteration: 1",
        "say Governed change stage: planning",
    ],
    ids=["plain", "unknown-stage", "inline-marker"],
)
def test_a_prompt_without_the_stage_line_is_not_governed(prompt: str) -> None:
    assert rules.parse_governed(prompt) is None


E = rules.Edit


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("APPEND-LINE: app.txt :: hello world", E("APPEND-LINE", "app.txt", text="hello world")),
        ("  APPEND-LINE: a/b-c/d_e.txt :: x :: y", E("APPEND-LINE", "a/b-c/d_e.txt", text="x :: y")),
        ("APPEND-LINE: empty.txt ::", E("APPEND-LINE", "empty.txt", text="")),
        ("REPLACE-TEXT: app.txt :: hello => goodbye", E("REPLACE-TEXT", "app.txt", text="hello", new="goodbye")),
        ("REPLACE-TEXT: app.txt :: a => b => c", E("REPLACE-TEXT", "app.txt", text="a", new="b => c")),
        ("REPLACE-TEXT: app.txt :: drop me =>", E("REPLACE-TEXT", "app.txt", text="drop me", new="")),
        ("DELETE-FILE: old/gone.txt", E("DELETE-FILE", "old/gone.txt")),
        ("WRITE-BYTES: data/blob.bin :: 4096", E("WRITE-BYTES", "data/blob.bin", size=4096)),
        ("WRITE-BYTES: max.bin :: 8388608", E("WRITE-BYTES", "max.bin", size=rules.MAX_WRITE_BYTES)),
        ("WRITE-BYTES: zero.bin :: 0", E("WRITE-BYTES", "zero.bin", size=0)),
        (
            "IF-FINDINGS APPEND-LINE: fix.txt :: fixed",
            E("APPEND-LINE", "fix.txt", text="fixed", condition="if-findings"),
        ),
        ("UNLESS-FINDINGS DELETE-FILE: a.txt", E("DELETE-FILE", "a.txt", condition="unless-findings")),
        ("APPEND-LINE: ..foo/bar.. :: x", E("APPEND-LINE", "..foo/bar..", text="x")),
        ("append-line: a.txt :: lower case", None),
        ("Please APPEND-LINE: a.txt :: inline", None),
        ("IF-FINDINGS REVIEW-VERDICT: request-changes", None),
        ("WRITE-FILE: a.txt", None),
    ],
)
def test_edit_directive_grammar(line: str, expected: rules.Edit | None) -> None:
    edits = rules.parse_edits([line])
    assert edits == (() if expected is None else (expected,))


UNSAFE_PATHS = ["../escape.txt", "/etc/passwd", "a/../b", "./a", "a//b", "a/", ".git/config", "sub/.GIT/hooks/x",
                "with space", "back\\slash", "x" * 513, "", "colon:name", "ünïcode"]  # fmt: skip


@pytest.mark.parametrize("path", UNSAFE_PATHS)
@pytest.mark.parametrize("template", ["APPEND-LINE: {} :: x", "REPLACE-TEXT: {} :: a => b", "DELETE-FILE: {}",
                                      "WRITE-BYTES: {} :: 1", "IF-FINDINGS APPEND-LINE: {} :: x"])  # fmt: skip
def test_unsafe_paths_are_ignored_and_say_so(path: str, template: str) -> None:
    (edit,) = rules.parse_edits([template.format(path)])
    assert edit.problem == "ignored (unsafe path)"
    assert not rules.safe_relpath(path)
    assert rules.edit_skip_reason(edit, has_findings=True) == "ignored (unsafe path)"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("APPEND-LINE: a.txt", "ignored (malformed: no ' :: ')"),
        ("REPLACE-TEXT: a.txt :: no arrow", "ignored (malformed: expected '<old> => <new>')"),
        ("REPLACE-TEXT: a.txt ::  => new", "ignored (malformed: expected '<old> => <new>')"),
        ("WRITE-BYTES: a.bin :: 8388609", "ignored (size must be 0 to 8388608)"),
        ("WRITE-BYTES: a.bin :: -1", "ignored (size must be 0 to 8388608)"),
        ("WRITE-BYTES: a.bin :: 1e3", "ignored (size must be 0 to 8388608)"),
        ("WRITE-BYTES: a.bin :: ²", "ignored (size must be 0 to 8388608)"),
    ],
)
def test_malformed_edits_are_ignored_and_say_why(line: str, problem: str) -> None:
    (edit,) = rules.parse_edits([line])
    assert edit.problem == problem


def test_at_most_256_edits_apply() -> None:
    edits = rules.parse_edits([f"APPEND-LINE: f{i}.txt :: {i}" for i in range(rules.MAX_EDITS + 2)])
    assert [e.problem for e in edits[: rules.MAX_EDITS]] == [""] * rules.MAX_EDITS
    assert [e.problem for e in edits[rules.MAX_EDITS :]] == ["ignored (more than 256 directives)"] * 2


@pytest.mark.parametrize(
    ("condition", "has_findings", "reason"),
    [
        ("always", False, None),
        ("always", True, None),
        ("if-findings", False, "skipped (no review findings)"),
        ("if-findings", True, None),
        ("unless-findings", False, None),
        ("unless-findings", True, "skipped (review findings present)"),
    ],
)
def test_findings_conditions(condition: rules.Condition, has_findings: bool, reason: str | None) -> None:
    edit = rules.Edit("APPEND-LINE", "a.txt", text="x", condition=condition)
    assert rules.edit_skip_reason(edit, has_findings=has_findings) == reason


def test_findings_conditions_follow_the_findings_section() -> None:
    description = "IF-FINDINGS APPEND-LINE: fix.txt :: fixed\nUNLESS-FINDINGS APPEND-LINE: bug.txt :: broken"
    for findings, applied in ((False, "bug.txt"), (True, "fix.txt")):
        governed = rules.parse_governed(governed_prompt("implementation", description=description, findings=findings))
        assert governed is not None and governed.has_findings is findings
        to_apply = [e.path for e in governed.edits if rules.edit_skip_reason(e, has_findings=findings) is None]
        assert to_apply == [applied]


def test_write_bytes_content_is_deterministic_binary() -> None:
    data = rules.pseudo_random_bytes("data/blob.bin", 4096)
    assert len(data) == 4096 and data[0] == 0
    assert data == rules.pseudo_random_bytes("data/blob.bin", 4096)
    assert data[1:] == hashlib.shake_256(b"helmhive-reference:data/blob.bin:4096").digest(4096)[1:]
    assert data != rules.pseudo_random_bytes("data/other.bin", 4096)
    assert rules.pseudo_random_bytes("a", 0) == b""
    assert len(rules.pseudo_random_bytes("big", rules.MAX_WRITE_BYTES)) == rules.MAX_WRITE_BYTES


def test_planning_answers_a_plan_with_one_step_per_criterion() -> None:
    description = "APPEND-LINE: app.txt :: world\nWRITE-BYTES: data/blob.bin :: 10\nIF-FINDINGS DELETE-FILE: old.txt"
    prompt = governed_prompt("planning", description=description)
    files = "Files the request's edit directives touch: app.txt, data/blob.bin, old.txt."
    assert assert_valid("planning", answer(prompt)) == {
        "agent": "helmhive-reference-agent",
        "summary": f'Plan for "Greet politely" (change greet): 2 step(s), one per confirmed criterion. {files}',
        "steps": [
            {"title": "Criterion 1: The greeting ends with a newline", "detail": f"Make it hold. {files}"},
            {"title": "Criterion 2: The data file is binary", "detail": f"Make it hold. {files}"},
        ],
        "risks": [],
    }


def test_the_plan_is_byte_identical_for_the_same_prompt() -> None:
    prompt = governed_prompt("planning", description="APPEND-LINE: app.txt :: world")
    first = answer(prompt)
    assert answer(prompt, turn=7, model="reference-large") == first
    assert answer(prompt.replace("Greet politely", "Greet loudly")) != first


def test_planning_bounds_and_risks() -> None:
    long = "x" * 1000
    plan = assert_valid("planning", answer(governed_prompt("planning", criteria=(long,))))
    assert plan["steps"] == [
        {
            "title": "Criterion 1: " + "x" * 199 + "…",
            "detail": "Make it hold. The request holds no edit directives naming files.",
        }
    ]
    many = assert_valid("planning", answer(governed_prompt("planning", criteria=tuple(f"c{i}" for i in range(40)))))
    assert isinstance(many["steps"], list) and len(many["steps"]) == 32
    assert many["risks"] == ["Risk: only the first 32 of 40 criteria have a step."]
    none = assert_valid("planning", answer(governed_prompt("planning", criteria=(), description="DELETE-FILE: ../x")))
    assert none["steps"] == [
        {"title": "Implement the change request", "detail": "The request holds no edit directives naming files."}
    ]
    assert none["risks"] == [
        "Risk: no confirmed criteria, so the review has nothing to hold the change to; "
        "1 edit directive(s) in the request will be ignored."
    ]


def outcome(line: str, changed: bool, result: str) -> rules.EditOutcome:
    (edit,) = rules.parse_edits([line])
    return rules.EditOutcome(edit=edit, changed=changed, result=result)


def test_implementation_reports_what_its_edits_did() -> None:
    prompt = governed_prompt("implementation", description="(the directives are applied by the agent)")
    edits = (
        outcome("WRITE-BYTES: z/blob.bin :: 3", True, "written (3 bytes)"),
        outcome("APPEND-LINE: app.txt :: world", True, "appended"),
        outcome("REPLACE-TEXT: app.txt :: hello => hi", True, "replaced 1 occurrence(s)"),
        outcome("DELETE-FILE: gone.txt", False, "already absent"),
        outcome("IF-FINDINGS APPEND-LINE: fix.txt :: x", False, "skipped (no review findings)"),
        outcome("APPEND-LINE: ../escape :: x", False, "ignored (unsafe path)"),
    )
    assert assert_valid("implementation", answer(prompt, edits=edits)) == {
        "agent": "helmhive-reference-agent",
        "summary": 'Implemented "Greet politely" (change greet, iteration 1) from the request\'s edit directives: '
        "3 of 6 changed a file; 2 file(s) changed.",
        "filesChanged": ["app.txt", "z/blob.bin"],
        "notes": "\n".join(
            [
                "WRITE-BYTES z/blob.bin: written (3 bytes)",
                "APPEND-LINE app.txt: appended",
                "REPLACE-TEXT app.txt: replaced 1 occurrence(s)",
                "DELETE-FILE gone.txt: already absent",
                "IF-FINDINGS APPEND-LINE fix.txt: skipped (no review findings)",
                "APPEND-LINE ../escape: ignored (unsafe path)",
            ]
        ),
    }
    again = assert_valid("implementation", answer(governed_prompt("implementation", iteration=2, findings=True)))
    assert again["filesChanged"] == [] and again["notes"] == "The request holds no edit directives."
    assert str(again["summary"]).endswith("iteration 2) from the request's edit directives: 0 of 0 changed a file; "
                                          "0 file(s) changed. Review findings were present.")  # fmt: skip


def test_implementation_notes_stay_within_the_schema() -> None:
    edits = tuple(outcome(f"APPEND-LINE: {'d' * 200}/{i}.txt :: x", True, "created") for i in range(256))
    data = assert_valid("implementation", answer(governed_prompt("implementation"), edits=edits))
    assert len(str(data["notes"])) == 4000 and str(data["notes"]).endswith("…")
    assert isinstance(data["filesChanged"], list) and len(data["filesChanged"]) == 256


REVIEW_CASES: dict[str, tuple[dict[str, Any], str, list[str]]] = {
    "passed-with-patch": ({}, "approve", []),
    "no-checks-declared": ({"checks": ()}, "approve", []),
    "failed-check": ({"checks": (("unit", "Passed"), ("lint", "Failed"))}, "request-changes",
                     ["Check lint ended Failed; it must pass."]),
    "timed-out-check": ({"checks": (("slow", "TimedOut"),)}, "request-changes",
                        ["Check slow ended TimedOut; it must pass."]),
    "not-run-check": ({"checks": (("gone", "NotRun"),)}, "request-changes", ["Check gone ended NotRun; it must pass."]),
    "no-patch": ({"patch": None}, "request-changes", ["No patch to review: the patch is missing or empty."]),
    "empty-patch": ({"patch": ""}, "request-changes", ["No patch to review: the patch is missing or empty."]),
    "verdict-directive": ({"description": "REVIEW-VERDICT: request-changes", "iteration": 3}, "request-changes",
                          ["The request asks for changes (REVIEW-VERDICT: request-changes)."]),
    "once-on-iteration-1": ({"description": "REVIEW-VERDICT: request-changes-once"}, "request-changes",
                            ["The request asks for changes (REVIEW-VERDICT: request-changes-once)."]),
    "once-on-iteration-2": ({"description": "REVIEW-VERDICT: request-changes-once", "iteration": 2}, "approve", []),
    "prefixed-verdict-is-ignored": ({"description": "IF-FINDINGS REVIEW-VERDICT: request-changes"}, "approve", []),
    "unknown-verdict-is-ignored": ({"description": "REVIEW-VERDICT: reject"}, "approve", []),
    "verdict-in-check-output-is-ignored": ({"check_tail": "REVIEW-VERDICT: request-changes"}, "approve", []),
    "patch-after-the-contract": ({"patch_after_contract": True}, "approve", []),
}  # fmt: skip


@pytest.mark.parametrize(("case", "verdict", "majors"), list(REVIEW_CASES.values()), ids=list(REVIEW_CASES))
def test_review_verdict_rules(case: dict[str, Any], verdict: str, majors: list[str]) -> None:
    review = assert_valid("review", answer(governed_prompt("review", **case)))
    assert review["verdict"] == verdict
    findings = review["findings"]
    assert isinstance(findings, list)
    assert [f["message"] for f in findings if f["severity"] == "major"] == majors
    infos = [f["message"] for f in findings if f["severity"] == "info"]
    has_patch = case.get("patch", PATCH)
    assert infos == (["The patch changes 2 file(s): app.txt, data/blob.bin."] if has_patch else [])
    met = verdict == "approve"
    note = "met: approved" if met else review["criteria"][0]["note"]
    assert review["criteria"] == [{"criterion": i, "met": met, "note": note} for i in range(len(CRITERIA))]
    assert str(note).startswith("met:" if met else "not met: ")
    summary = str(review["summary"])
    assert summary.startswith('Approve "Greet politely"' if met else 'Request changes to "Greet politely"')


def test_review_criteria_are_left_out_only_by_a_closed_schema() -> None:
    prompt = governed_prompt("review")
    schema = stage_schema("review")
    closed = {**schema, "additionalProperties": False}
    closed_prompt = prompt.replace(
        json.dumps(schema, indent=2, sort_keys=True), json.dumps(closed, indent=2, sort_keys=True)
    )
    assert rules.find_schema(closed_prompt) == closed
    data = json.loads(answer(closed_prompt))
    properties = schema["properties"]
    assert isinstance(properties, dict)
    assert set(data) == {"verdict", "summary", "findings"} | ({"criteria"} & set(properties))
    assert "agent" not in data


def test_every_governed_answer_satisfies_its_envelope_schema_and_check() -> None:
    from helmhive.api.common import JobKind
    from helmhive.policy.agentjob.prompts import check_output
    from helmhive.policy.envelopes import ENVELOPES

    for stage in rules.STAGES:
        contract = ENVELOPES[JobKind(f"change-{stage}")].output_contract
        for variant in ({}, {"findings": True, "iteration": 2}, {"criteria": ()}, {"checks": (("a", "Failed"),)}):
            prompt = governed_prompt(stage, description="APPEND-LINE: a.txt :: x", **variant)
            reply = answer(prompt)
            assert check_output(text=reply, contract=contract).ok, (stage, variant, reply)
            assert_valid(stage, reply)
            broken = rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={}, invalid_output=True)
            assert json.loads(broken) == {"agent": "helmhive-reference-agent"}
            assert not check_output(text=broken, contract=contract).ok


def test_a_governed_prompt_without_a_json_contract_gets_the_text_answer_with_edit_lines() -> None:
    prompt = "Governed change stage: implementation\nChange: greet   Iteration: 1\n## Change request\nTitle: t"
    edits = (outcome("APPEND-LINE: a.txt :: x", True, "created"),)
    reply = answer(prompt, edits=edits)
    assert reply.splitlines()[0] == "helmhive-reference-agent: deterministic reference agent, not a model."
    assert reply.splitlines()[-1] == "edit APPEND-LINE a.txt: created"


def test_patch_files_are_read_from_git_headers() -> None:
    quoted = 'diff --git "a/sp ace.txt" "b/sp ace.txt"\n'
    assert rules.patch_files(PATCH + quoted) == ("app.txt", "data/blob.bin", "sp ace.txt")
    assert rules.patch_files("--- a/x.txt\t2020\n+++ b/x.txt\t2020\n@@ -1 +1 @@\n-a\n+b\n") == ("x.txt",)
    assert rules.patch_files("not a patch") == ()


def test_governed_directives_are_magic_lines() -> None:
    prompt = "APPEND-LINE: a.txt :: x\nIF-FINDINGS DELETE-FILE: b\nREVIEW-VERDICT: approve\nThe real first line"
    assert rules.first_content_line(prompt) == "The real first line"


SUGGEST_LINES = (
    "REFERENCE-AGENT: suggest constraint service:ledger internal name=ledger-append-only Ledger rows are append-only.",
    "  REFERENCE-AGENT: suggest decision workspace public Money is integer cents.",
)


def test_suggest_lines_are_read_in_order() -> None:
    prompt = "\n".join(["Suggest some records", *SUGGEST_LINES, "REFERENCE-AGENT: slow"])
    directives = rules.parse_directives(prompt)
    assert directives.suggestions == (
        rules.SuggestLine(
            kind="constraint",
            service="ledger",
            sensitivity="internal",
            text="Ledger rows are append-only.",
            name="ledger-append-only",
        ),
        rules.SuggestLine(kind="decision", service=None, sensitivity="public", text="Money is integer cents."),
    )
    assert directives.behaviour == "slow"
    assert rules.first_content_line("\n".join([*SUGGEST_LINES, "Then this"])) == "Then this"


@pytest.mark.parametrize(
    "line",
    [
        "REFERENCE-AGENT: suggest policy workspace public Text.",
        "REFERENCE-AGENT: suggest decision team public Text.",
        "REFERENCE-AGENT: suggest decision service: public Text.",
        "REFERENCE-AGENT: suggest decision service:Ledger public Text.",
        "REFERENCE-AGENT: suggest decision workspace secret Text.",
        "REFERENCE-AGENT: suggest decision workspace public name=Not_A_Label Text.",
        "REFERENCE-AGENT: suggest decision workspace public name=no-text",
        "REFERENCE-AGENT: suggest decision workspace public",
        "REFERENCE-AGENT: Suggest decision workspace public Text.",
        "REFERENCE-AGENT: suggest decision workspace public " + "x" * (rules.MAX_SUGGESTION_TEXT + 1),
        "say REFERENCE-AGENT: suggest decision workspace public Text.",
    ],
)
def test_malformed_suggest_lines_are_ignored(line: str) -> None:
    assert rules.parse_directives(line) == rules.Directives()


def _suggestion_prompt(request: str, schema: dict[str, Any] | None = None) -> str:
    from helmhive.api.common import JobKind
    from helmhive.api.envelope import OutputContract
    from helmhive.api.job import JobRequest
    from helmhive.policy.agentjob.prompts import build_agent_prompt
    from helmhive.policy.envelopes import ENVELOPES

    contract = ENVELOPES[JobKind.POLICY_SUGGESTION].output_contract
    if schema is not None:
        contract = OutputContract.model_validate({"format": "structured", "schema": schema})
    return build_agent_prompt(
        instructions="", request=JobRequest(title="t", prompt=request), memory_context="", contract=contract
    )


def test_a_policy_suggestion_answer_carries_the_suggest_lines_and_exports() -> None:
    from helmhive.api.common import JobKind
    from helmhive.policy.agentjob.prompts import check_output
    from helmhive.policy.envelopes import ENVELOPES
    from helmhive.policy.suggestions.export import decide_job_suggestions

    contract = ENVELOPES[JobKind.POLICY_SUGGESTION].output_contract
    prompt = _suggestion_prompt("\n".join(["Look at the ledger.", *SUGGEST_LINES]))
    reply = rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={})
    assert reply == rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={})
    check = check_output(text=reply, contract=contract)
    assert check.ok, check.errors
    assert check.document is not None
    suggestions = check.document["suggestions"]
    assert suggestions == [
        {
            "name": "ledger-append-only",
            "kind": "constraint",
            "scope": {"type": "service", "service": "ledger"},
            "text": "Ledger rows are append-only.",
            "sensitivity": "internal",
            "rationale": "Suggestion 1 of the prompt's REFERENCE-AGENT suggest lines "
            "(deterministic reference agent, not a model).",
        },
        {
            "kind": "decision",
            "scope": {"type": "workspace"},
            "text": "Money is integer cents.",
            "sensitivity": "public",
            "rationale": "Suggestion 2 of the prompt's REFERENCE-AGENT suggest lines "
            "(deterministic reference agent, not a model).",
        },
    ]
    job = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "metadata": {"name": "suggest-1", "namespace": "ns", "uid": "u-1"},
        "spec": {"workspace": "payments", "jobKind": "policy-suggestion"},
        "status": {"result": {"outcome": "Completed", "output": check.document}},
    }
    views = decide_job_suggestions(job=job).views
    assert len(views) == 2 and (views[0].record_name, views[0].problems) == ("ledger-append-only", ())
    assert views[1].record_name.startswith("suggest-1-") and views[1].problems == ()
    broken = rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={}, invalid_output=True)
    assert "suggestions" not in json.loads(broken)
    assert not check_output(text=broken, contract=contract).ok


def test_suggestions_follow_the_schema_bounds_and_closed_items() -> None:
    item = {
        "type": "object",
        "required": ["kind", "text"],
        "additionalProperties": False,
        "properties": {"kind": {"enum": ["decision", "constraint"]}, "text": {"type": "string", "maxLength": 10}},
    }
    schema = {
        "type": "object",
        "required": ["suggestions"],
        "properties": {"suggestions": {"type": "array", "maxItems": 1, "items": item}},
    }
    unbounded = {"properties": {"suggestions": {"type": "array", "items": item}}}
    narrowed = {"allOf": [unbounded, {"properties": {"suggestions": {"minItems": 3}}}]}
    lines = (rules.SuggestLine(kind="constraint", service="a", sensitivity="public", text="Twelve chars"),) * 2
    assert rules.suggestion_items(lines, schema) == [{"kind": "constraint", "text": "Twelve ch…"}]
    topped = rules.suggestion_items(lines[:1], narrowed)
    assert topped == [{"kind": "constraint", "text": "Twelve ch…"}, *[{"kind": "decision", "text": "reference "}] * 2]
    assert rules.suggestion_items(lines, {"type": "object", "properties": {"other": {}}}) is None


def test_suggest_lines_without_a_suggestions_property_change_nothing() -> None:
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}
    prompt = "OUTPUT-CONTRACT: json\n```json\n" + json.dumps(schema) + "\n```"
    plain = json.loads(rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={}))
    with_lines = prompt + "\n" + "\n".join(SUGGEST_LINES)
    answered = json.loads(rules.render_reply(with_lines, turn=1, model="m", effort="e", tool_results={}))
    assert "suggestions" not in answered and answered["a"] == plain["a"] == 0

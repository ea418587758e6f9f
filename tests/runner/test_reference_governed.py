"""The reference agent over real ACP in a governed change: it plans, edits its cwd, and reviews.

The agent runs as its own process (``helmhive-reference-agent``) driven by the runner's ACP
adapter, in a git work tree the test creates. Git itself computes and applies the patch here,
as a runner would, so the flow plan → implement → check → review runs offline end to end.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from helmhive.reference_agent import rules
from helmhive.runner.adapters import TurnOutcome, TurnRequest

from .agent_harness import AdapterFactory
from .test_runner_reference_rules import governed_prompt, stage_schema

DIRECTIVES = "\n".join(
    [
        "Greet the world, and ship the data file.",
        "APPEND-LINE: app.txt :: world",
        "REPLACE-TEXT: app.txt :: hello => hi",
        "WRITE-BYTES: data/blob.bin :: 4096",
        "DELETE-FILE: old.txt",
        "APPEND-LINE: ../escape.txt :: must not be written",
        "IF-FINDINGS APPEND-LINE: fix.txt :: only after a review",
        "UNLESS-FINDINGS APPEND-LINE: first.txt :: first iteration",
        "REPLACE-TEXT: missing.txt :: a => b",
    ]
)


def git(cwd: Path, *args: str) -> str:
    identity = ("-c", "user.name=Helmhive Test", "-c", "user.email=test@helmhive.invalid")
    done = subprocess.run(["git", *identity, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout


def source_tree(workdir: str) -> tuple[Path, str]:
    """A git work tree with two committed files; returns it and its commit."""
    root = Path(workdir)
    git(root, "init", "-q")
    (root / "app.txt").write_text("hello\n")
    (root / "old.txt").write_text("to be deleted\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "source")
    return root, git(root, "rev-parse", "HEAD").strip()


def valid(stage: str, text: str) -> dict[str, Any]:
    data = json.loads(text)
    Draft202012Validator(stage_schema(stage)).validate(data)
    return dict(data)


async def run(make_adapter: AdapterFactory, prompt: str, cwd: Path, **request: Any) -> str:
    result = await make_adapter().run_turn(TurnRequest(prompt=prompt, cwd=str(cwd), **request))
    assert result.outcome is TurnOutcome.COMPLETED, result.message
    return result.text


async def test_implementation_writes_text_and_binary_files_in_its_cwd(
    make_adapter: AdapterFactory, workdir: str
) -> None:
    root, _ = source_tree(workdir)
    report = valid(
        "implementation", await run(make_adapter, governed_prompt("implementation", description=DIRECTIVES), root)
    )

    assert report["filesChanged"] == ["app.txt", "data/blob.bin", "first.txt", "old.txt"]
    assert report["notes"].splitlines() == [
        "APPEND-LINE app.txt: appended",
        "REPLACE-TEXT app.txt: replaced 1 occurrence(s)",
        "WRITE-BYTES data/blob.bin: written (4096 bytes)",
        "DELETE-FILE old.txt: deleted",
        "APPEND-LINE ../escape.txt: ignored (unsafe path)",
        "IF-FINDINGS APPEND-LINE fix.txt: skipped (no review findings)",
        "UNLESS-FINDINGS APPEND-LINE first.txt: created",
        "REPLACE-TEXT missing.txt: file missing",
    ]
    assert (root / "app.txt").read_text() == "hi\nworld\n"
    assert (root / "data" / "blob.bin").read_bytes() == rules.pseudo_random_bytes("data/blob.bin", 4096)
    assert (root / "first.txt").read_text() == "first iteration\n"
    assert not (root / "old.txt").exists()
    assert not (root / "fix.txt").exists() and not (root / "missing.txt").exists()
    assert not (root.parent / "escape.txt").exists()

    git(root, "add", "-A")
    numstat = sorted(git(root, "diff", "--cached", "--numstat").splitlines())
    assert numstat == ["-\t-\tdata/blob.bin", "0\t1\told.txt", "1\t0\tfirst.txt", "2\t1\tapp.txt"]


async def test_writes_up_to_8_mib_and_refuses_a_symlink_out_of_the_tree(
    make_adapter: AdapterFactory, workdir: str, tmp_path: Path
) -> None:
    root, _ = source_tree(workdir)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    description = "\n".join(
        [
            f"WRITE-BYTES: big.bin :: {rules.MAX_WRITE_BYTES}",
            f"WRITE-BYTES: bigger.bin :: {rules.MAX_WRITE_BYTES + 1}",
            "APPEND-LINE: link/escape.txt :: through a symlink",
        ]
    )
    report = valid(
        "implementation", await run(make_adapter, governed_prompt("implementation", description=description), root)
    )
    assert report["notes"].splitlines() == [
        "WRITE-BYTES big.bin: written (8388608 bytes)",
        "WRITE-BYTES bigger.bin: ignored (size must be 0 to 8388608)",
        "APPEND-LINE link/escape.txt: refused (outside the work tree)",
    ]
    assert (root / "big.bin").stat().st_size == rules.MAX_WRITE_BYTES
    assert not (root / "bigger.bin").exists()
    assert list(outside.iterdir()) == []


async def test_planning_and_review_never_edit_and_the_plan_is_deterministic(
    make_adapter: AdapterFactory, workdir: str
) -> None:
    root, _ = source_tree(workdir)
    plan_prompt = governed_prompt("planning", description=DIRECTIVES)
    first = await run(make_adapter, plan_prompt, root)
    again = await run(make_adapter, plan_prompt, root, model="reference-large", effort="high")
    assert first == again  # a fresh session and another model: the same bytes
    expected = rules.render_reply(plan_prompt, turn=1, model="reference-small", effort="medium", tool_results={})
    assert first == expected
    plan = valid("planning", first)
    assert [step["title"] for step in plan["steps"]] == [
        "Criterion 1: The greeting ends with a newline",
        "Criterion 2: The data file is binary",
    ]
    assert "app.txt, data/blob.bin, first.txt, fix.txt, missing.txt, old.txt" in plan["summary"]

    review = valid("review", await run(make_adapter, governed_prompt("review", description=DIRECTIVES), root))
    assert review["verdict"] == "approve"
    assert git(root, "status", "--porcelain") == ""  # neither stage touched the tree


async def implement_check_review(
    make_adapter: AdapterFactory, root: Path, commit: str, *, iteration: int
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """One iteration as a runner would run it: a fresh tree at the commit, the agent's edits, the
    patch from git, a check on the patched tree, then a review of the patch and the evidence."""
    git(root, "reset", "-q", "--hard", commit)
    git(root, "clean", "-q", "-fdx")
    findings = iteration > 1
    description = "\n".join(
        [
            "UNLESS-FINDINGS APPEND-LINE: app.txt :: BROKEN",
            "IF-FINDINGS APPEND-LINE: app.txt :: world",
            "WRITE-BYTES: data/blob.bin :: 2048",
        ]
    )
    prompt = governed_prompt("implementation", description=description, iteration=iteration, findings=findings)
    report = valid("implementation", await run(make_adapter, prompt, root))
    git(root, "add", "-A")
    patch = git(root, "diff", "--cached", "--binary", commit)
    outcome = "Failed" if "BROKEN" in (root / "app.txt").read_text() else "Passed"
    review_prompt = governed_prompt(
        "review", description=description, iteration=iteration, checks=(("unit", outcome),), patch=patch
    )
    review = valid("review", await run(make_adapter, review_prompt, root))
    return report, review, patch


async def test_a_change_goes_offline_from_a_failing_check_to_an_approved_patch(
    make_adapter: AdapterFactory, workdir: str, tmp_path: Path
) -> None:
    root, commit = source_tree(workdir)

    report, review, _ = await implement_check_review(make_adapter, root, commit, iteration=1)
    assert report["filesChanged"] == ["app.txt", "data/blob.bin"]
    assert review["verdict"] == "request-changes"
    assert [f for f in review["findings"] if f["severity"] == "major"] == [
        {"severity": "major", "message": "Check unit ended Failed; it must pass."}
    ]
    assert [c["met"] for c in review["criteria"]] == [False, False]

    report, review, patch = await implement_check_review(make_adapter, root, commit, iteration=2)
    assert report["filesChanged"] == ["app.txt", "data/blob.bin"]
    assert review["verdict"] == "approve"
    assert review["findings"] == [
        {"severity": "info", "message": "The patch changes 2 file(s): app.txt, data/blob.bin."}
    ]
    assert review["criteria"] == [
        {"criterion": 0, "met": True, "note": "met: approved"},
        {"criterion": 1, "met": True, "note": "met: approved"},
    ]

    # The approved patch, binary file included, applies to the exact commit.
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(root), str(clone))
    git(clone, "checkout", "-q", commit)
    (tmp_path / "change.patch").write_text(patch)
    git(clone, "apply", "--check", str(tmp_path / "change.patch"))
    git(clone, "apply", str(tmp_path / "change.patch"))
    assert (clone / "app.txt").read_text() == "hello\nworld\n"
    assert (clone / "data" / "blob.bin").read_bytes() == rules.pseudo_random_bytes("data/blob.bin", 2048)

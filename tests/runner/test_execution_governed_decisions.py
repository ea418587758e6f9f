"""The pure parts of governed jobs on the runner, and the patch round trip with real git (no cluster).

Which governed jobs may run, how a stored patch is verified and shown to a reviewer, how check
output is bounded, what a check may touch, and that a whole artifact is never cut. The git tests
run the runner's own ``run_patch_diff``/``run_patch_apply`` against a real repository whose git
dir lives outside its work tree, as a job's does.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from helmhive.api.common import FilesystemAccess, JobKind, NetworkAccess, ToolKind
from helmhive.api.envelope import OutputContract, OutputFormat
from helmhive.api.governed import CHECK_OUTPUT_TAIL_MAX, CheckEvidence, CheckOutcome, PatchRef
from helmhive.api.job import AgentJobSpec, JobRequest
from helmhive.api.reasons import Reason
from helmhive.api.runnerpool import AdapterType
from helmhive.policy.agentjob.prompts import build_agent_prompt
from helmhive.policy.agentjob.results import ARTIFACT_MAX_BYTES, PATCH_MAX_BYTES, build_bounded_result
from helmhive.runner.config import SandboxSettings
from helmhive.runner.jobs.governed import decide_governed_problem, decide_patch_digest, display_repository
from helmhive.runner.sandbox.workdir import (
    SandboxPlan,
    build_check_policy,
    build_sandbox_plan,
    sandbox_refusal,
    source_cache_dir,
)
from helmhive.runner.source.checks import (
    CHECK_PATH,
    OutputCapture,
    build_check_env,
    build_checks_message,
    decide_checks_reason,
    resolve_command,
)
from helmhive.runner.source.patches import (
    GitTree,
    PatchError,
    build_patch_section,
    count_patch_files,
    run_patch_apply,
    run_patch_diff,
)

COMMIT = "a" * 40
SOURCE = {"repository": "https://git.example/app.git", "commit": COMMIT}
PATCH = {"configMap": "impl-artifacts", "key": "patch.diff", "bytes": 10, "sha256": "b" * 64}
JOB = {"metadata": {"name": "impl", "namespace": "ns", "uid": "u1"}}


def _spec(kind: JobKind, **extra: object) -> AgentJobSpec:
    return AgentJobSpec.model_validate(
        {"workspace": "w", "jobKind": kind.value, "request": {"title": "t", "prompt": "p"}, **extra}
    )


@pytest.mark.parametrize(
    ("kind", "extra", "filesystem", "reason"),
    [
        pytest.param(JobKind.CHANGE_PLANNING, {}, FilesystemAccess.READ, Reason.SOURCE_REQUIRED, id="plan-no-source"),
        pytest.param(
            JobKind.CHANGE_IMPLEMENTATION, {}, FilesystemAccess.WRITE, Reason.SOURCE_REQUIRED, id="impl-no-source"
        ),
        pytest.param(
            JobKind.CHANGE_REVIEW, {"patch": PATCH}, FilesystemAccess.READ, Reason.SOURCE_REQUIRED, id="review-no-src"
        ),
        pytest.param(
            JobKind.CHANGE_REVIEW, {"source": SOURCE}, FilesystemAccess.READ, Reason.PATCH_UNAVAILABLE, id="no-patch"
        ),
        pytest.param(
            JobKind.IMPLEMENTATION_PROBE, {"source": SOURCE}, FilesystemAccess.NONE, Reason.INVALID_SPEC, id="no-fs"
        ),
        pytest.param(JobKind.CHANGE_PLANNING, {"source": SOURCE}, FilesystemAccess.READ, None, id="plan-ok"),
        pytest.param(
            JobKind.CHANGE_REVIEW, {"source": SOURCE, "patch": PATCH}, FilesystemAccess.READ, None, id="review-ok"
        ),
        pytest.param(JobKind.REVIEW_PROBE, {}, FilesystemAccess.READ, None, id="probe-without-source"),
    ],
)
def test_governed_jobs_fail_closed_without_their_inputs(
    kind: JobKind, extra: dict[str, object], filesystem: FilesystemAccess, reason: Reason | None
) -> None:
    verdict = decide_governed_problem(spec=_spec(kind, **extra), filesystem=filesystem)
    assert (verdict.reason if verdict else None) == reason
    assert verdict is None or (not verdict.succeeded and verdict.message)


def test_a_stored_patch_must_be_exactly_the_bytes_its_reference_names() -> None:
    text = "diff --git a/x b/x\n"
    raw = text.encode()
    ref = PatchRef(config_map="c", key="patch.diff", bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    assert decide_patch_digest(text=text, ref=ref) is None
    for altered in (text + " ", text.replace("x", "y")):
        verdict = decide_patch_digest(text=altered, ref=ref)
        assert verdict is not None and verdict.reason == Reason.PATCH_DIGEST_MISMATCH
        assert ref.sha256 in verdict.message


def test_messages_show_a_repository_without_its_userinfo() -> None:
    assert display_repository("https://user:pw@git.example:8443/a.git") == "https://git.example:8443/a.git"
    assert display_repository("git://127.0.0.1:9418/a.git") == "git://127.0.0.1:9418/a.git"


def test_the_reviewers_patch_section_is_whole_or_cut_at_a_line_with_a_note() -> None:
    small = "diff --git a/x b/x\n+one\n"
    assert build_patch_section(text=small, sha256="f" * 64) == (
        f"## Patch (sha256 {'f' * 64}, {len(small)} bytes)\n```diff\n{small}```\n"
    )
    big = "".join(f"+line {i:06d}\n" for i in range(20000))
    section = build_patch_section(text=big, sha256="f" * 64, max_bytes=64 * 1024)
    body = section.split("```diff\n", 1)[1].rsplit("```", 1)[0]
    shown, note = body.rsplit("\n[cut:", 1)
    assert len(shown.encode()) <= 64 * 1024 and big.startswith(shown + "\n")
    assert f"the patch is {len(big)} bytes" in note and "whole patched tree is in the working directory" in note
    assert section.startswith(f"## Patch (sha256 {'f' * 64}, {len(big)} bytes)\n")


def test_context_sections_go_before_the_output_contract_and_change_nothing_when_absent() -> None:
    contract = OutputContract(format=OutputFormat.TEXT)
    request = JobRequest(title="t", prompt="p")
    plain = build_agent_prompt(instructions="i", request=request, memory_context="", contract=contract)
    assert (
        build_agent_prompt(instructions="i", request=request, memory_context="", contract=contract, context_sections=())
        == plain
    )
    with_patch = build_agent_prompt(
        instructions="i", request=request, memory_context="", contract=contract, context_sections=["## Patch\nx\n"]
    )
    assert with_patch == plain.replace("\n\n## Output contract", "\n\n## Patch\nx\n\n## Output contract")


def test_a_patch_is_stored_whole_beside_artifacts_that_may_be_cut() -> None:
    patch = "p" * PATCH_MAX_BYTES
    transcript = "t" * (ARTIFACT_MAX_BYTES * 2)
    output = {"k": "v" * ARTIFACT_MAX_BYTES * 2}
    result = build_bounded_result(job=JOB, text=transcript, output=output, whole={"patch.diff": patch})
    assert result.config_map is not None
    assert result.config_map["data"]["patch.diff"] == patch
    refs = {a.key: a for a in result.artifacts}
    assert not refs["patch.diff"].truncated and refs["transcript.txt"].truncated
    assert sum(len(v.encode()) for v in result.config_map["data"].values()) <= 768 * 1024
    with pytest.raises(ValueError, match="may not be cut"):
        build_bounded_result(job=JOB, text="", output=None, whole={"patch.diff": patch + "p"})


def _evidence(name: str, outcome: CheckOutcome, code: int | None) -> CheckEvidence:
    return CheckEvidence(name=name, outcome=outcome, exit_code=code)


def test_the_checks_reason_and_message() -> None:
    assert decide_checks_reason([]) is Reason.NO_CHECKS
    assert build_checks_message([]) == "NoChecks: the job declares no checks"
    passed = [_evidence("a", CheckOutcome.PASSED, 0)]
    assert decide_checks_reason(passed) is Reason.CHECKS_PASSED
    assert build_checks_message(passed) == "ChecksPassed: all 1 check(s) passed (a: Passed)"
    mixed = [*passed, _evidence("b", CheckOutcome.FAILED, 2), _evidence("c", CheckOutcome.TIMED_OUT, None)]
    assert decide_checks_reason(mixed) is Reason.CHECKS_FAILED
    assert build_checks_message(mixed) == (
        "ChecksFailed: 2 of 3 check(s) did not pass (a: Passed; b: Failed, exit 2; c: TimedOut)"
    )


def test_check_output_keeps_its_end_counts_and_hashes_all_of_it() -> None:
    capture = OutputCapture()
    chunks = [("é" * 5000).encode(), b"x" * 3, b"\n" + "界".encode() * 1000]
    for chunk in chunks:
        capture.feed(chunk)
    whole = b"".join(chunks)
    assert capture.total == len(whole) and capture.sha256 == hashlib.sha256(whole).hexdigest()
    assert capture.tail() == whole.decode()[-CHECK_OUTPUT_TAIL_MAX:]
    assert "\ufffd" not in capture.tail()
    assert not capture.from_launcher


def _plan(tmp_path: Path, **settings: object) -> SandboxPlan:
    return build_sandbox_plan(
        state_dir=tmp_path / "state",
        job_dir="ns.impl.1234abcd",
        filesystem=FilesystemAccess.WRITE,
        network=NetworkAccess.DISABLED,
        tools=[ToolKind.READ, ToolKind.EDIT],
        adapter_type=AdapterType.ACP,
        settings=SandboxSettings.model_validate(settings),
        runtime_paths=["/opt/python"],
        credential_dir=tmp_path / "login",
        landlock_abi=6,
    )


def test_a_check_may_write_only_its_tree_and_tmp_and_open_no_connection(tmp_path: Path) -> None:
    plan = _plan(tmp_path, writePaths=[str(tmp_path / "agent-extra")])
    policy = build_check_policy(plan)
    assert policy["tcpConnect"] == []  # not even the provider's port
    assert policy["write"] == [str(plan.workdir), str(plan.tmpdir)]
    assert str(tmp_path / "login") not in policy["read"] + policy["write"]
    env = build_check_env(plan)
    assert env == {
        "PATH": CHECK_PATH,
        "HOME": str(plan.tmpdir),
        "TMPDIR": str(plan.tmpdir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


def test_the_runners_git_state_is_never_granted(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    private = [str(plan.git_dir), str(plan.scratch), str(source_cache_dir(tmp_path / "state"))]
    for granted in (*plan.read_paths, *plan.write_paths):
        assert not any(p == granted or p.startswith(granted.rstrip("/") + "/") for p in private), granted
    exposing = _plan(tmp_path, readPaths=[str(tmp_path / "state")])
    refusal = sandbox_refusal(plan=exposing, settings=SandboxSettings(), landlock_abi=6)
    assert refusal is not None and "source.git" in refusal and "source-cache" in refusal


def test_a_check_command_is_resolved_on_the_fixed_path_or_in_the_tree(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    assert resolve_command("sh", workdir=tmp_path) is not None
    assert resolve_command("no-such-tool-xyz", workdir=tmp_path) is None
    assert resolve_command("./run.sh", workdir=tmp_path) is None  # not executable
    script.chmod(0o755)
    assert resolve_command("./run.sh", workdir=tmp_path) == str(tmp_path / "run.sh")


# --- the patch round trip with real git --------------------------------------------------------


def _git(tree: GitTree, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "GIT_DIR": str(tree.git_dir),
        "GIT_WORK_TREE": str(tree.work_tree),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example",
    }
    done = subprocess.run(["git", *args], cwd=tree.work_tree, env=env, capture_output=True, check=True)
    return done.stdout.decode().strip()


def _checkout(root: Path, files: dict[str, bytes]) -> tuple[GitTree, str]:
    """A work tree with ``files`` committed, its git dir beside it (as a job's is)."""
    tree = GitTree(git_dir=root / "source.git", work_tree=root / "work", scratch=root / "runner")
    for directory in (tree.work_tree, tree.scratch):
        directory.mkdir(parents=True)
    _git(tree, "init", "-q")
    for name, content in files.items():
        path = tree.work_tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "base")
    commit = _git(tree, "rev-parse", "HEAD")
    # A job's git dir has no index of its own worth trusting; drop it as a job's never had one.
    (tree.git_dir / "index").unlink()
    return tree, commit


BASE = {"a.txt": b"one\n", "gone.txt": b"bye\n", "bin/tool": b"#!/bin/sh\n", "img.bin": bytes(range(256))}


def test_the_patch_carries_every_kind_of_change_and_rebuilds_the_tree(tmp_path: Path) -> None:
    tree, commit = _checkout(tmp_path / "impl", BASE)
    assert run_patch_diff(tree=tree, commit=commit) is None  # nothing changed yet
    work = tree.work_tree
    (work / "a.txt").write_bytes(b"one\ntwo\n")
    (work / "gone.txt").unlink()
    (work / "bin/tool").chmod(0o755)
    (work / "img.bin").write_bytes(bytes(reversed(range(256))))
    (work / "new dir").mkdir()
    (work / "new dir/ünï.txt").write_text("new\n")
    (work / "link").symlink_to("a.txt")
    patch = run_patch_diff(tree=tree, commit=commit)
    assert patch is not None and patch.files == 6 == count_patch_files(patch.text)
    assert patch.sha256 == hashlib.sha256(patch.text.encode()).hexdigest() and patch.bytes == len(patch.text)
    assert not list(tree.scratch.iterdir())  # the private index is gone

    fresh, _ = _checkout(tmp_path / "review", BASE)
    run_patch_apply(tree=fresh, text=patch.text)
    for name in ("a.txt", "img.bin", "new dir/ünï.txt"):
        assert (fresh.work_tree / name).read_bytes() == (work / name).read_bytes()
    assert not (fresh.work_tree / "gone.txt").exists()
    assert os.access(fresh.work_tree / "bin/tool", os.X_OK)
    assert os.readlink(fresh.work_tree / "link") == "a.txt"
    with pytest.raises(PatchError) as again:  # the tree has moved on: it does not apply twice
        run_patch_apply(tree=fresh, text=patch.text)
    assert again.value.reason == Reason.PATCH_DOES_NOT_APPLY


def test_a_patch_that_is_too_large_or_not_text_is_refused(tmp_path: Path) -> None:
    tree, commit = _checkout(tmp_path / "impl", BASE)
    (tree.work_tree / "a.txt").write_bytes(b"x\n" * 600)
    with pytest.raises(PatchError) as large:
        run_patch_diff(tree=tree, commit=commit, max_bytes=1000)
    assert large.value.reason == Reason.PATCH_TOO_LARGE and "over the 1000-byte maximum" in large.value.message
    (tree.work_tree / "a.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(PatchError) as latin:
        run_patch_diff(tree=tree, commit=commit)
    assert latin.value.reason == Reason.PATCH_NOT_TEXT and ".gitattributes" in latin.value.message
    (tree.work_tree / ".gitattributes").write_text("a.txt binary\n")  # the documented way out
    patch = run_patch_diff(tree=tree, commit=commit)
    assert patch is not None and "GIT binary patch" in patch.text

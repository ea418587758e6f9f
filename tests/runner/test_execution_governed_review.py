"""Review and planning jobs of governed changes: the runner rebuilds the patched tree itself.

A review job names the implementation's patch (``spec.patch``: its ConfigMap, key and SHA-256).
Its runner reads the patch through the API, checks the digest before the job starts, checks out
the exact commit, applies the patch with ``git apply``, makes the tree read-only and shows the
patch to the agent in a ``## Patch`` section. Real runner, reference agent, API server, git daemon.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from kubernetes import client

from harness import wait_for
from helmhive.api.common import JobKind
from helmhive.runner.sandbox.workdir import job_dir_name

from .execution_governed import MANIFEST_CHECK, GovernedRig, governed, tree_manifest
from .execution_harness import GROUP, JOBS, VERSION, Runner, condition

__all__ = ["governed"]

FILES = {"README.md": "# demo\n", "src/app.py": "print('hello')\n", "old.txt": "bye\n"}
EDITS = (
    "APPEND-LINE: README.md :: reviewed line",
    "DELETE-FILE: old.txt",
    "WRITE-BYTES: assets/logo.bin :: 2048",
)


def _ended(job: dict[str, Any]) -> tuple[str, str, str]:
    cond = condition(job, "Succeeded")
    assert cond is not None
    return cond["status"], cond["reason"], cond["message"]


def _implemented(governed: GovernedRig, runner: Runner, repo_name: str = "app") -> tuple[dict[str, Any], str, str]:
    """Run an implementation job; its ``result.patch``, the stored text and the manifest of its tree."""
    repo = governed.repo(repo_name, FILES)
    governed.create(
        "impl",
        runner=runner,
        kind=JobKind.CHANGE_IMPLEMENTATION,
        directives=EDITS,
        source=governed.source(repo),
        checks=[{"name": "manifest", "command": MANIFEST_CHECK}],
    )
    job = governed.execution.wait_finished("impl")
    assert _ended(job)[:2] == ("True", "Completed"), job["status"]
    ref, text = governed.stored_patch(job)
    return ref, text, job["status"]["result"]["checks"][0]["outputTail"]


def _prompt_of(runner: Runner, stage: str) -> str:
    prompts = [p["prompt"] for p in runner.prompts() if f"Governed change stage: {stage}" in p["prompt"]]
    assert prompts, runner.prompts()
    return str(prompts[-1])


def _set_cancel(governed: GovernedRig, name: str) -> None:
    governed.execution.kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, governed.execution.namespace, JOBS, name, {"spec": {"cancel": True}}
    )


def test_a_review_sees_the_patch_and_the_patched_tree_read_only(governed: GovernedRig) -> None:
    runner = governed.execution.start_runner()
    ref, text, manifest = _implemented(governed, runner)
    source = governed.source(governed.repos["app"])

    governed.create("review", runner=runner, kind=JobKind.CHANGE_REVIEW, source=source, patch=ref)
    job = governed.execution.wait_finished("review")
    assert _ended(job)[:2] == ("True", "Completed"), job["status"]
    assert job["status"]["result"]["output"]["verdict"] == "approve"  # the reference agent saw a ## Patch
    prompt = _prompt_of(runner, "review")
    section = f"## Patch (sha256 {ref['sha256']}, {ref['bytes']} bytes)\n```diff\n{text}```\n"
    assert section in prompt
    assert prompt.index(section) < prompt.index("## Output contract")
    assert "## Patch" not in _prompt_of(runner, "implementation")
    (event,) = governed.execution.wait_events("review", "Started")
    started = str(event.message)
    assert f"patch sha256 {ref['sha256'][:16]}" in started and "filesystem read" in started

    # A second review stalls, so the test can look at the tree its runner rebuilt.
    governed.create(
        "review-tree",
        runner=runner,
        kind=JobKind.CHANGE_REVIEW,
        directives=("REFERENCE-AGENT: stall",),
        source=source,
        patch=ref,
    )
    uid = governed.execution.job("review-tree")["metadata"]["uid"]
    job_dir = job_dir_name(namespace=governed.execution.namespace, name="review-tree", uid=uid)
    root = runner.rig.state_dir / "jobs" / job_dir

    def prompted() -> bool:  # the stalled prompt is not in the prompt log; the method log has it
        assert condition(governed.execution.job("review-tree"), "Succeeded") is None
        return runner.methods().count("session/prompt") == 3

    wait_for(prompted, timeout=60, describe="the stalled review to be prompted")
    work = root / "work"
    assert tree_manifest(work) == manifest  # exactly the implementer's tree
    assert not (work / ".git").exists() and (root / "source.git" / "HEAD").is_file()
    for path in [work, *work.rglob("*")]:
        assert not os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), path
    _set_cancel(governed, "review-tree")
    assert _ended(governed.execution.wait_finished("review-tree"))[1] == "Cancelled"


def _fake_patch(governed: GovernedRig, name: str, text: str) -> dict[str, Any]:
    governed.execution.kube.core.create_namespaced_config_map(
        governed.execution.namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"patch.diff": text}),
    )
    raw = text.encode()
    return {"configMap": name, "key": "patch.diff", "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


NOT_APPLYING = """\
diff --git a/README.md b/README.md
--- a/README.md
+++ b/README.md
@@ -1 +1 @@
-# not what the commit holds
+# changed
"""


def test_a_patch_that_is_missing_altered_or_does_not_apply_ends_the_review(governed: GovernedRig) -> None:
    repo = governed.repo("app", FILES)
    runner = governed.execution.start_runner()
    source = governed.source(repo)
    honest = _fake_patch(governed, "honest-artifacts", NOT_APPLYING)
    altered = {**honest, "sha256": hashlib.sha256(b"something else").hexdigest()}
    cases = {
        "gone": ({**honest, "configMap": "no-such-artifacts"}, "PatchUnavailable", "does not exist"),
        "nokey": ({**honest, "key": "other.diff"}, "PatchUnavailable", "has no key other.diff"),
        "altered": (altered, "PatchDigestMismatch", honest["sha256"]),
        "stale": (honest, "PatchDoesNotApply", "git apply refused the patch"),
    }
    for name, (patch, _, _) in cases.items():
        governed.create(name, runner=runner, kind=JobKind.CHANGE_REVIEW, source=source, patch=patch)
    for name, (_, reason, said) in cases.items():
        job = governed.execution.wait_finished(name)
        status, got, message = _ended(job)
        assert (status, got) == ("False", reason), (name, job["status"])
        assert said in message, (name, message)
    governed.execution.wait_events("stale", "Started")  # a job that started, and whose Event came
    started = {n for n in cases if any(e.reason == "Started" for e in governed.execution.events(n))}
    assert started == {"stale"}  # the patch is read and verified before a job starts
    assert not runner.prompts()  # no agent was ever prompted


def test_a_review_without_a_patch_and_a_governed_job_without_a_source_fail_closed(governed: GovernedRig) -> None:
    repo = governed.repo("app", FILES)
    runner = governed.execution.start_runner()
    governed.create("nopatch", runner=runner, kind=JobKind.CHANGE_REVIEW, source=governed.source(repo))
    governed.create("nosource", runner=runner, kind=JobKind.CHANGE_PLANNING)
    nopatch = _ended(governed.execution.wait_finished("nopatch"))
    nosource = _ended(governed.execution.wait_finished("nosource"))
    assert nopatch[:2] == ("False", "PatchUnavailable") and "spec.patch" in nopatch[2]
    assert nosource[:2] == ("False", "SourceRequired") and "spec.source" in nosource[2]
    assert not runner.prompts()


def test_planning_gets_the_exact_source_read_only(governed: GovernedRig) -> None:
    repo = governed.repo("app", FILES)
    runner = governed.execution.start_runner()
    governed.create(
        "plan",
        runner=runner,
        kind=JobKind.CHANGE_PLANNING,
        source=governed.source(repo),
    )
    job = governed.execution.wait_finished("plan")
    assert _ended(job)[:2] == ("True", "Completed"), job["status"]
    assert job["status"]["result"]["output"]["steps"]
    assert job["status"]["result"].get("patch") is None and not job["status"]["result"].get("checks")
    (event,) = governed.execution.wait_events("plan", "Started")
    started = str(event.message)
    assert "filesystem read" in started and repo.head in started
    assert not list(Path(runner.rig.state_dir, "jobs").iterdir())

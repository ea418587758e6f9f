"""One job cannot see another's HOME: a HOME per session binding, and one per job without a binding.

The reference agent writes files into its own ``$HOME`` (``WRITE-HOME-FILE``) and tries to read
other homes by absolute path (``READ-FILE``); it reports what happened in its JSON answer, never
the content. A binding's HOME is ``<state>/homes/<binding>/home`` and lives as long as the
binding: a resumed job finds what the chain's earlier jobs left there, a reset empties it before
the binding's next job, and a runner that starts removes the homes of bindings that were deleted.
See ``docs/security.md``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import ClusterHandle, wait_for
from helmhive.api.common import JobKind

from .execution_harness import ExecutionRig, Runner, condition

RESUME = {"session": {"policy": "resume"}}


def _run(
    execution: ExecutionRig, name: str, runner: Runner, prompt: str, *, profile: str, session: dict[str, Any]
) -> dict[str, Any]:
    execution.create_job(
        name, runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt, profile=profile, profile_spec=session
    )
    job = execution.wait_finished(name)
    assert condition(job, "Succeeded")["status"] == "True", job["status"]
    return job


def _home(runner: Runner, binding: str) -> Path:
    return runner.rig.state_dir / "homes" / binding / "home"


def _started(execution: ExecutionRig, name: str) -> str:
    (event,) = execution.wait_events(name, "Started")
    return str(event.message)


def test_jobs_of_different_bindings_cannot_read_each_others_home(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    first = _run(
        execution, "alpha", runner, "Review.\nWRITE-HOME-FILE: alpha-notes.txt", profile="alpha", session=RESUME
    )
    alpha = first["status"]["session"]["binding"]
    assert first["status"]["result"]["output"]["homeFiles"] == {"alpha-notes.txt": "written"}
    alpha_file = _home(runner, alpha) / "alpha-notes.txt"
    assert alpha_file.is_file()  # the agent's HOME was its binding's
    assert "home binding's" in _started(execution, "alpha")

    # Another profile, so another binding: its own HOME, and no way into alpha's.
    prompt = f"Review.\nWRITE-HOME-FILE: beta-notes.txt\nREAD-FILE: {alpha_file}"
    second = _run(execution, "beta", runner, prompt, profile="beta", session=RESUME)
    beta = second["status"]["session"]["binding"]
    assert beta != alpha
    output = second["status"]["result"]["output"]
    assert output["homeFiles"] == {"beta-notes.txt": "written"}
    assert output["reads"] == {str(alpha_file): "denied (EACCES)"}  # Landlock: only its own HOME
    beta_file = _home(runner, beta) / "beta-notes.txt"
    assert beta_file.is_file()

    # A job without a binding (policy fresh) has a HOME of its own, in its job directory, and
    # can read neither binding's; its HOME goes with the job.
    prompt = f"Review.\nWRITE-HOME-FILE: own.txt\nREAD-FILE: {alpha_file}\nREAD-FILE: {beta_file}"
    fresh = _run(execution, "gamma", runner, prompt, profile="gamma", session={})
    output = fresh["status"]["result"]["output"]
    assert fresh["status"]["session"] == {"mode": "fresh"}
    assert output["homeFiles"] == {"own.txt": "written"}
    assert output["reads"] == {str(alpha_file): "denied (EACCES)", str(beta_file): "denied (EACCES)"}
    assert "home own" in _started(execution, "gamma")
    assert not list((runner.rig.state_dir / "jobs").glob("*/home"))  # removed with the job
    assert not list(runner.rig.state_dir.rglob("own.txt"))


def _reset(cluster: ClusterHandle, binding: str, namespace: str) -> None:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    done = subprocess.run(
        [sys.executable, "-m", "helmhive", "sessions", "reset", binding, "-n", namespace],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_a_binding_home_lives_as_long_as_its_binding(execution: ExecutionRig, cluster: ClusterHandle) -> None:
    runner = execution.start_runner()
    first = _run(execution, "first", runner, "Review.\nWRITE-HOME-FILE: settings.txt", profile="probe", session=RESUME)
    binding = first["status"]["session"]["binding"]
    settings = _home(runner, binding) / "settings.txt"

    # A resumed job of the same binding finds what the chain's first job left in its HOME.
    second = _run(execution, "second", runner, f"Review.\nREAD-FILE: {settings}", profile="probe", session=RESUME)
    assert second["status"]["session"] == {"binding": binding, "mode": "resumed"}
    assert second["status"]["result"]["output"]["reads"][str(settings)].startswith("read (")

    # An administrator resets the binding: its next job starts a new chain in an empty HOME.
    _reset(cluster, binding, execution.namespace)
    third = _run(execution, "third", runner, f"Review.\nREAD-FILE: {settings}", profile="probe", session=RESUME)
    assert third["status"]["session"] == {"binding": binding, "mode": "fresh"}
    assert third["status"]["result"]["output"]["reads"] == {str(settings): "failed (ENOENT)"}
    assert "home binding's (emptied: reset or re-created)" in _started(execution, "third")
    assert _home(runner, binding).is_dir() and not settings.exists()

    # Another binding's HOME, whose binding is deleted while the runner is down, is gone when it starts again.
    other = _run(execution, "other", runner, "Review.\nWRITE-HOME-FILE: x.txt", profile="other", session=RESUME)
    deleted = other["status"]["session"]["binding"]
    assert _home(runner, deleted).is_dir()
    runner.proc.terminate()
    assert runner.proc.wait() == 0
    execution.kube.custom.delete_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", execution.namespace, "sessionbindings", deleted
    )
    restarted = execution.start_runner()

    def swept() -> bool:
        return not (restarted.rig.state_dir / "homes" / deleted).exists()

    def removed() -> list[dict[str, Any]]:
        return [
            line
            for line in restarted.proc.lines()
            if line.get("message") == "removed the homes of deleted session bindings"
        ]

    wait_for(swept, timeout=60, describe=f"the HOME of deleted binding {deleted} to be removed")
    assert _home(restarted, binding).is_dir()  # a binding that exists keeps its HOME
    # The line follows the removal: the directory can be gone before the test has read the line.
    wait_for(lambda: bool(removed()), timeout=30, describe="the runner's line about the removed homes")
    assert removed()[0]["bindings"] == [deleted]

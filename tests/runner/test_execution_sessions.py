"""Session continuity on the runner: resume, fork, governed-fresh, reset, and the session id never leaking.

The reference agent prefixes every native session id with a canary, so the test can show the id
reaches the runner's sessions Secret and nowhere else: not job status, Events, the runner's log,
SessionBindings, AuditRecords or ``helmhive sessions`` output.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Any

from harness import ClusterHandle
from helmhive.api.common import JobKind

from .execution_governed import GovernedRig, governed
from .execution_harness import ExecutionRig, Runner, condition

__all__ = ["governed"]  # a fixture (governed jobs need a source to check out)

CANARY = "canary-sid-5e7a91"
RESUME = {"session": {"policy": "resume"}}
FORK = {"session": {"policy": "fork"}}


def _run(execution: ExecutionRig, name: str, runner: Runner, profile_spec: dict[str, Any]) -> dict[str, Any]:
    execution.create_job(
        name, runner=runner, kind=JobKind.IMPLEMENTATION_PROBE, prompt=f"Job {name}.", profile_spec=profile_spec
    )
    job = execution.wait_finished(name)
    assert condition(job, "Succeeded")["status"] == "True", job["status"]
    return job


def _turn(job: dict[str, Any]) -> int:
    line = next(line for line in job["status"]["result"]["summary"].splitlines() if line.startswith("turn="))
    return int(line.split()[0].removeprefix("turn="))


def _cli(cluster: ClusterHandle, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    done = subprocess.run(
        [sys.executable, "-m", "helmhive", "sessions", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_resume_continues_a_chain_and_another_runner_starts_its_own(
    execution: ExecutionRig, cluster: ClusterHandle
) -> None:
    canary_env = {"HELMHIVE_REFERENCE_AGENT_SESSION_PREFIX": CANARY}
    first_runner = execution.start_runner(env=canary_env)
    first = _run(execution, "first", first_runner, RESUME)
    binding_name = first["status"]["session"]["binding"]
    assert first["status"]["session"] == {"binding": binding_name, "mode": "fresh"} and _turn(first) == 1
    second = _run(execution, "second", first_runner, RESUME)
    assert second["status"]["session"] == {"binding": binding_name, "mode": "resumed"}
    assert _turn(second) == 2  # the agent saw the first job's turn
    assert first_runner.methods().count("session/load") == 1  # a fresh agent process loaded the session
    binding = execution.binding(binding_name)
    assert binding["spec"]["runner"] == "pool-a-0" and binding["spec"]["provider"] == "reference"
    status = binding["status"]
    assert (status["stored"], status["turns"], status["lastJob"]) == (True, 2, "second")
    assert (status["secretName"], status["secretKey"]) == ("helmhive-sessions-pool-a-0", binding_name)
    stored = base64.b64decode(execution.sessions_data("pool-a-0")[binding_name]).decode()
    assert stored.startswith(CANARY)  # the canary was planted where it belongs

    other_runner = execution.start_runner(index=1, env=canary_env)
    third = _run(execution, "third", other_runner, RESUME)
    assert third["status"]["session"]["mode"] == "fresh" and _turn(third) == 1
    other = third["status"]["session"]["binding"]
    assert other != binding_name and execution.binding(other)["spec"]["runner"] == "pool-a-1"

    # An administrator resets the first chain: its next job starts a new one.
    reset = _cli(cluster, "reset", binding_name, "-n", execution.namespace)
    assert "the next job on it starts a fresh session" in reset
    fourth = _run(execution, "fourth", first_runner, RESUME)
    assert fourth["status"]["session"] == {"binding": binding_name, "mode": "fresh"} and _turn(fourth) == 1
    assert (
        execution.binding(binding_name)["status"]["turns"] == 1
        and execution.binding(binding_name)["status"]["resets"] == 1
    )

    # The native id is nowhere but the Secret. The last job's final Event comes after its status:
    # wait for it, so the sweep reads every Event the jobs make.
    execution.wait_events("fourth", "Completed")
    listed = _cli(cluster, "list", "-n", execution.namespace, "-o", "json")
    jobs = [execution.job(name) for name in ("first", "second", "third", "fourth")]
    events = execution.kube.core.list_namespaced_event(execution.namespace).items
    audit = execution.kube.custom.list_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", execution.namespace, "auditrecords"
    )
    places = {
        "job status": json.dumps([job["status"] for job in jobs]),
        "events": json.dumps([(e.reason, e.message) for e in events]),
        "runner logs": first_runner.proc.raw_log() + other_runner.proc.raw_log(),
        "session bindings": json.dumps([execution.binding(binding_name), execution.binding(other)]),
        "audit records": json.dumps(audit),
        "sessions CLI": listed + reset,
    }
    assert {where: CANARY in text for where, text in places.items()} == dict.fromkeys(places, False)
    assert binding_name in listed


def test_fork_branches_from_the_bound_session(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    base = _run(execution, "base", runner, FORK)
    binding_name = base["status"]["session"]["binding"]
    assert base["status"]["session"]["mode"] == "fresh"  # nothing to fork yet: a new chain
    for name in ("branch-a", "branch-b"):
        job = _run(execution, name, runner, FORK)
        assert job["status"]["session"] == {"binding": binding_name, "mode": "forked"}
        assert _turn(job) == 2  # seeded from the base's one turn, never from the other branch
    status = execution.binding(binding_name)["status"]
    assert (status["turns"], status["lastJob"]) == (1, "base")  # a fork leaves the binding as it was
    assert runner.methods().count("session/fork") == 2


def test_fork_fails_closed_when_the_agent_cannot_fork(execution: ExecutionRig) -> None:
    runner = execution.start_runner(mode="no-fork")
    _run(execution, "base", runner, FORK)
    execution.create_job(
        "branch", runner=runner, kind=JobKind.IMPLEMENTATION_PROBE, prompt="Branch.", profile_spec=FORK
    )
    job = execution.wait_finished("branch")
    succeeded = condition(job, "Succeeded")
    assert succeeded is not None and (succeeded["status"], succeeded["reason"]) == ("False", "ForkUnsupported")
    assert runner.methods().count("session/prompt") == 1  # never silently run in a fresh session


def test_resume_without_the_stored_id_fails_closed(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    first = _run(execution, "first", runner, RESUME)
    binding_name = first["status"]["session"]["binding"]
    execution.kube.core.patch_namespaced_secret(
        "helmhive-sessions-pool-a-0", execution.namespace, [{"op": "remove", "path": f"/data/{binding_name}"}]
    )
    execution.create_job(
        "second", runner=runner, kind=JobKind.IMPLEMENTATION_PROBE, prompt="Go on.", profile_spec=RESUME
    )
    job = execution.wait_finished("second")
    assert condition(job, "Succeeded")["reason"] == "SessionNotFound"
    assert "reset the binding" in condition(job, "Succeeded")["message"]
    assert runner.methods().count("session/prompt") == 1


def test_governed_jobs_always_start_fresh(execution: ExecutionRig, governed: GovernedRig) -> None:
    runner = execution.start_runner()
    source = governed.source(governed.repo("app", {"README.md": "# app\n"}))  # governed work needs one
    for name in ("plan-1", "plan-2"):
        execution.create_job(
            name, runner=runner, kind=JobKind.CHANGE_PLANNING, prompt="Plan the change.", spec_extra={"source": source}
        )
        job = execution.wait_finished(name)
        assert condition(job, "Succeeded")["status"] == "True", job["status"]
        assert job["status"]["session"] == {"mode": "fresh"}
        assert job["status"]["result"]["output"]["turn"] == 1
    listed = execution.kube.custom.list_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", execution.namespace, "sessionbindings"
    )
    assert listed["items"] == []
    assert runner.methods().count("session/load") == 0

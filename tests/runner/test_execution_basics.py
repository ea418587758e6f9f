"""AgentJobs run end to end by the runner program: success, structured output, the output contract, artifacts.

Each test starts ``helmhive runner run`` as a pod would (pod-bound token, the Role and admission
policy of ``docs/execution.md``), routes jobs to it with the admin client in the API's own shapes,
and reads what the runner wrote back. The agent is the deterministic reference agent over ACP.
"""

from __future__ import annotations

import hashlib
import json

from harness import wait_for
from helmhive.api.common import JobKind
from helmhive.policy.agentjob.results import SUMMARY_MAX_CHARS
from helmhive.reference_agent.session import ENV_SLOW_INTERVAL, ENV_SLOW_STEPS

from .execution_harness import ExecutionRig, condition


def test_connection_test_job_runs_and_succeeds(execution: ExecutionRig) -> None:
    # The turn sends progress for about 10 s, long enough to be seen running and counted by the
    # report on a loaded machine (the test polls for both; a 1 s turn could end in between).
    runner = execution.start_runner(env={ENV_SLOW_STEPS: "25", ENV_SLOW_INTERVAL: "0.4"})
    execution.create_job("hello", runner=runner, prompt="Say hello.\nREFERENCE-AGENT: slow")

    running = execution.wait_running("hello")
    cond = condition(running, "Running")
    assert cond is not None and cond["reason"] == "Started"
    assert "running on runner pool-a-0" in cond["message"] and "session fresh" in cond["message"]
    assert running["status"]["result"]["outcome"] == "Started" and running["status"]["result"]["startedAt"]
    ready = condition(running, "Ready")
    assert ready is not None and ready["status"] == "Unknown"
    wait_for(lambda: runner.rig.report()["activeJobs"] == 1, timeout=60, describe="the report to count the job")

    job = execution.wait_finished("hello")
    status = job["status"]
    for ctype, value in (("Succeeded", "True"), ("Ready", "True"), ("Running", "False")):
        got = condition(job, ctype)
        assert got is not None and (got["status"], got["reason"]) == (value, "Completed"), ctype
    result = status["result"]
    assert result["outcome"] == "Completed"
    assert result["startedAt"] <= result["completedAt"]
    assert result["summary"].startswith("helmhive-reference-agent: deterministic reference agent, not a model.")
    assert "turn=1 model=reference-small" in result["summary"]
    assert status["session"] == {"mode": "fresh"}
    routed = condition(job, "Routed")  # the operator's condition and assignment are left alone
    assert routed is not None and (routed["status"], routed["reason"], routed["message"]) == (
        "True",
        "Assigned",
        "test routing",
    )
    assert status["assignment"]["runner"] == "pool-a-0"
    execution.wait_events("hello", "Started")
    execution.wait_events("hello", "Completed")  # posted after the final status: waited for
    wait_for(lambda: runner.rig.report()["activeJobs"] == 0, timeout=60, describe="the report to drop the job")
    # The prompt the agent got is the policy core's: instructions, request, text contract.
    prompt = runner.prompts()[-1]["prompt"]
    assert prompt.startswith("## Instructions (from the platform team's profile)\nYou are tested by helmhive.")
    assert "## Request\nTitle: test hello\nSay hello." in prompt
    assert prompt.rstrip().endswith("## Output contract\nAnswer in plain text.")
    assert runner.methods().count("session/prompt") == 1


def test_structured_review_job_returns_validated_json(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    execution.create_job("review", runner=runner, kind=JobKind.REVIEW_PROBE, prompt="Review the diff.")
    job = execution.wait_finished("review")
    assert condition(job, "Succeeded")["status"] == "True", job["status"]
    output = job["status"]["result"]["output"]
    assert output["verdict"] == "approve"
    assert output["findings"] == [] and isinstance(output["summary"], str)
    assert output["agent"] == "helmhive-reference-agent" and output["turn"] == 1
    prompt = runner.prompts()[-1]["prompt"]
    assert "OUTPUT-CONTRACT: json" in prompt and '"verdict"' in prompt  # the envelope's schema was sent
    assert runner.methods().count("session/prompt") == 1


def test_one_repair_turn_fixes_an_invalid_answer(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    prompt = "Review the diff.\nREFERENCE-AGENT: invalid-output"  # only the first answer is broken
    execution.create_job("repaired", runner=runner, kind=JobKind.REVIEW_PROBE, prompt=prompt)
    job = execution.wait_finished("repaired")
    assert condition(job, "Succeeded")["status"] == "True", job["status"]
    assert "one repair turn" in condition(job, "Succeeded")["message"]
    assert job["status"]["result"]["output"]["turn"] == 2  # the repair turn ran in the same session
    prompts = runner.prompts()
    assert len(prompts) == 2
    assert prompts[1]["prompt"].startswith("Your answer did not satisfy the output contract. Errors:")
    assert "'verdict' is a required property" in prompts[1]["prompt"]


def test_output_contract_violation_fails_after_exactly_one_repair_turn(execution: ExecutionRig) -> None:
    runner = execution.start_runner(mode="invalid-output")  # every answer breaks the contract
    execution.create_job("violated", runner=runner, kind=JobKind.REVIEW_PROBE, prompt="Review the diff.")
    job = execution.wait_finished("violated")
    succeeded = condition(job, "Succeeded")
    assert succeeded is not None and (succeeded["status"], succeeded["reason"]) == ("False", "OutputContractViolated")
    ready = condition(job, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "OutputContractViolated")
    result = job["status"]["result"]
    assert result["outcome"] == "OutputContractViolated"
    assert "(root): 'verdict' is a required property" in result["validationErrors"]
    assert "(root): 'findings' is a required property" in result["validationErrors"]
    assert "output" not in result or result["output"] is None
    assert '"turn":2' in result["summary"]  # the last (repair) answer is kept as the summary
    # Exactly two prompts reached the agent: the job's and one repair turn.
    assert runner.methods().count("session/prompt") == 2
    execution.wait_events("violated", "OutputContractViolated")


def test_a_large_answer_goes_to_an_owned_artifact_configmap(execution: ExecutionRig) -> None:
    runner = execution.start_runner()
    execution.create_job("large", runner=runner, prompt="Write a lot.\nPAD-REPLY: 20000")
    job = execution.wait_finished("large")
    assert condition(job, "Succeeded")["status"] == "True", job["status"]
    result = job["status"]["result"]
    assert len(result["summary"]) <= SUMMARY_MAX_CHARS
    assert result["summary"].endswith("…[cut: the full text is in the transcript artifact]")
    (artifact,) = result["artifacts"]
    assert artifact["kind"] == "ConfigMap" and artifact["name"] == "large-artifacts"
    assert artifact["key"] == "transcript.txt" and artifact["truncated"] is False
    config_map = execution.kube.core.read_namespaced_config_map("large-artifacts", execution.namespace)
    text = config_map.data["transcript.txt"]
    assert len(text.encode()) == artifact["bytes"] > 20000
    assert hashlib.sha256(text.encode()).hexdigest() == artifact["sha256"]
    (owner,) = config_map.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == ("AgentJob", "large", job["metadata"]["uid"])
    assert len(json.dumps(job)) < 64 * 1024  # status stays small

"""runner.json's ``execution`` and ``jobPodTemplate``, and ``HELMHIVE_POD_IP``: what a JobPod runner is told.

Every problem is named by its field (``runner.json.<path>`` or the variable) and all are reported
together, as :func:`~helmhive.runner.config.load_config` does for the rest of the configuration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helmhive.api.execution import ExecutionMode
from helmhive.api.jobpod import LINK_KEY_FILE
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.policy.jobpods.pod import build_job_pod
from helmhive.policy.runners.pool import PoolRef
from helmhive.runner.config import ConfigError, RunnerConfig, load_config

ENV = {
    "HELMHIVE_RUNNER_NAME": "pool-a-0",
    "HELMHIVE_NAMESPACE": "team-a",
    "HELMHIVE_POOL": "pool-a",
    "HELMHIVE_RUNNER_CONFIG": "/etc/helmhive/runner.json",
    "HELMHIVE_CREDENTIAL_FILE": "/var/run/helmhive/credential/api-key",
}
POD_IP = {"HELMHIVE_POD_IP": "10.0.2.9"}
BASE: dict[str, Any] = {"provider": "anthropic", "adapter": {"type": "acp", "acp": {"command": "agent"}}}
POOL_SPEC = {
    **BASE,
    "image": "ghcr.io/helmhive/runner:test",
    "credential": {"secretRef": {"name": "key", "key": "api-key"}, "envName": "ANTHROPIC_API_KEY"},
    "execution": {"mode": "JobPod", "warmPods": 2},
}
TEMPLATE: dict[str, Any] = json.loads(
    json.dumps(
        build_job_pod(
            pool=PoolRef(name="pool-a", namespace="team-a", uid="0b9e6a4e-0000-4000-8000-000000000001"),
            pool_spec=RunnerPoolSpec.model_validate(POOL_SPEC),
            namespace="team-a",
            job=None,
            runner=None,
            timeout_seconds=None,
        )
    )
)
"""A warm job pod of the pool, as the operator writes it into runner.json."""
JOB_POD = {"execution": {"mode": "JobPod", "warmPods": 2}, "jobPodTemplate": TEMPLATE}


def load(runner_json: dict[str, Any], **environ: str) -> RunnerConfig:
    return load_config(environ={**ENV, **environ}, read_text=lambda _: json.dumps(runner_json))


def problems(runner_json: dict[str, Any], **environ: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(runner_json, **environ)
    return caught.value.problems


def test_jobs_run_in_the_runner_unless_told_otherwise() -> None:
    config = load(BASE)
    assert config.file.execution.mode is ExecutionMode.IN_RUNNER and not config.file.job_pods
    assert config.file.job_pod_template is None and config.env.pod_ip is None


def test_a_job_pod_runner_reads_the_template_its_address_and_its_key() -> None:
    config = load({**BASE, **JOB_POD}, **POD_IP)
    assert config.file.job_pods and config.file.execution.warm_pods == 2
    assert config.file.job_pod_template == TEMPLATE  # kept as written: the runner claims or copies it
    assert config.env.pod_ip == "10.0.2.9"
    assert config.env.jobpod_link_key_file == Path(LINK_KEY_FILE)  # the contract's mount
    moved = load({**BASE, **JOB_POD}, **POD_IP, HELMHIVE_JOBPOD_LINK_KEY_FILE="/tmp/key")
    assert moved.env.jobpod_link_key_file == Path("/tmp/key")
    assert load({**BASE, **JOB_POD}, HELMHIVE_POD_IP="fd00::2:9").env.pod_ip == "fd00::2:9"


@pytest.mark.parametrize(
    ("runner_json", "environ", "expected"),
    [
        (
            {**BASE, "execution": {"mode": "JobPod"}},
            POD_IP,
            ["runner.json.jobPodTemplate: required when execution.mode is JobPod"],
        ),
        (
            {**BASE, **JOB_POD},
            {},
            ["HELMHIVE_POD_IP: required when runner.json.execution.mode is JobPod"],
        ),
        (
            {**BASE, "jobPodTemplate": TEMPLATE},
            {},
            ["runner.json.jobPodTemplate: forbidden when execution.mode is InRunner"],
        ),
        (
            {**BASE, "execution": {"mode": "InRunner", "warmPods": 1}},
            {},
            ["runner.json.execution.warmPods: warm pods need mode JobPod (a runner pod runs its jobs itself)"],
        ),
        (
            {**BASE, **JOB_POD, "adapter": {"type": "claude-cli"}},
            POD_IP,
            [
                "runner.json.execution.mode: JobPod needs adapter.type acp (the Claude CLI starts a process per "
                "turn, and a job pod starts one agent)"
            ],
        ),
        (
            {**BASE, **JOB_POD, "credentialIsolation": "InSandbox"},
            POD_IP,
            [
                "runner.json.execution.mode: JobPod needs credentialIsolation Proxy (set, or the default for an API "
                "key whose upstream is known): the provider credential stays in the runner and never enters the "
                "job pod"
            ],
        ),
        (
            {**BASE, "execution": {"mode": "JobPod", "warm": 1}, "jobPodTemplate": TEMPLATE},
            POD_IP,
            ["runner.json.execution.warm: Extra inputs are not permitted"],
        ),
        (
            {**BASE, "execution": {"mode": "Elsewhere"}},
            {},
            ["runner.json.execution.mode: Input should be 'InRunner' or 'JobPod'"],
        ),
    ],
    ids=[
        "no-template",
        "no-pod-ip",
        "template-in-runner",
        "warm-pods-in-runner",
        "claude-cli",
        "in-sandbox",
        "unknown-key",
        "unknown-mode",
    ],
)
def test_each_problem_is_named_by_its_field(
    runner_json: dict[str, Any], environ: dict[str, str], expected: list[str]
) -> None:
    assert problems(runner_json, **environ) == expected


def test_a_template_that_is_no_pod_of_this_namespace_is_refused_field_by_field() -> None:
    other = json.loads(json.dumps(TEMPLATE))
    other["metadata"]["namespace"] = "team-b"
    assert problems({**BASE, **JOB_POD, "jobPodTemplate": other}, **POD_IP) == [
        "runner.json.jobPodTemplate.metadata.namespace: must be the runner's namespace team-a"
    ]
    assert problems({**BASE, **JOB_POD, "jobPodTemplate": {"kind": "Secret"}}, **POD_IP) == [
        "runner.json.jobPodTemplate: must be a v1 Pod",
        "runner.json.jobPodTemplate.metadata.generateName: required (each job's pod gets a name of its own)",
        "runner.json.jobPodTemplate.spec.containers: required",
    ]
    huge = {str(i): i for i in range(17)}
    assert problems({**BASE, **JOB_POD, "jobPodTemplate": huge}, **POD_IP) == [
        "runner.json.jobPodTemplate: Dictionary should have at most 16 items after validation, not more"
    ]


def test_every_problem_is_reported_together() -> None:
    wrong = {
        **BASE,
        "adapter": {"type": "claude-cli"},
        "execution": {"mode": "JobPod"},
        "credentialIsolation": "InSandbox",
    }
    assert [p.split(":", 1)[0] for p in problems(wrong)] == [
        "runner.json.execution.mode",  # Proxy
        "runner.json.execution.mode",  # ACP
        "runner.json.jobPodTemplate",
        "HELMHIVE_POD_IP",
    ]
    unreadable = problems(wrong, HELMHIVE_POD_IP="not-an-address")  # what needs the environment waits for it
    assert [p.split(":", 1)[0] for p in unreadable] == [
        "HELMHIVE_POD_IP",
        "runner.json.execution.mode",
        "runner.json.jobPodTemplate",
    ]
    assert "not-an-address" in unreadable[0]

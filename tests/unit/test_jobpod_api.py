"""``RunnerPool.spec.execution``: its fields in the CRD, and its rules as ``helmhive validate`` reports them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from helmhive.api.crdgen import build_crd
from helmhive.api.egress import CredentialIsolation
from helmhive.api.execution import (
    DEFAULT_START_TIMEOUT_SECONDS,
    EXECUTION_RULES,
    ExecutionMode,
    ExecutionSpec,
    decide_execution_problems,
)
from helmhive.api.kinds import kind_by_name
from helmhive.api.reasons import Reason
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.cli.main import app
from helmhive.policy.validation.manifests import SourceDocument, validate_documents

KEY = {"secretRef": {"name": "anthropic-key", "key": "api-key"}}
LOGIN = {"volume": {"claimName": "claude-login", "mountPath": "/home/runner/.claude"}}
BASE: dict[str, Any] = {
    "provider": "anthropic",
    "adapter": {"type": "claude-cli"},
    "image": "ghcr.io/helmhive/runner:0.1.0",
    "credential": KEY,
}
MODE, WARM, RUNTIME, START = (r["message"] for r in EXECUTION_RULES)


def issues(spec: dict[str, Any]) -> list[tuple[str, Reason, str]]:
    body = {"apiVersion": "helmhive.dev/v1alpha1", "kind": "RunnerPool", "metadata": {"name": "p"}, "spec": spec}
    report = validate_documents(documents=[SourceDocument(file="pools.yaml", index=0, body=body)])
    return [(i.field_path, i.reason, i.message) for i in report.issues]


def test_the_default_is_in_runner_with_nothing_warm() -> None:
    spec = RunnerPoolSpec.model_validate(BASE)
    assert spec.execution == ExecutionSpec(mode=ExecutionMode.IN_RUNNER, warm_pods=0, runtime_class_name=None)
    assert spec.to_wire()["execution"] == {"mode": "InRunner", "warmPods": 0}


@pytest.mark.parametrize(
    "execution",
    [
        {"mode": "JobPod"},
        {"mode": "JobPod", "warmPods": 20, "runtimeClassName": "gvisor"},
        {"mode": "InRunner"},
        {"mode": "InRunner", "warmPods": 0},
    ],
)
def test_good_execution_settings_are_valid(execution: dict[str, Any]) -> None:
    assert issues({**BASE, "execution": execution}) == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(  # InSandbox, said outright
            {"credentialIsolation": "InSandbox", "execution": {"mode": "JobPod"}},
            [("spec.execution.mode", MODE)],
            id="in-sandbox",
        ),
        pytest.param(  # InSandbox by default: a login volume
            {"credential": LOGIN, "execution": {"mode": "JobPod"}},
            [("spec.execution.mode", MODE)],
            id="login",
        ),
        pytest.param(  # InSandbox by default: a provider without a known upstream
            {"provider": "acme", "execution": {"mode": "JobPod"}},
            [("spec.execution.mode", MODE)],
            id="acme",
        ),
        pytest.param({"execution": {"warmPods": 2}}, [("spec.execution.warmPods", WARM)], id="warm-in-runner"),
        pytest.param(
            {"execution": {"mode": "InRunner", "runtimeClassName": "gvisor"}},
            [("spec.execution.runtimeClassName", RUNTIME)],
            id="runtime-in-runner",
        ),
        pytest.param(
            {"credentialIsolation": "InSandbox", "execution": {"warmPods": 1, "runtimeClassName": "kata"}},
            [("spec.execution.warmPods", WARM), ("spec.execution.runtimeClassName", RUNTIME)],
            id="all-together",
        ),
    ],
)
def test_broken_rules_are_reported_together_at_their_fields(
    spec: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert issues({**BASE, **spec}) == [(path, Reason.INVALID_SPEC, message) for path, message in expected]


def test_proxy_by_default_or_by_upstream_is_enough_for_job_pods() -> None:
    assert issues({**BASE, "execution": {"mode": "JobPod"}}) == []  # an API key for anthropic: Proxy
    acme = {"provider": "acme", "egress": {"upstream": "https://llm.acme.example"}, "execution": {"mode": "JobPod"}}
    assert issues({**BASE, **acme}) == []


def test_every_problem_of_the_pool_is_reported_at_once() -> None:
    found = issues(
        {
            **BASE,
            "resources": {"limits": {"memory": "512Mi"}},
            "credentialIsolation": "InSandbox",
            "execution": {"mode": "JobPod"},
        }
    )
    assert [(path, reason) for path, reason, _ in found] == [
        ("spec.jobLimits.memoryBytes", Reason.INVALID_SPEC),
        ("spec.execution.mode", Reason.INVALID_SPEC),
    ]


@pytest.mark.parametrize(
    ("execution", "path"),
    [
        ({"mode": "Pod"}, "spec.execution.mode"),
        ({"mode": "JobPod", "warmPods": 21}, "spec.execution.warmPods"),
        ({"mode": "JobPod", "warmPods": -1}, "spec.execution.warmPods"),
        ({"mode": "JobPod", "runtimeClassName": "Not_A_Name"}, "spec.execution.runtimeClassName"),
        ({"mode": "JobPod", "runtimeClassName": "a" * 254}, "spec.execution.runtimeClassName"),
        ({"mode": "JobPod", "warm": 1}, "spec.execution.warm"),
        ({"mode": "JobPod", "startTimeoutSeconds": 9}, "spec.execution.startTimeoutSeconds"),
        ({"mode": "JobPod", "startTimeoutSeconds": 3601}, "spec.execution.startTimeoutSeconds"),
        ({"mode": "JobPod", "startTimeoutSeconds": "5m"}, "spec.execution.startTimeoutSeconds"),
    ],
)
def test_bad_field_values_are_refused_by_the_schema(execution: dict[str, Any], path: str) -> None:
    assert [p for p, _, _ in issues({**BASE, "execution": execution})] == [path]


def test_the_command_line_reports_them_with_their_paths(tmp_path: Path) -> None:
    pool = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "RunnerPool",
        "metadata": {"name": "login"},
        "spec": {**BASE, "credential": LOGIN, "execution": {"mode": "JobPod", "warmPods": 3}},
    }
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    assert f"RunnerPool/login: spec.execution.mode: InvalidSpec: {MODE}" in result.stdout


def test_the_model_refuses_the_same() -> None:
    with pytest.raises(ValidationError, match=r"spec\.execution\.warmPods: warm pods need mode JobPod"):
        RunnerPoolSpec.model_validate({**BASE, "execution": {"warmPods": 1}})


@pytest.mark.parametrize("isolation", list(CredentialIsolation))
@pytest.mark.parametrize("mode", list(ExecutionMode))
@pytest.mark.parametrize("warm", [0, 1])
@pytest.mark.parametrize("runtime", [None, "gvisor"])
@pytest.mark.parametrize("start", [None, 60])
def test_each_rule_is_its_own_message_starting_with_its_field(
    isolation: CredentialIsolation, mode: ExecutionMode, warm: int, runtime: str | None, start: int | None
) -> None:
    execution = ExecutionSpec(mode=mode, warm_pods=warm, runtime_class_name=runtime, start_timeout_seconds=start)
    problems = decide_execution_problems(execution=execution, isolation=isolation)
    job_pod = mode is ExecutionMode.JOB_POD
    expected = [
        MODE if job_pod and isolation is CredentialIsolation.IN_SANDBOX else None,
        WARM if not job_pod and warm else None,
        RUNTIME if not job_pod and runtime else None,
        START if not job_pod and start else None,
    ]
    assert execution.start_timeout == (start or DEFAULT_START_TIMEOUT_SECONDS)
    assert problems == [m for m in expected if m]
    for rule in EXECUTION_RULES:
        assert rule["message"].startswith(rule["fieldPath"].lstrip(".") + ": ")
        assert "; spec." not in rule["message"]  # the validator splits a pool's problems there


def test_the_crd_has_the_fields_bounded_and_defaulted() -> None:
    root = build_crd(kind_by_name("RunnerPool"))["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    execution = root["properties"]["spec"]["properties"]["execution"]
    fields = execution["properties"]
    assert fields["mode"]["enum"] == ["InRunner", "JobPod"] and fields["mode"]["default"] == "InRunner"
    assert (fields["warmPods"]["minimum"], fields["warmPods"]["maximum"], fields["warmPods"]["default"]) == (0, 20, 0)
    assert fields["runtimeClassName"]["maxLength"] == 253
    assert (fields["startTimeoutSeconds"]["minimum"], fields["startTimeoutSeconds"]["maximum"]) == (10, 3600)
    assert "default" not in fields["startTimeoutSeconds"], "unset means the documented default, not a stored one"
    assert "Pod of its own" in fields["mode"]["description"]
    assert "the operator keeps" in fields["warmPods"]["description"]
    on_disk = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "crds" / "runnerpools.helmhive.dev.yaml").read_text(encoding="utf-8")
    )
    assert (
        on_disk["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["execution"]
        == execution
    )

"""A RunnerPool's pod resources and placement: quantities, the checks on them, and the StatefulSet they make."""

from __future__ import annotations

from decimal import Context, Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as kubernetes_parse_quantity
from pydantic import ValidationError

from helmhive.api.kinds import kind_by_name
from helmhive.api.pod_settings import (
    DEFAULT_JOB_MEMORY_BYTES,
    QUANTITY_PATTERN,
    RESOURCE_RULES,
    TOLERATION_RULE,
    ContainerResources,
    Toleration,
    decide_resource_problems,
    parse_quantity,
)
from helmhive.api.runnerpool import JobLimits, RunnerPoolSpec
from helmhive.policy.runnerpool import PoolRef, build_stateful_set
from helmhive.policy.validation import SourceDocument, validate_documents

CLIENT_DIGITS = Context(prec=28)
POOL = PoolRef(name="claude", namespace="team-a", uid="0b9e6a4e-0000-4000-8000-000000000002")
BASE: dict[str, Any] = {
    "provider": "anthropic",
    "adapter": {"type": "claude-cli"},
    "image": "ghcr.io/helmhive/runner:0.1.0",
    "credential": {"secretRef": {"name": "anthropic-key", "key": "api-key"}},
}


def pod(**changes: Any) -> dict[str, Any]:
    spec = RunnerPoolSpec.model_validate({**BASE, **changes})
    template: dict[str, Any] = build_stateful_set(POOL, spec, credential_generation=1)["spec"]["template"]["spec"]
    return template


@given(st.from_regex(QUANTITY_PATTERN, fullmatch=True).filter(lambda q: len(q) <= 64))
def test_a_quantity_reads_as_the_kubernetes_client_reads_it(text: str) -> None:
    # The client multiplies in Decimal's default context (28 digits); ours is exact, like the API
    # server's. So they agree once both are rounded to the client's precision.
    assert CLIENT_DIGITS.plus(parse_quantity(text)) == CLIENT_DIGITS.plus(kubernetes_parse_quantity(text))


def test_a_quantity_is_read_exactly() -> None:
    assert parse_quantity("1000000.0001Ei") == Decimal("1152921504722139126460684.6976")  # 1000000.0001 * 1024**6
    assert parse_quantity("10000000000000000000000000001") == 10**28 + 1


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("100m", Decimal("0.1")),
        ("2Gi", Decimal(2 * 1024**3)),
        ("1.5e9", Decimal(1_500_000_000)),
        (".5", Decimal("0.5")),
    ],
)
def test_quantities_by_example(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["2 GiB", "-1", "1Ki5", "", "Gi", "1gi", "1.2.3"])
def test_what_is_not_a_quantity_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)
    with pytest.raises(ValidationError):
        ContainerResources.model_validate({"limits": {"memory": text}})


def test_the_defaults_are_the_pod_resources_helmhive_always_set() -> None:
    # The values build_stateful_set wrote before they were settable: a pool that sets nothing is unchanged.
    assert pod()["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "2Gi"},
    }
    assert not {"nodeSelector", "tolerations", "priorityClassName"} & set(pod())
    assert JobLimits().memory_bytes == DEFAULT_JOB_MEMORY_BYTES
    assert not decide_resource_problems(ContainerResources(), job_memory_bytes=DEFAULT_JOB_MEMORY_BYTES)


def test_resources_and_placement_reach_the_pod_template() -> None:
    template = pod(
        resources={"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi", "ephemeral-storage": "10Gi"}},
        nodeSelector={"pool": "agents"},
        tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        priorityClassName="agents-high",
        jobLimits={"memoryBytes": 4 * 1024**3},
    )
    assert template["containers"][0]["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "8Gi", "ephemeral-storage": "10Gi"},
    }
    assert template["nodeSelector"] == {"pool": "agents"}
    assert template["tolerations"] == [{"key": "dedicated", "operator": "Exists", "value": "", "effect": "NoSchedule"}]
    assert template["priorityClassName"] == "agents-high"


@pytest.mark.parametrize(
    ("resources", "job_memory", "broken"),
    [
        ({"requests": {"memory": "3Gi"}}, DEFAULT_JOB_MEMORY_BYTES, [0]),  # above the default 2Gi limit
        ({"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}, DEFAULT_JOB_MEMORY_BYTES, [0]),
        ({"limits": {"memory": "512Mi"}, "requests": {}}, DEFAULT_JOB_MEMORY_BYTES, [1]),
        ({"limits": {"memory": "512Mi"}}, DEFAULT_JOB_MEMORY_BYTES, [1]),  # the 256Mi default request holds
        ({"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}, DEFAULT_JOB_MEMORY_BYTES, []),  # equal is fine
        ({"limits": {"memory": "1Gi"}}, DEFAULT_JOB_MEMORY_BYTES + 1, [1]),
        ({"limits": {"cpu": "1"}}, 64 * 1024**3, []),  # no memory limit: nothing to hold
    ],
)
def test_resource_rules_by_example(resources: dict[str, Any], job_memory: int, broken: list[int]) -> None:
    problems = decide_resource_problems(ContainerResources.model_validate(resources), job_memory_bytes=job_memory)
    assert problems == [RESOURCE_RULES[i]["message"] for i in broken]


def test_an_absent_requests_or_limits_is_its_default() -> None:
    only_limits = ContainerResources.model_validate({"limits": {"memory": "512Mi"}})
    assert only_limits.requests == {"cpu": "100m", "memory": "256Mi"}
    assert ContainerResources.model_validate({"requests": {}}).limits == {"memory": "2Gi"}


@pytest.mark.parametrize(
    ("toleration", "ok"),
    [
        ({"key": "k", "value": "v"}, True),
        ({"operator": "Exists"}, True),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}, True),
        ({"operator": "Exists", "value": "v"}, False),
        ({"value": "v"}, False),  # Equal needs a key
        ({"key": "k", "effect": "NoSchedule", "tolerationSeconds": 60}, False),
        ({"key": "k", "tolerationSeconds": 60}, False),
    ],
)
def test_toleration_rules_by_example(toleration: dict[str, Any], ok: bool) -> None:
    if ok:
        Toleration.model_validate(toleration)
        return
    with pytest.raises(ValidationError, match="toleration with operator Exists has no value"):
        Toleration.model_validate(toleration)


def test_the_crd_carries_the_rules_the_models_check() -> None:
    schema = kind_by_name("RunnerPool")
    crd = yaml.safe_load((Path(__file__).parents[2] / "crds" / f"{schema.plural}.helmhive.dev.yaml").read_text())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [r["rule"] for r in root["x-kubernetes-validations"]]
    assert all(r["rule"] in rules for r in RESOURCE_RULES)
    tolerations = root["properties"]["spec"]["properties"]["tolerations"]["items"]
    assert TOLERATION_RULE["rule"] in [r["rule"] for r in tolerations["x-kubernetes-validations"]]


def _validate(spec: dict[str, Any]) -> list[tuple[str, str, str]]:
    body = {"apiVersion": "helmhive.dev/v1alpha1", "kind": "RunnerPool", "metadata": {"name": "p"}, "spec": spec}
    report = validate_documents(documents=[SourceDocument(file="pools.yaml", index=0, body=body)])
    return [(i.field_path, i.reason, i.message) for i in report.issues]


def test_helmhive_validate_refuses_bad_resources_with_a_field_path_and_a_reason() -> None:
    (issue,) = _validate({**BASE, "resources": {"limits": {"memory": "512Mi"}}})
    assert issue[1] == "InvalidSpec" and issue[0].startswith("spec")
    assert "spec.jobLimits.memoryBytes: above the runner pod's memory limit" in issue[2]
    (bad,) = _validate({**BASE, "resources": {"limits": {"memory": "2 GiB"}}})
    assert bad[0] == "spec.resources.limits.memory"
    (gpu,) = _validate({**BASE, "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    assert gpu[0] == "spec.resources.limits"
    (tol,) = _validate({**BASE, "tolerations": [{"operator": "Exists", "value": "x"}]})
    assert tol[0] == "spec.tolerations[0]" and tol[1] == "InvalidSpec"

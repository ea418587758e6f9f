"""A RunnerPool's pod resources and placement: quantities, the checks on them, and the StatefulSet they make."""

from __future__ import annotations

from decimal import Decimal
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
    RESERVED_ANNOTATION_RULE,
    RESERVED_LABEL_RULE,
    RESOURCE_RULES,
    TOLERATION_RULE,
    ContainerResources,
    PodMetadata,
    Toleration,
    decide_resource_problems,
    parse_quantity,
)
from helmhive.api.runnerpool import JobLimits, RunnerPoolSpec
from helmhive.policy.runners.pool import PoolRef, build_stateful_set
from helmhive.policy.validation.manifests import SourceDocument, validate_documents

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
    # Within the pattern (at most twelve significant digits) the client's 28-digit Decimal is exact.
    assert parse_quantity(text) == kubernetes_parse_quantity(text)


def test_a_quantity_is_read_exactly() -> None:
    assert parse_quantity("999999999.999Gi") == Decimal("999999999.999") * 1024**3
    assert parse_quantity("999999.999Ti") < 2**63  # the API server keeps every admitted value exactly


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


@pytest.mark.parametrize(
    "text",
    [
        *("2 GiB", "-1", "1Ki5", "", "Gi", "1gi", "1.2.3"),
        # Kubernetes quantities outside the subset, where the API server rounds or caps a value
        # (finer than 1e-9, or binary above 2**63) or that no runner pod needs.
        *("+1", "1n", "500u", "1e-3", "1e10", "0.0001", "1234567890", "1234567Ti", "1P", "1Pi", "1E", "1Ei"),
    ],
)
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
        ({"limits": {"memory": "67108863.999"}, "requests": {}}, 64 * 1024**2, [1]),  # not whole: compared as a float
        ({"limits": {"memory": "67108864.001"}, "requests": {}}, 64 * 1024**2, []),
        ({"limits": {"cpu": "1"}}, 64 * 1024**3, []),  # no memory limit: nothing to hold
        ({"limits": {"memory": "512Mi"}}, None, []),  # limits the pool did not set: the rule does not apply
    ],
)
def test_resource_rules_by_example(resources: dict[str, Any], job_memory: int | None, broken: list[int]) -> None:
    problems = decide_resource_problems(ContainerResources.model_validate(resources), job_memory_bytes=job_memory)
    assert problems == [RESOURCE_RULES[i]["message"] for i in broken]


def test_a_pool_written_before_resources_existed_stays_valid() -> None:
    # jobLimits above the default 2Gi pod limit was allowed before the pool could set its limits:
    # such a pool keeps working (and its pods the 2Gi limit they had) until it sets limits itself.
    big = {**BASE, "jobLimits": {"memoryBytes": 4 * 1024**3}}
    assert pod(**{k: v for k, v in big.items() if k not in BASE})["containers"][0]["resources"]["limits"] == {
        "memory": "2Gi"
    }
    RunnerPoolSpec.model_validate({**big, "resources": {"requests": {"cpu": "1"}}})
    RunnerPoolSpec.model_validate({**big, "resources": {"limits": {"cpu": "1"}}})
    with pytest.raises(ValidationError, match=r"spec\.jobLimits\.memoryBytes: above the runner pod's memory limit"):
        RunnerPoolSpec.model_validate({**big, "resources": {"limits": {"memory": "2Gi"}}})


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
    both = _validate({**BASE, "resources": {"limits": {"memory": "512Mi"}, "requests": {"memory": "1Gi"}}})
    assert [(path, reason) for path, reason, _ in both] == [
        ("spec.resources.requests", "InvalidSpec"),
        ("spec.jobLimits.memoryBytes", "InvalidSpec"),
    ]
    assert "above the runner pod's memory limit (spec.resources.limits.memory); a job could" in both[1][2]
    (bad,) = _validate({**BASE, "resources": {"limits": {"memory": "2 GiB"}}})
    assert bad[0] == "spec.resources.limits.memory"
    (gpu,) = _validate({**BASE, "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    assert gpu[0] == "spec.resources.limits"
    (tol,) = _validate({**BASE, "tolerations": [{"operator": "Exists", "value": "x"}]})
    assert tol[0] == "spec.tolerations[0]" and tol[1] == "InvalidSpec"
    # A node label key Kubernetes would refuse on the pod (a name part over 63 characters).
    (key,) = _validate({**BASE, "nodeSelector": {"a" * 64: "x"}})
    assert key[0] == "spec.nodeSelector"
    assert not _validate({**BASE, "nodeSelector": {"topology.kubernetes.io/zone": "eu-west-1a", "a" * 63: "x"}})


def test_every_broken_pool_rule_is_reported_at_once_each_at_its_field() -> None:
    # Isolation and resources are one validator: the first broken rule does not hide the others.
    login = {"volume": {"claimName": "c", "mountPath": "/home/runner/.claude"}}
    spec = {**BASE, "credential": login, "credentialIsolation": "Proxy", "resources": {"limits": {"memory": "1Gi"}}}
    issues = _validate({**spec, "jobLimits": {"memoryBytes": 3 * 1024**3}})
    assert [path for path, _, _ in issues] == ["spec.credentialIsolation", "spec.jobLimits.memoryBytes"]
    (nested,) = _validate({**BASE, "tolerations": [{"value": "v"}]})
    assert nested[2].startswith("a toleration with operator Exists")  # the rule's words, no "Value error, "


def test_a_quantity_with_a_trailing_newline_is_not_one() -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity("1e9\n")


def template_metadata(**changes: Any) -> dict[str, Any]:
    spec = RunnerPoolSpec.model_validate({**BASE, **changes})
    meta: dict[str, Any] = build_stateful_set(POOL, spec, credential_generation=3)["spec"]["template"]["metadata"]
    return meta


def test_pod_metadata_reaches_the_pods_beside_helmhives_own() -> None:
    plain = template_metadata()
    meta = template_metadata(
        podMetadata={"labels": {"team": "payments"}, "annotations": {"sidecar.istio.io/inject": "false"}}
    )
    assert meta["labels"] == {**plain["labels"], "team": "payments"}
    assert meta["annotations"] == {**plain["annotations"], "sidecar.istio.io/inject": "false"}
    assert plain["annotations"]["helmhive.dev/credential-generation"] == "3"  # still Helmhive's
    # The StatefulSet's selector still selects the pods: the pool cannot change those labels.
    spec = RunnerPoolSpec.model_validate({**BASE, "podMetadata": {"labels": {"team": "x"}}})
    stateful_set = build_stateful_set(POOL, spec, credential_generation=1)
    assert (
        stateful_set["spec"]["selector"]["matchLabels"].items()
        <= stateful_set["spec"]["template"]["metadata"]["labels"].items()
    )


@pytest.mark.parametrize(
    ("labels", "annotations", "ok"),
    [
        ({"team": "a", "example.com/tier": "gold"}, {"example.com/note": "x" * 4096}, True),
        ({"helmhive.dev/pool": "other"}, {}, False),
        ({"runners.helmhive.dev/x": "y"}, {}, False),  # a subdomain of helmhive.dev
        ({"app.kubernetes.io/name": "x"}, {}, False),
        ({"statefulset.kubernetes.io/pod-name": "x"}, {}, False),
        ({"controller-revision-hash": "x"}, {}, False),
        ({"app.kubernetes.io/part-of": "agents", "nothelmhive.dev/x": "y"}, {}, True),  # not reserved
        ({}, {"helmhive.dev/config-hash": "0"}, False),
        ({}, {"x.helmhive.dev/y": "0"}, False),
        ({}, {"app.kubernetes.io/name": "fine as an annotation"}, True),
        ({}, {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}, False),  # must match the pod's own
        ({}, {"controller.kubernetes.io/pod-deletion-cost": "5"}, False),
        ({}, {"kubernetes.io/config.mirror": "x"}, False),
        ({}, {"scheduler.alpha.kubernetes.io/tolerations": "[]"}, False),
        ({}, {"kubernetes.io/config.source": "api", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}, True),
    ],
)
def test_reserved_pod_keys_by_example(labels: dict[str, str], annotations: dict[str, str], ok: bool) -> None:
    if ok:
        PodMetadata.model_validate({"labels": labels, "annotations": annotations})
        return
    with pytest.raises(ValidationError, match="is reserved"):
        PodMetadata.model_validate({"labels": labels, "annotations": annotations})


def test_helmhive_validate_refuses_reserved_and_malformed_pod_keys_at_their_field() -> None:
    issues = _validate(
        {**BASE, "podMetadata": {"labels": {"helmhive.dev/pool": "x"}, "annotations": {"helmhive.dev/a": "1"}}}
    )
    assert [(path, reason) for path, reason, _ in issues] == [
        ("spec.podMetadata.labels", "InvalidSpec"),
        ("spec.podMetadata.annotations", "InvalidSpec"),
    ]
    assert issues[0][2] == RESERVED_LABEL_RULE["message"]
    (long_key,) = _validate({**BASE, "podMetadata": {"labels": {"a" * 64: "x"}}})
    assert long_key[0] == "spec.podMetadata.labels"
    (long_value,) = _validate({**BASE, "podMetadata": {"annotations": {"a": "x" * 4097}}})
    assert long_value[0] == "spec.podMetadata.annotations.a" and long_value[1] == "OverLimit"


def test_the_crd_carries_the_reserved_key_rules() -> None:
    schema = kind_by_name("RunnerPool")
    crd = yaml.safe_load((Path(__file__).parents[2] / "crds" / f"{schema.plural}.helmhive.dev.yaml").read_text())
    pod_metadata = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "podMetadata"
    ]["properties"]
    assert RESERVED_LABEL_RULE in pod_metadata["labels"]["x-kubernetes-validations"]
    assert RESERVED_ANNOTATION_RULE in pod_metadata["annotations"]["x-kubernetes-validations"]

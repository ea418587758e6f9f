"""Routing inputs from Kubernetes objects: selectors, pools serving namespaces, runner views, active jobs."""

from __future__ import annotations

from typing import Any

import pytest

from helmhive.api.common import LabelSelector
from helmhive.policy.agentjob.life import decide_finished, decide_held_runner, decide_needs_routing
from helmhive.policy.routing.inputs import (
    PoolServing,
    build_runner_view,
    build_runner_views,
    decide_active_jobs,
    decide_implementation_provider,
    decide_pool_serves,
    match_label_selector,
    parse_memory_record,
    parse_pool,
    parse_queued_job,
    parse_runner,
    parse_session_binding,
)

GROUP = "helmhive.dev/v1alpha1"


def selector(**wire: Any) -> LabelSelector:
    return LabelSelector.model_validate(wire)


@pytest.mark.parametrize(
    ("wire", "labels", "matches"),
    [
        ({}, {}, True),
        ({"matchLabels": {"team": "a"}}, {"team": "a", "x": "y"}, True),
        ({"matchLabels": {"team": "a"}}, {"team": "b"}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["1", "2"]}]}, {"tier": "2"}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["1"]}]}, {"tier": "1"}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"tier": ""}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {"tier": "1"}, False),
        (
            {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]},
            {"a": "1"},
            False,
        ),
    ],
)
def test_label_selectors_follow_kubernetes_semantics(
    wire: dict[str, Any], labels: dict[str, str], matches: bool
) -> None:
    assert match_label_selector(selector(**wire), labels) is matches


def pool(namespace: str = "runners", serves: LabelSelector | None = None, generation: int = 0) -> PoolServing:
    return PoolServing(
        namespace=namespace,
        name="p",
        provider="anthropic",
        concurrency=2,
        serves=serves or LabelSelector(),
        credential_generation=generation,
    )


def test_a_pool_serves_its_own_namespace_and_only_selected_others() -> None:
    assert decide_pool_serves(pool=pool(), namespace="runners", labels={})
    assert not decide_pool_serves(pool=pool(), namespace="team", labels={"anything": "x"})
    selective = pool(serves=selector(matchLabels={"helmhive.dev/workspaces": "enabled"}))
    assert decide_pool_serves(pool=selective, namespace="team", labels={"helmhive.dev/workspaces": "enabled"})
    assert not decide_pool_serves(pool=selective, namespace="team", labels={})
    assert not decide_pool_serves(pool=selective, namespace="team", labels=None)


def runner_body(**status: Any) -> dict[str, Any]:
    report = {
        "provider": "anthropic",
        "adapter": {"type": "acp", "name": "reference", "version": "1"},
        "authentication": {"state": "Authenticated"},
        "placementLabels": {"domain": "code"},
        "capabilities": ["diff-review"],
        "concurrency": 4,
        "environmentFingerprint": "sha256:x",
        "catalogue": {"models": [{"id": "sonnet"}, {"id": "opus"}], "default": "sonnet"},
        "credentialGeneration": 1,
        "podName": "p-0",
        "reportedAt": "2026-06-01T12:00:00Z",
    }
    body: dict[str, Any] = {
        "apiVersion": GROUP,
        "kind": "Runner",
        "metadata": {"name": "p-0", "namespace": "runners"},
        "spec": {"poolRef": {"name": "p"}},
        "status": {
            "report": report,
            "reportedStatus": "Online",
            "effectiveControlState": "Active",
            "conditions": [
                {
                    "type": "Schedulable",
                    "status": "True",
                    "reason": "Schedulable",
                    "lastTransitionTime": "2026-06-01T12:00:00Z",
                }
            ],
        },
    }
    body["status"].update(status)
    return body


def test_a_runner_view_carries_its_report_and_is_schedulable_when_everything_agrees() -> None:
    facts = parse_runner(runner_body())
    assert facts is not None
    view = build_runner_view(runner=facts, pool=pool(generation=1), serves_namespace=True)
    assert view.schedulable
    assert view.key == ("runners", "p-0")
    assert (view.provider, view.default_model) == ("anthropic", "sonnet")
    assert view.models == frozenset({"sonnet", "opus"})
    assert view.capabilities == frozenset({"diff-review"})
    assert view.labels == {"domain": "code"}
    assert view.concurrency == 2  # the report says 4, the pool allows 2


@pytest.mark.parametrize(
    ("status", "pool_generation", "reason"),
    [
        ({}, 2, "CredentialRotated"),
        ({"effectiveControlState": "Draining"}, 1, "Draining"),
        ({"reportedStatus": "Offline"}, 1, "Offline"),
        (
            {
                "conditions": [
                    {
                        "type": "Schedulable",
                        "status": "False",
                        "reason": "HeartbeatStale",
                        "lastTransitionTime": "2026-06-01T12:00:00Z",
                    }
                ]
            },
            1,
            "HeartbeatStale",
        ),
        ({"conditions": []}, 1, "Pending"),
    ],
)
def test_a_runner_is_not_schedulable_unless_the_condition_and_its_facts_agree(
    status: dict[str, Any], pool_generation: int, reason: str
) -> None:
    facts = parse_runner(runner_body(**status))
    assert facts is not None
    view = build_runner_view(runner=facts, pool=pool(generation=pool_generation), serves_namespace=True)
    assert not view.schedulable
    assert view.schedulable_reason == reason


def test_a_runner_without_its_pool_or_with_a_broken_report() -> None:
    facts = parse_runner(runner_body())
    assert facts is not None
    orphan = build_runner_view(runner=facts, pool=None, serves_namespace=True)
    assert (orphan.schedulable, orphan.schedulable_reason) == (False, "PoolNotFound")
    broken = runner_body()
    broken["status"]["report"] = {"provider": "NOT VALID"}
    parsed = parse_runner(broken)
    assert parsed is not None and parsed.report is None
    assert parse_runner({"metadata": {"name": "x"}, "spec": {}}) is None


def test_views_are_served_per_pool_for_the_jobs_namespace() -> None:
    facts = parse_runner(runner_body())
    assert facts is not None
    pools = {("runners", "p"): pool(serves=selector(matchLabels={"team": "a"}), generation=1)}
    served = build_runner_views(runners=[facts], pools=pools, job_namespace="team-a", namespace_labels={"team": "a"})
    unserved = build_runner_views(runners=[facts], pools=pools, job_namespace="team-b", namespace_labels={"team": "b"})
    assert [v.serves_namespace for v in served] == [True]
    assert [v.serves_namespace for v in unserved] == [False]


def test_parse_pool_reads_provider_concurrency_selector_and_generation() -> None:
    body = {
        "metadata": {"name": "p", "namespace": "runners"},
        "spec": {
            "provider": "anthropic",
            "adapter": {"type": "acp", "acp": {"command": "agent"}},
            "image": "runner:1",
            "credential": {"secretRef": {"name": "key"}},
            "concurrency": 3,
            "servesNamespaces": {"matchLabels": {"team": "a"}},
        },
        "status": {"credentialGeneration": 4},
    }
    parsed = parse_pool(body)
    assert parsed is not None
    assert (parsed.provider, parsed.concurrency, parsed.credential_generation) == ("anthropic", 3, 4)
    assert parsed.serves.match_labels == {"team": "a"}
    assert parse_pool({"metadata": {}, "spec": {"provider": "x"}}) is None


def job_body(name: str, *, runner: str | None = None, succeeded: str | None = None, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"workspace": "shop", "jobKind": "implementation-probe", "request": {"title": "t", "prompt": "p"}},
        "status": dict(status),
    }
    if runner:
        body["status"]["assignment"] = {"runner": runner, "runnerNamespace": "runners", "pool": "p"}
    if succeeded:
        body["status"]["conditions"] = [{"type": "Succeeded", "status": succeeded, "reason": "Completed"}]
    return body


def test_active_jobs_are_counted_from_the_jobs_themselves() -> None:
    jobs = [
        job_body("a", runner="r1"),
        job_body("b", runner="r1"),
        job_body("c", runner="r1", succeeded="True"),
        job_body("d", runner="r1", succeeded="False"),
        job_body("e", runner="r2"),
        job_body("f"),
    ]
    assert decide_active_jobs(jobs) == {("runners", "r1"): 2, ("runners", "r2"): 1}
    assert decide_active_jobs(jobs, exclude=[("team", "a")]) == {("runners", "r1"): 1, ("runners", "r2"): 1}
    assert decide_held_runner(job_body("c", runner="r1", succeeded="True")) is None
    assert decide_finished({"status": {"conditions": [{"type": "Succeeded", "status": "Unknown"}]}}) is False


def test_which_jobs_await_a_routing_decision() -> None:
    bound = {"profile": {"name": "x"}}
    assert decide_needs_routing(job_body("a", **bound))
    assert not decide_needs_routing(job_body("a"))  # no profile binding yet
    assert not decide_needs_routing(job_body("a", runner="r1", **bound))
    waiting = [{"type": "Routed", "status": "False", "reason": "WaitingForCapacity"}]
    assert decide_needs_routing(job_body("a", conditions=waiting, **bound))
    failed = [{"type": "Routed", "status": "False", "reason": "ModelNotAdvertised"}]
    assert not decide_needs_routing(job_body("a", conditions=failed, **bound))
    cancelled = job_body("a", **bound)
    cancelled["spec"]["cancel"] = True
    assert not decide_needs_routing(cancelled)


def test_a_change_implementation_records_its_provider_for_the_review() -> None:
    body = job_body("impl", runner="r1")
    body["spec"]["change"] = {"name": "ch", "stage": "implementation"}
    body["status"]["assignment"]["provider"] = "openai"
    assert decide_implementation_provider(body) == (("team", "ch", 1), "openai")
    body["spec"]["change"]["iteration"] = 2
    assert decide_implementation_provider(body) == (("team", "ch", 2), "openai")
    body["spec"]["change"]["stage"] = "review"
    assert decide_implementation_provider(body) is None


def test_parse_job_refuses_an_unusable_binding() -> None:
    assert parse_queued_job(job_body("a", profile={"name": "x"})) is None


def test_only_a_binding_with_a_stored_session_counts_for_the_session_tie_break() -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "sb-1", "namespace": "runners"},
        "spec": {
            "workspace": "shop",
            "profile": "impl",
            "provider": "anthropic",
            "runner": "p-0",
            "credentialGeneration": 2,
            "scope": "service",
            "service": "api",
        },
        "status": {"stored": True},
    }
    view = parse_session_binding(body)
    assert view is not None
    assert (view.runner_namespace, view.runner, view.credential_generation, view.scope) == (
        "runners",
        "p-0",
        2,
        "service:api",
    )
    assert parse_session_binding(dict(body, status={"stored": False})) is None


def test_a_memory_record_is_offered_unless_its_active_condition_is_false() -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "cents", "namespace": "team"},
        "spec": {
            "workspace": "shop",
            "scope": {"type": "workspace"},
            "kind": "constraint",
            "text": "Amounts are integer cents.",
            "source": {"type": "adr", "url": "https://example.com/adr/1"},
            "sensitivity": "internal",
        },
    }
    fresh = parse_memory_record(body)
    assert fresh is not None and fresh.name == "cents"
    active = dict(body, status={"conditions": [{"type": "Active", "status": "True", "reason": "InEffect"}]})
    assert parse_memory_record(active) is not None
    scoped_out = dict(
        body, status={"conditions": [{"type": "Active", "status": "False", "reason": "WorkspaceNotFound"}]}
    )
    assert parse_memory_record(scoped_out) is None
    assert parse_memory_record(dict(body, spec={"workspace": "shop"})) is None

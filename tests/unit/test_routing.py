"""decide_route: mapping order, models, requirements, capacity, tie-breaks, review diversity, the table."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from routing_builders import BOUND_AT, NOW, binding, job, mapping, runner

from helmhive.api.common import JobKind, SessionPolicy
from helmhive.api.job import ModelSource, ProfileBinding
from helmhive.api.reasons import Reason
from helmhive.policy.routing.route import (
    MAX_CANDIDATES,
    RouteOutcome,
    RoutingDecision,
    RoutingJob,
    RoutingPolicy,
    RunnerView,
    SessionBindingView,
    build_options,
    build_status_patch,
    decide_backoff,
    decide_route,
)


def route(
    runners: list[RunnerView],
    *,
    profile: ProfileBinding | None = None,
    the_job: RoutingJob | None = None,
    active: dict[tuple[str, str], int] | None = None,
    now: dt.datetime = NOW,
    avoid: str | None = None,
    sessions: list[SessionBindingView] | None = None,
    attempts: int = 0,
) -> RoutingDecision:
    return decide_route(
        job=the_job or job(),
        binding=profile or binding(mapping("anthropic", "sonnet")),
        runners=runners,
        active_jobs=active or {},
        bindings=sessions or [],
        now=now,
        avoid_provider=avoid,
        attempts=attempts,
    )


def reasons(decision: RoutingDecision) -> dict[str, str]:
    return {c.runner: c.reason for c in decision.candidates}


# Mapping order and models ------------------------------------------------------------------------


def test_the_first_mapping_and_its_primary_model_win_and_are_recorded() -> None:
    profile = binding(mapping("anthropic", "opus", "sonnet", effort="high"), mapping("openai", "gpt-5"))
    decision = route(
        [runner("a", models=["opus", "sonnet"]), runner("o", "openai", models=["gpt-5"])],
        profile=profile,
    )
    assert decision.outcome is RouteOutcome.ASSIGNED
    assert decision.reason is Reason.ASSIGNED
    choice = decision.choice
    assert choice is not None
    assert (choice.runner, choice.provider, choice.model) == ("a", "anthropic", "opus")
    assert choice.model_source is ModelSource.MAPPING
    assert choice.mapping_index == 0
    assert choice.effort is not None and choice.effort.value == "high"
    assert reasons(decision) == {"a": "Selected", "o": "NotPreferred:LaterMapping"}


def test_the_first_mapping_is_preferred_even_over_a_less_loaded_runner_of_a_later_mapping() -> None:
    profile = binding(mapping("anthropic", "sonnet"), mapping("openai", "gpt-5"))
    decision = route(
        [runner("a", concurrency=4), runner("o", "openai", models=["gpt-5"], concurrency=4)],
        profile=profile,
        active={("team", "a"): 3},
    )
    assert decision.choice is not None and decision.choice.runner == "a"


def test_a_fallback_model_is_used_only_when_no_runner_offers_the_primary() -> None:
    profile = binding(mapping("anthropic", "opus", "sonnet"))
    only_fallback = route([runner("a", models=["sonnet"])], profile=profile)
    assert only_fallback.choice is not None
    assert (only_fallback.choice.model, only_fallback.choice.model_source) == ("sonnet", ModelSource.FALLBACK)

    both = route(
        [runner("a", models=["sonnet"]), runner("b", models=["opus"], concurrency=2)],
        profile=profile,
        active={("team", "b"): 1},
    )
    assert both.choice is not None
    assert (both.choice.runner, both.choice.model) == ("b", "opus")
    assert reasons(both)["a"] == "NotPreferred:LaterModel"


def test_a_later_mapping_is_used_when_the_first_mappings_runners_are_full() -> None:
    profile = binding(mapping("anthropic", "sonnet"), mapping("openai", "gpt-5"))
    decision = route(
        [runner("a"), runner("o", "openai", models=["gpt-5"])],
        profile=profile,
        active={("team", "a"): 1},
    )
    assert decision.choice is not None
    assert (decision.choice.runner, decision.choice.mapping_index) == ("o", 1)
    assert reasons(decision)["a"] == "NoFreeConcurrency"


def test_an_unadvertised_explicit_model_is_refused_never_swapped() -> None:
    profile = binding(mapping("anthropic", "opus"))
    decision = route([runner("a", models=["sonnet", "haiku"], default="sonnet")], profile=profile)
    assert decision.outcome is RouteOutcome.FAILED
    assert decision.reason is Reason.MODEL_NOT_ADVERTISED
    assert decision.choice is None
    assert "opus" in decision.message
    assert reasons(decision) == {"a": "ModelNotAdvertised:opus"}
    assert decision.candidates[0].model == "opus"


def test_automatic_selection_uses_the_runner_reported_default() -> None:
    decision = route([runner("a", models=["sonnet", "opus"], default="opus")], profile=binding(mapping("anthropic")))
    assert decision.choice is not None
    assert (decision.choice.model, decision.choice.model_source) == ("opus", ModelSource.RUNNER_DEFAULT)
    assert decision.candidates[0].model == "opus"


def test_automatic_selection_fails_closed_when_no_runner_reports_a_default() -> None:
    decision = route([runner("a", models=["sonnet"], default=None)], profile=binding(mapping("anthropic")))
    assert decision.outcome is RouteOutcome.FAILED
    assert decision.reason is Reason.NO_DEFAULT_MODEL
    assert reasons(decision) == {"a": "NoDefaultModel"}


# Overrides ----------------------------------------------------------------------------------------


def test_an_override_the_profile_does_not_allow_fails_closed() -> None:
    decision = route([runner("a")], the_job=job(model={"model": "sonnet"}))
    assert decision.outcome is RouteOutcome.FAILED
    assert decision.reason is Reason.MODEL_OVERRIDE_FORBIDDEN
    assert "allowModelOverride" in decision.message
    assert decision.considered_runners == 1


def test_an_empty_override_is_no_override() -> None:
    decision = route([runner("a")], the_job=job(model={}))
    assert decision.outcome is RouteOutcome.ASSIGNED


def test_an_allowed_override_is_honoured_or_refused() -> None:
    profile = binding(mapping("anthropic", "sonnet", "haiku"), allow_override=True)
    honoured = route([runner("a", models=["sonnet", "opus"])], profile=profile, the_job=job(model={"model": "opus"}))
    assert honoured.choice is not None
    assert (honoured.choice.model, honoured.choice.model_source) == ("opus", ModelSource.OVERRIDE)

    refused = route([runner("a", models=["sonnet", "haiku"])], profile=profile, the_job=job(model={"model": "opus"}))
    assert refused.reason is Reason.MODEL_NOT_ADVERTISED
    assert refused.choice is None


def test_an_override_provider_narrows_the_mappings_and_an_unmapped_one_fails_closed() -> None:
    profile = binding(mapping("anthropic", "sonnet"), mapping("openai", "gpt-5"), allow_override=True)
    runners = [runner("a"), runner("o", "openai", models=["gpt-5"])]
    narrowed = route(runners, profile=profile, the_job=job(model={"provider": "openai", "reasoningEffort": "low"}))
    assert narrowed.choice is not None
    assert (narrowed.choice.runner, narrowed.choice.mapping_index) == ("o", 1)
    assert narrowed.choice.effort is not None and narrowed.choice.effort.value == "low"
    assert reasons(narrowed)["a"] == "ProviderNotInMappings"

    unmapped = route(runners, profile=profile, the_job=job(model={"provider": "google"}))
    assert unmapped.reason is Reason.NO_ELIGIBLE_RUNNER
    assert "google" in unmapped.message


# Requirements and rejections ----------------------------------------------------------------------


def test_every_rejection_has_its_named_reason() -> None:
    profile = binding(mapping("anthropic", "sonnet"), capabilities=["diff-review"], labels={"domain": "code"})
    caps, labels = ["diff-review"], {"domain": "code"}
    decision = route(
        [
            runner("stale", schedulable=False, reason="HeartbeatStale", capabilities=caps, labels=labels),
            runner("elsewhere", serves=False, capabilities=caps, labels=labels),
            runner("google", "google", capabilities=caps, labels=labels),
            runner("no-cap", labels=labels),
            runner("no-label", capabilities=caps, labels={"domain": "docs"}),
            runner("no-model", models=["haiku"], capabilities=caps, labels=labels),
            runner("busy", capabilities=caps, labels=labels),
        ],
        profile=profile,
        active={("team", "busy"): 1},
    )
    assert reasons(decision) == {
        "busy": "NoFreeConcurrency",
        "no-model": "ModelNotAdvertised:sonnet",
        "no-cap": "MissingCapability:diff-review",
        "no-label": "MissingLabel:domain=code",
        "google": "ProviderNotInMappings",
        "elsewhere": "NamespaceNotServed",
        "stale": "NotSchedulable/HeartbeatStale",
    }
    # Closest first: the documented order of ranks.
    assert [c.runner for c in decision.candidates] == [
        "busy",
        "no-model",
        "no-cap",
        "no-label",
        "google",
        "elsewhere",
        "stale",
    ]


def test_no_runner_at_all_waits_for_one_until_the_deadline_then_fails_closed() -> None:
    """GitOps order: a job applied with its RunnerPool is decided before the pool's runner registers."""
    decision = route([])
    assert decision.outcome is RouteOutcome.WAITING and decision.waits_for_runner
    assert decision.reason is Reason.WAITING_FOR_CAPACITY
    assert decision.message == (
        "no runner is eligible yet: no runner is registered; waiting for one until 2026-06-01T12:14:30Z"
    )
    assert decision.retry_after is None, "no backoff: a runner becoming eligible (an event) re-decides it"
    assert decision.capacity_deadline == BOUND_AT + dt.timedelta(seconds=900)
    assert decision.candidates == () and decision.capacity_blocked == frozenset()

    late = route([], now=BOUND_AT + dt.timedelta(seconds=900))
    assert late.outcome is RouteOutcome.FAILED and late.reason is Reason.NO_ELIGIBLE_RUNNER
    assert late.message.startswith("no runner is registered; nothing can run the job")
    assert "until the deadline 2026-06-01T12:14:30Z" in late.message


def test_a_non_schedulable_runner_is_never_chosen_even_if_it_is_the_only_match() -> None:
    decision = route([runner("a", schedulable=False, reason="Draining")])
    assert decision.outcome is RouteOutcome.WAITING and decision.waits_for_runner
    assert "NotSchedulable/Draining" in decision.message
    assert decision.choice is None
    assert reasons(decision) == {"a": "NotSchedulable/Draining"}


@pytest.mark.parametrize(
    ("fleet", "closest"),
    [
        pytest.param([runner("r", schedulable=False, reason="NeverReported")], "NotSchedulable/NeverReported",
                     id="registering"),
        pytest.param([runner("r", serves=False)], "NamespaceNotServed", id="pool-not-serving-yet"),
        pytest.param([runner("r", "openai", models=["gpt-5"])], "ProviderNotInMappings", id="other-provider-only"),
        pytest.param([runner("r", "openai"), runner("s", schedulable=False, reason="LeaseMissing")],
                     "ProviderNotInMappings", id="closest-of-several"),
    ],
)  # fmt: skip
def test_a_job_no_runner_of_its_providers_can_serve_yet_waits_for_one(fleet: list[RunnerView], closest: str) -> None:
    decision = route(fleet)
    assert decision.outcome is RouteOutcome.WAITING and decision.waits_for_runner
    count = len(fleet)
    assert decision.message == (
        f"no runner is eligible yet: none of {count} runner{'s' if count != 1 else ''} can take it "
        f"(closest: {closest}); waiting for one until 2026-06-01T12:14:30Z"
    )
    late = route(fleet, now=BOUND_AT + dt.timedelta(seconds=901))
    assert (late.outcome, late.reason) == (RouteOutcome.FAILED, Reason.NO_ELIGIBLE_RUNNER)
    assert f"(closest: {closest}); nothing can run the job" in late.message


@pytest.mark.parametrize(
    "fleet",
    [
        pytest.param([runner("r", capabilities=[])], id="missing-capability"),
        pytest.param([runner("r", capabilities=["diff-review"], labels={"domain": "docs"})], id="missing-label"),
        pytest.param([runner("r", schedulable=False, reason="NeverReported"), runner("s", capabilities=[])],
                     id="a-live-runner-found-wanting-is-closer-than-one-registering"),
    ],
)  # fmt: skip
def test_a_live_runner_of_its_provider_found_wanting_fails_the_job_closed_at_once(fleet: list[RunnerView]) -> None:
    profile = binding(mapping("anthropic", "sonnet"), capabilities=["diff-review"], labels={"domain": "code"})
    decision = route(fleet, profile=profile)
    assert (decision.outcome, decision.reason) == (RouteOutcome.FAILED, Reason.NO_ELIGIBLE_RUNNER)
    assert not decision.waits_for_runner


@pytest.mark.parametrize("why", ["Offline", "NeverReported", "Draining"])
def test_a_job_waits_for_a_fitting_runner_that_is_not_schedulable_now_whatever_others_lack(why: str) -> None:
    # A pool rolling out a new configuration (its runners restart) beside a pool of the same provider
    # without the job's label: the job waits for the first pool's runners, it does not fail closed.
    profile = binding(mapping("anthropic", "sonnet"), capabilities=["diff-review"], labels={"domain": "code"})
    fitting = runner("jobpods-0", capabilities=["diff-review"], labels={"domain": "code"})
    restarting = dataclasses.replace(fitting, schedulable=False, schedulable_reason=why)
    other = runner("inrunner-0", capabilities=["diff-review"], labels={"domain": "docs"})
    decision = route([restarting, other], profile=profile)
    assert decision.outcome is RouteOutcome.WAITING and decision.waits_for_runner, decision.message
    assert decision.message == (
        f"no runner is eligible yet: 1 runner that could take it is not schedulable now: jobpods-0 "
        f"(NotSchedulable/{why}); waiting for one until 2026-06-01T12:14:30Z"
    )
    assert reasons(decision) == {"jobpods-0": f"NotSchedulable/{why}", "inrunner-0": "MissingLabel:domain=code"}
    # Back: it is chosen. Still away at the deadline: the job fails closed, naming it.
    assert route([fitting, other], profile=profile).choice is not None
    late = route([restarting, other], profile=profile, now=BOUND_AT + dt.timedelta(seconds=901))
    assert (late.outcome, late.reason) == (RouteOutcome.FAILED, Reason.NO_ELIGIBLE_RUNNER)
    assert "jobpods-0 (NotSchedulable/" in late.message and "nothing can run the job" in late.message


def test_a_profile_no_runner_could_ever_serve_fails_closed_at_once() -> None:
    profile = binding(mapping("anthropic", "sonnet"), allow_override=True)
    decision = route([], profile=profile, the_job=job(model={"provider": "google"}))
    assert (decision.outcome, decision.reason) == (RouteOutcome.FAILED, Reason.NO_ELIGIBLE_RUNNER)
    assert "not one of profile" in decision.message


# Capacity ---------------------------------------------------------------------------------------------


def test_only_concurrency_in_the_way_means_waiting_with_backoff_and_a_deadline() -> None:
    runners = [runner("a", concurrency=2), runner("b", capabilities=[], models=["haiku"])]
    decision = route(runners, active={("team", "a"): 2})
    assert decision.outcome is RouteOutcome.WAITING
    assert decision.reason is Reason.WAITING_FOR_CAPACITY
    assert decision.capacity_blocked == frozenset({("team", "a")})
    assert decision.retry_after == 2.0
    assert decision.capacity_deadline == BOUND_AT + dt.timedelta(seconds=900)
    assert decision.choice is None

    later = route(runners, active={("team", "a"): 2}, attempts=3)
    assert later.retry_after == 16.0

    near_deadline = route(runners, active={("team", "a"): 2}, attempts=10, now=BOUND_AT + dt.timedelta(seconds=895))
    assert near_deadline.retry_after == 5.0

    expired = route(runners, active={("team", "a"): 2}, now=BOUND_AT + dt.timedelta(seconds=900))
    assert expired.outcome is RouteOutcome.FAILED
    assert expired.reason is Reason.CAPACITY_DEADLINE_EXCEEDED


def test_backoff_doubles_and_is_capped() -> None:
    policy = RoutingPolicy(backoff_initial_seconds=1, backoff_max_seconds=10)
    assert [decide_backoff(attempts=n, policy=policy) for n in range(6)] == [1, 2, 4, 8, 10, 10]


def test_a_runner_of_concurrency_zero_is_not_something_to_wait_for() -> None:
    decision = route([runner("a", concurrency=0)])
    assert decision.outcome is RouteOutcome.FAILED
    assert decision.reason is Reason.NO_ELIGIBLE_RUNNER


# Tie-breaks -----------------------------------------------------------------------------------------


def test_ties_go_to_the_least_loaded_then_by_name() -> None:
    runners = [runner("c", concurrency=4), runner("a", concurrency=2), runner("b", concurrency=2)]
    decision = route(runners, active={("team", "a"): 1, ("team", "b"): 1, ("team", "c"): 1})
    assert decision.choice is not None and decision.choice.runner == "c"  # 1/4 < 1/2
    assert reasons(decision) == {"c": "Selected", "a": "NotPreferred:MoreLoaded", "b": "NotPreferred:MoreLoaded"}

    even = route(runners, active={("team", "a"): 1, ("team", "b"): 1, ("team", "c"): 2})
    assert even.choice is not None and even.choice.runner == "a"
    assert reasons(even)["b"] == "NotPreferred:NameOrder"


def _session(runner_name: str, *, scope: str = "workspace") -> SessionBindingView:
    return SessionBindingView(
        workspace="shop",
        profile="impl",
        provider="anthropic",
        runner_namespace="team",
        runner=runner_name,
        credential_generation=0,
        scope=scope,
    )


def test_the_runner_holding_the_session_binding_wins_for_resume_only() -> None:
    runners = [runner("a", concurrency=2), runner("b", concurrency=2)]
    busy_b = {("team", "b"): 1}
    resume = binding(mapping("anthropic", "sonnet"), session=SessionPolicy.RESUME)
    held = route(runners, profile=resume, active=busy_b, sessions=[_session("b")])
    assert held.choice is not None
    assert (held.choice.runner, held.choice.resumes_session) == ("b", True)
    assert reasons(held)["a"] == "NotPreferred:NoSessionBinding"

    other_scope = route(runners, profile=resume, active=busy_b, sessions=[_session("b", scope="service:api")])
    assert other_scope.choice is not None and other_scope.choice.runner == "a"

    fresh = route(runners, profile=binding(mapping("anthropic", "sonnet")), active=busy_b, sessions=[_session("b")])
    assert fresh.choice is not None and fresh.choice.runner == "a"

    governed = binding(mapping("anthropic", "sonnet"), session=SessionPolicy.RESUME, envelope=JobKind.CHANGE_REVIEW)
    review = route(
        runners, profile=governed, the_job=job(kind=JobKind.CHANGE_REVIEW), active=busy_b, sessions=[_session("b")]
    )
    assert review.choice is not None
    assert (review.choice.runner, review.choice.resumes_session) == ("a", False)


# Review diversity ------------------------------------------------------------------------------------


def test_review_prefers_another_provider_and_falls_back_to_the_same_one() -> None:
    profile = binding(mapping("anthropic", "sonnet"), mapping("openai", "gpt-5"), envelope=JobKind.CHANGE_REVIEW)
    review = job(kind=JobKind.CHANGE_REVIEW)
    runners = [runner("a"), runner("o", "openai", models=["gpt-5"])]
    diverse = route(runners, profile=profile, the_job=review, avoid="anthropic")
    assert diverse.choice is not None
    assert diverse.choice.provider == "openai"
    assert diverse.avoided_provider == "anthropic"
    assert reasons(diverse)["a"] == "NotPreferred:SameProviderAsImplementation"
    assert "differs" in diverse.message

    same = route(runners, profile=profile, the_job=review, avoid="anthropic", active={("team", "o"): 1})
    assert same.choice is not None
    assert same.choice.provider == "anthropic"
    assert "fresh context" in same.message
    assert not same.choice.resumes_session


def test_avoiding_a_provider_only_reorders_the_options() -> None:
    mappings = [mapping("anthropic", "opus", "sonnet"), mapping("openai", "gpt-5")]
    plain = build_options(mappings=mappings, override=None)
    avoided = build_options(mappings=mappings, override=None, avoid_provider="anthropic")
    assert [(o.provider, o.model) for o in plain] == [
        ("anthropic", "opus"),
        ("anthropic", "sonnet"),
        ("openai", "gpt-5"),
    ]
    assert [(o.provider, o.model) for o in avoided] == [
        ("openai", "gpt-5"),
        ("anthropic", "opus"),
        ("anthropic", "sonnet"),
    ]
    assert [o.position for o in avoided] == [0, 1, 2]


# The table --------------------------------------------------------------------------------------------


def test_the_table_is_bounded_to_twenty_closest_first() -> None:
    runners = [runner(f"r{i:02d}", schedulable=False, reason="HeartbeatStale") for i in range(25)]
    runners += [runner(f"m{i}", models=["haiku"]) for i in range(5)]
    runners.append(runner("winner"))
    decision = route(runners)
    assert decision.considered_runners == 31
    assert len(decision.candidates) == MAX_CANDIDATES
    assert decision.candidates[0].runner == "winner"
    assert [c.runner for c in decision.candidates[1:6]] == [f"m{i}" for i in range(5)]
    assert all(c.reason == "NotSchedulable/HeartbeatStale" for c in decision.candidates[6:])


def test_status_patches_for_each_outcome() -> None:
    assigned = route([runner("a")])
    patch = build_status_patch(decision=assigned, conditions=None, generation=1, attempts=0, memory_ids=["m1"], now=NOW)
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert (conditions["Routed"]["status"], conditions["Routed"]["reason"]) == ("True", "Assigned")
    assert conditions["Ready"]["status"] == "Unknown"
    assert patch["assignment"]["runner"] == "a"
    assert patch["assignment"]["runnerNamespace"] == "team"
    assert patch["assignment"]["memoryIds"] == ["m1"]
    assert patch["assignment"]["modelSource"] == "mapping"
    assert patch["routing"]["candidates"][0]["reason"] == "Selected"

    waiting = route([runner("a")], active={("team", "a"): 1})
    patch = build_status_patch(decision=waiting, conditions=None, generation=1, attempts=1, now=NOW)
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert (conditions["Routed"]["status"], conditions["Routed"]["reason"]) == ("False", "WaitingForCapacity")
    assert conditions["Ready"]["status"] == "Unknown"
    assert "assignment" not in patch
    assert patch["routing"]["attempts"] == 1
    assert patch["routing"]["nextAttemptAt"] == "2026-06-01T12:00:02Z"
    assert patch["routing"]["capacityDeadline"] == "2026-06-01T12:14:30Z"

    failed = route([runner("a", models=["haiku"])])
    patch = build_status_patch(decision=failed, conditions=None, generation=1, attempts=0, now=NOW)
    conditions = {c["type"]: c for c in patch["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "ModelNotAdvertised")
    expected = {"runners": ["a"], "namespace": "team", "provider": "anthropic", "mappingIndex": 0, "model": "sonnet"}
    assert patch["routing"]["candidates"] == [{**expected, "reason": "ModelNotAdvertised:sonnet"}]


@pytest.mark.parametrize("policy", [SessionPolicy.FRESH, SessionPolicy.RESUME])
def test_a_decision_is_the_same_for_the_same_input(policy: SessionPolicy) -> None:
    profile = binding(mapping("anthropic", "sonnet"), session=policy)
    runners = [runner(n, concurrency=2) for n in ("c", "a", "b")]
    first = route(runners, profile=profile, active={("team", "a"): 1})
    second = route(list(reversed(runners)), profile=profile, active={("team", "a"): 1})
    assert first == second
    assert first.choice is not None and first.choice.runner == "b"


def test_the_public_surfaces_are_pinned() -> None:
    from helmhive.policy.audit import routing as routing_audit
    from helmhive.policy.routing import inputs as routing_inputs
    from helmhive.policy.routing import route as routing

    assert routing.__all__ == [
        "MAX_CANDIDATES",
        "RouteChoice",
        "RouteOption",
        "RouteOutcome",
        "RoutingDecision",
        "RoutingJob",
        "RoutingPolicy",
        "RunnerKey",
        "RunnerView",
        "SessionBindingView",
        "build_assignment",
        "build_options",
        "build_routing_status",
        "build_status_patch",
        "decide_backoff",
        "decide_route",
        "decide_session_scope",
    ]
    assert routing_inputs.__all__ == [
        "PoolServing",
        "QueuedJob",
        "RouteInputs",
        "RunnerFacts",
        "build_route_inputs",
        "build_runner_view",
        "build_runner_views",
        "decide_active_jobs",
        "decide_implementation_provider",
        "decide_job_route",
        "decide_pinned_runners",
        "decide_pool_serves",
        "match_label_selector",
        "parse_memory_record",
        "parse_pool",
        "parse_queued_job",
        "parse_runner",
        "parse_session_binding",
    ]
    assert routing_audit.__all__ == [
        "HOUR_LABEL",
        "JOB_LABEL_PREFIX",
        "MAX_BATCH_BYTES",
        "MAX_DECISIONS",
        "DecisionKey",
        "audit_name",
        "build_routing_batch",
        "build_routing_decisions",
        "decide_batches",
        "decide_missing_entries",
        "decide_recovery_selector",
        "decision_key",
        "held_decision_keys",
        "iter_routing_decisions",
        "job_audit_label",
        "routing_hour",
    ]

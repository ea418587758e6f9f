"""Properties of decide_route over generated runners, profiles, overrides and loads.

An independent oracle (written here from the specification, not from the implementation)
says which (runner, option) pairs satisfy every requirement; the properties compare
decide_route against it:

- fail closed: nothing is assigned when no pair satisfies every requirement, and something is
  assigned whenever one does;
- a non-schedulable runner is never chosen, and the choice satisfies every requirement;
- an explicit model is honoured or refused, never swapped;
- the first eligible option wins (review diversity first for a review);
- the same input gives the same decision, also with the runners shuffled;
- routing jobs one after another never puts a runner past its concurrency.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from routing_builders import NOW, binding, job, mapping, runner

from helmhive.api.common import JobKind
from helmhive.api.job import ModelSource, ProfileBinding
from helmhive.api.reasons import Reason
from helmhive.policy.routing.route import (
    MAX_CANDIDATES,
    RouteOption,
    RouteOutcome,
    RoutingDecision,
    RoutingJob,
    RunnerKey,
    RunnerView,
    decide_route,
)

PROVIDERS = ["anthropic", "openai", "google"]
MODELS = ["m1", "m2", "m3", "m4"]
CAPS = ["diff-review", "structured-output", "gpu"]
LABEL_KEYS = ["domain", "region"]
LABEL_VALUES = ["code", "eu"]


@st.composite
def runners(draw: st.DrawFn) -> list[RunnerView]:
    count = draw(st.integers(min_value=0, max_value=8))
    out = []
    for i in range(count):
        models = draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=3))
        out.append(
            runner(
                f"r{i}",
                draw(st.sampled_from(PROVIDERS)),
                models=models,
                default=draw(st.none() | st.sampled_from(MODELS)),
                capabilities=draw(st.lists(st.sampled_from(CAPS), unique=True)),
                labels=draw(st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES))),
                concurrency=draw(st.integers(min_value=0, max_value=3)),
                schedulable=draw(st.booleans()),
                reason="HeartbeatStale",
                serves=draw(st.booleans()),
                namespace=draw(st.sampled_from(["team", "shared"])),
            )
        )
    return out


@st.composite
def profiles(draw: st.DrawFn) -> ProfileBinding:
    providers = draw(st.lists(st.sampled_from(PROVIDERS), unique=True, min_size=1, max_size=3))
    mappings = [
        mapping(
            p,
            draw(st.none() | st.sampled_from(MODELS)),
            *draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=2)),
        )
        for p in providers
    ]
    return binding(
        *mappings,
        capabilities=draw(st.lists(st.sampled_from(CAPS), unique=True, max_size=2)),
        labels=draw(st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=1)),
        allow_override=draw(st.booleans()),
    )


overrides = st.none() | st.fixed_dictionaries(
    {},
    optional={"provider": st.sampled_from(PROVIDERS), "model": st.sampled_from(MODELS)},
)


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    found = draw(runners())
    active = {r.key: draw(st.integers(min_value=0, max_value=3)) for r in found}
    override = draw(overrides)
    return {
        "runners": found,
        "binding": draw(profiles()),
        "job": job(kind=JobKind.IMPLEMENTATION_PROBE, model=override),
        "active": active,
        "avoid": draw(st.none() | st.sampled_from(PROVIDERS)),
    }


def decide(case: dict[str, Any], runners_: list[RunnerView] | None = None) -> RoutingDecision:
    return decide_route(
        job=case["job"],
        binding=case["binding"],
        runners=case["runners"] if runners_ is None else runners_,
        active_jobs=case["active"],
        now=NOW,
        avoid_provider=case["avoid"],
    )


# The oracle ------------------------------------------------------------------------------------


def oracle_options(job_: RoutingJob, profile: ProfileBinding, avoid: str | None) -> list[RouteOption]:
    """The options in preference order, written straight from the specification."""
    override = job_.spec.model
    out: list[tuple[int, str, str | None, ModelSource]] = []
    for index, m in enumerate(profile.snapshot.provider_mappings):
        if override is not None and override.provider and m.provider != override.provider:
            continue
        if override is not None and override.model:
            out.append((index, m.provider, override.model, ModelSource.OVERRIDE))
            continue
        out.append((index, m.provider, m.model, ModelSource.MAPPING if m.model else ModelSource.RUNNER_DEFAULT))
        out.extend((index, m.provider, fb, ModelSource.FALLBACK) for fb in m.fallback_models)
    if avoid:
        out = [o for o in out if o[1] != avoid] + [o for o in out if o[1] == avoid]
    return [
        RouteOption(position=p, mapping_index=i, provider=prov, model=mod, source=src, effort=None)
        for p, (i, prov, mod, src) in enumerate(out)
    ]


def satisfies(r: RunnerView, option: RouteOption, profile: ProfileBinding, active: dict[RunnerKey, int]) -> bool:
    snapshot = profile.snapshot
    model_ok = (
        (option.model in r.models or option.model == r.default_model)
        if option.model is not None
        else r.default_model is not None
    )
    return (
        r.schedulable
        and r.serves_namespace
        and r.provider == option.provider
        and all(c in r.capabilities for c in snapshot.required_capabilities)
        and all(r.labels.get(k) == v for k, v in snapshot.required_labels.items())
        and model_ok
        and active.get(r.key, 0) < r.concurrency
    )


def eligible_pairs(case: dict[str, Any]) -> list[tuple[RunnerView, RouteOption]]:
    override_blocked = (
        case["job"].spec.model is not None
        and (case["job"].spec.model.provider or case["job"].spec.model.model)
        and not case["binding"].snapshot.allow_model_override
    )
    if override_blocked:
        return []
    options = oracle_options(case["job"], case["binding"], case["avoid"])
    return [(r, o) for o in options for r in case["runners"] if satisfies(r, o, case["binding"], case["active"])]


# Properties ---------------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(cases())
def test_fails_closed_exactly_when_no_runner_satisfies_every_requirement(case: dict[str, Any]) -> None:
    decision = decide(case)
    pairs = eligible_pairs(case)
    if not pairs:
        assert decision.outcome is not RouteOutcome.ASSIGNED
        assert decision.choice is None
        assert decision.reason is not Reason.ASSIGNED
    else:
        assert decision.outcome is RouteOutcome.ASSIGNED
    assert len(decision.candidates) <= MAX_CANDIDATES
    assert decision.considered_runners == len(case["runners"])


@settings(max_examples=400, deadline=None)
@given(cases())
def test_the_choice_satisfies_every_requirement_and_is_the_first_eligible_option(case: dict[str, Any]) -> None:
    decision = decide(case)
    choice = decision.choice
    if choice is None:
        return
    chosen = next(r for r in case["runners"] if r.key == choice.runner_key)
    assert chosen.schedulable
    pairs = eligible_pairs(case)
    first = min(o.position for _, o in pairs)
    firsts = {(r.key, o.mapping_index, o.model, o.source) for r, o in pairs if o.position == first}
    option_model = None if choice.model_source is ModelSource.RUNNER_DEFAULT else choice.model
    assert (chosen.key, choice.mapping_index, option_model, choice.model_source) in firsts
    if choice.model_source is ModelSource.RUNNER_DEFAULT:
        assert choice.model == chosen.default_model
    assert case["active"].get(chosen.key, 0) < chosen.concurrency


@settings(max_examples=400, deadline=None)
@given(cases())
def test_an_explicit_model_is_honoured_or_refused_never_swapped(case: dict[str, Any]) -> None:
    decision = decide(case)
    override = case["job"].spec.model
    if decision.choice is None:
        return
    if override is not None and override.model:
        assert decision.choice.model == override.model
        assert decision.choice.model_source is ModelSource.OVERRIDE
    else:
        named = case["binding"].snapshot.provider_mappings[decision.choice.mapping_index]
        allowed = {named.model, *named.fallback_models} - {None}
        if decision.choice.model_source is not ModelSource.RUNNER_DEFAULT:
            assert decision.choice.model in allowed
        else:
            assert named.model is None


@settings(max_examples=300, deadline=None)
@given(cases())
def test_review_diversity_holds_whenever_another_provider_is_eligible(case: dict[str, Any]) -> None:
    avoid = case["avoid"]
    decision = decide(case)
    if avoid is None or decision.choice is None:
        return
    if any(o.provider != avoid for _, o in eligible_pairs(case)):
        assert decision.choice.provider != avoid
    assert decision.avoided_provider == avoid


@settings(max_examples=300, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_deterministic_also_with_the_runners_shuffled(case: dict[str, Any], rnd: Any) -> None:
    first = decide(case)
    assert decide(case) == first
    shuffled = list(case["runners"])
    rnd.shuffle(shuffled)
    assert decide(case, shuffled) == first


@settings(max_examples=200, deadline=None)
@given(runners(), profiles(), st.integers(min_value=1, max_value=25))
def test_routing_one_job_after_another_never_exceeds_concurrency(
    found: list[RunnerView], profile: ProfileBinding, jobs: int
) -> None:
    active: dict[RunnerKey, int] = {}
    capacity = {r.key: r.concurrency for r in found}
    for number in range(jobs):
        decision = decide_route(job=job(name=f"j{number}"), binding=profile, runners=found, active_jobs=active, now=NOW)
        if decision.choice is not None:
            key = decision.choice.runner_key
            active[key] = active.get(key, 0) + 1
        else:
            assert decision.outcome in (RouteOutcome.WAITING, RouteOutcome.FAILED)
    assert all(count <= capacity[key] for key, count in active.items())


@settings(max_examples=300, deadline=None)
@given(cases())
def test_waiting_only_when_concurrency_is_the_only_obstacle(case: dict[str, Any]) -> None:
    decision = decide(case)
    if decision.outcome is not RouteOutcome.WAITING:
        return
    assert decision.capacity_blocked
    unlimited = {key: 0 for key in case["active"]}
    relaxed = dict(case, active=unlimited)
    # With every slot free, some blocked runner satisfies every requirement.
    assert {r.key for r, _ in eligible_pairs(relaxed)} & decision.capacity_blocked
    later = decide_route(
        job=case["job"],
        binding=case["binding"],
        runners=case["runners"],
        active_jobs=case["active"],
        now=case["binding"].bound_at + dt.timedelta(hours=1),
        avoid_provider=case["avoid"],
    )
    assert later.reason is Reason.CAPACITY_DEADLINE_EXCEEDED


def test_the_oracle_agrees_with_a_hand_checked_case() -> None:
    # Guard against a vacuous oracle: one clear case each way.
    case = {
        "runners": [runner("a", models=["m1"])],
        "binding": binding(mapping("anthropic", "m1")),
        "job": job(),
        "active": {},
        "avoid": None,
    }
    assert len(eligible_pairs(case)) == 1
    assert not eligible_pairs(dict(case, runners=[dataclasses.replace(runner("a", models=["m1"]), schedulable=False)]))

"""Routing on what runners really offer: discovered session capabilities and efforts per model (issue 39).

A resuming (forking) profile is refused at queue time on a runner whose agent did not advertise
``session-load`` (``session-fork``); an effort the chosen model does not offer is refused per
candidate (``EffortNotOffered:<model>/<effort>``) and, when no runner offers it, fails the job
closed with reason ``EffortNotOffered``; a capability the pool declared but the agent did not
advertise is not offered, so routing refuses it (``MissingCapability``).
"""

from __future__ import annotations

from routing_builders import NOW, binding, job, mapping, runner

from helmhive.api.common import JobKind, SessionPolicy
from helmhive.api.reasons import Reason
from helmhive.api.runner import (
    AdapterInfo,
    AuthReport,
    AuthState,
    CapabilitySource,
    RunnerReport,
    WithheldReason,
)
from helmhive.api.runnerpool import AdapterType
from helmhive.policy.routing.fleet import RunnerFacts, build_runner_view
from helmhive.policy.routing.route import RouteOutcome, RoutingDecision, RunnerView, decide_route
from helmhive.policy.runners.capabilities import (
    decide_capabilities,
    decide_pool_capabilities_condition,
    decide_runner_capabilities_condition,
    decide_session_requirements,
)


def _route(
    runners: list[RunnerView], *, session: SessionPolicy = SessionPolicy.FRESH, **profile: object
) -> RoutingDecision:
    mappings = profile.pop("mappings", None) or [mapping("anthropic", "sonnet")]
    return decide_route(
        job=job(),
        binding=binding(*mappings, session=session),  # type: ignore[arg-type]
        runners=runners,
        active_jobs={},
        now=NOW,
    )


def _view(report: RunnerReport) -> RunnerView:
    """The schedulable runner ``pool-0`` with ``report``, as routing sees it."""
    facts = RunnerFacts(
        namespace="team",
        name="pool-0",
        pool="pool",
        report=report,
        schedulable=True,
        schedulable_reason="Schedulable",
        reported_status=None,
        control_state=None,
    )
    return build_runner_view(runner=facts, pool=None, serves_namespace=True)


def _reasons(decision: RoutingDecision) -> dict[str, str]:
    return {c.runner: c.reason for c in decision.candidates}


def test_a_resuming_profile_needs_an_agent_that_loads_sessions() -> None:
    runners = [runner("a-no-load", agent_capabilities=["session-fork"]), runner("b-loads")]
    decision = _route(runners, session=SessionPolicy.RESUME)
    assert decision.choice is not None and decision.choice.runner == "b-loads"
    assert _reasons(decision)["a-no-load"] == "MissingCapability:session-load"

    alone = _route(runners[:1], session=SessionPolicy.RESUME)
    assert alone.outcome is RouteOutcome.FAILED and alone.reason is Reason.NO_ELIGIBLE_RUNNER
    assert "MissingCapability:session-load" in alone.message


def test_a_forking_profile_needs_an_agent_that_forks_sessions() -> None:
    decision = _route([runner("a", agent_capabilities=["session-load"])], session=SessionPolicy.FORK)
    assert decision.outcome is RouteOutcome.FAILED
    assert _reasons(decision)["a"] == "MissingCapability:session-fork"


def test_a_fresh_or_governed_job_needs_no_session_capability() -> None:
    bare = [runner("a", agent_capabilities=[])]
    assert _route(bare).outcome is RouteOutcome.ASSIGNED
    assert decide_session_requirements(policy=SessionPolicy.RESUME, resumable=False) == ()
    governed = decide_route(
        job=job(kind=JobKind.CHANGE_REVIEW),
        binding=binding(mapping("anthropic", "sonnet"), session=SessionPolicy.RESUME, envelope=JobKind.CHANGE_REVIEW),
        runners=bare,
        active_jobs={},
        now=NOW,
    )
    assert governed.outcome is RouteOutcome.ASSIGNED  # a governed stage always starts fresh


def test_an_effort_the_model_does_not_offer_is_refused_per_candidate() -> None:
    small_no_high = runner("a-small", models=["small", "large"], efforts={"small": ["low", "medium"], "large": []})
    offers = runner("b-offers", models=["small"], efforts={"small": ["low", "medium", "high"]})
    profile = [mapping("anthropic", "small", effort="high")]
    decision = _route([small_no_high, offers], mappings=profile)
    assert decision.choice is not None and decision.choice.runner == "b-offers"
    assert _reasons(decision)["a-small"] == "EffortNotOffered:small/high"


def test_no_runner_offering_the_effort_fails_closed_with_its_reason() -> None:
    only = runner("a", models=["small"], efforts={"small": ["low"]})
    decision = _route([only], mappings=[mapping("anthropic", "small", effort="high")])
    assert decision.outcome is RouteOutcome.FAILED
    assert decision.reason is Reason.EFFORT_NOT_OFFERED
    assert "small/high" in decision.message


def test_a_fallback_model_that_offers_the_effort_is_taken() -> None:
    both = runner("a", models=["small", "large"], efforts={"small": ["low"], "large": ["low", "high"]})
    decision = _route([both], mappings=[mapping("anthropic", "small", "large", effort="high")])
    assert decision.choice is not None
    assert (decision.choice.model, decision.choice.effort) == ("large", "high")


def test_an_effort_on_the_runners_default_model_is_checked_against_the_default() -> None:
    default_only = runner("a", models=[], default="house", efforts={"house": ["medium"]})
    assert _route([default_only], mappings=[mapping("anthropic", None, effort="medium")]).routed
    refused = _route([default_only], mappings=[mapping("anthropic", None, effort="high")])
    assert _reasons(refused)["a"] == "EffortNotOffered:house/high"


# -- the capability decision and the conditions --------------------------------------------------


def test_declared_agent_capabilities_are_intersected_with_the_advertisement() -> None:
    decision = decide_capabilities(
        declared=["structured-output", "session-load", "mcp-http"], advertised=["session-load", "session-fork"]
    )
    assert decision.names == ["structured-output", "session-load"]
    assert [(o.name, o.source) for o in decision.offered] == [
        ("structured-output", CapabilitySource.POOL),
        ("session-load", CapabilitySource.AGENT),
    ]
    assert [(w.name, w.reason) for w in decision.withheld] == [("mcp-http", WithheldReason.NOT_ADVERTISED)]
    unprobed = decide_capabilities(declared=["session-load", "diff-review"], advertised=None)
    assert unprobed.names == ["diff-review"]
    assert [w.reason for w in unprobed.withheld] == [WithheldReason.AGENT_NOT_PROBED]


def _report(*, declared: list[str], advertised: list[str] | None) -> RunnerReport:
    decision = decide_capabilities(declared=declared, advertised=advertised)
    return RunnerReport(
        provider="anthropic",
        adapter=AdapterInfo(type=AdapterType.ACP, name="helmhive-reference-agent", version="1.0"),
        authentication=AuthReport(state=AuthState.AUTHENTICATED),
        capabilities=decision.names,
        offered_capabilities=list(decision.offered),
        withheld_capabilities=list(decision.withheld),
        agent_capabilities=advertised,
        environment_fingerprint="sha256:00",
        pod_name="pool-0",
        reported_at=NOW,
    )


def test_the_runner_and_pool_conditions_name_a_declared_capability_the_agent_lacks() -> None:
    lacking = _report(declared=["mcp-sse", "diff-review"], advertised=["session-load"])
    verdict = decide_runner_capabilities_condition(lacking)
    assert (verdict.status, verdict.reason) == (False, Reason.CAPABILITY_NOT_ADVERTISED)
    assert "mcp-sse" in verdict.message and "diff-review" not in verdict.message
    fine = _report(declared=["session-load", "diff-review"], advertised=["session-load"])
    assert decide_runner_capabilities_condition(fine).status is True
    unprobed = _report(declared=["session-load"], advertised=None)
    assert decide_runner_capabilities_condition(unprobed).reason == Reason.AGENT_NOT_PROBED

    pool = decide_pool_capabilities_condition(declared=["mcp-sse", "diff-review"], reports=[lacking, None])
    assert (pool.status, pool.reason) == (False, Reason.CAPABILITY_NOT_ADVERTISED)
    assert "1 of 1 probed" in pool.message
    waiting = decide_pool_capabilities_condition(declared=["session-load"], reports=[unprobed])
    assert (waiting.status, waiting.reason) == (None, Reason.AGENT_NOT_PROBED)
    nothing = decide_pool_capabilities_condition(declared=["diff-review"], reports=[])
    assert nothing.status is True


def test_routing_reads_only_the_offered_capabilities_and_the_advertisement() -> None:
    report = _report(declared=["mcp-sse", "diff-review"], advertised=["session-load"])
    view = _view(report)
    assert view.capabilities == {"diff-review"}
    assert view.agent_capabilities == {"session-load"}


# -- what a runner has not learnt yet --------------------------------------------------------------


def test_a_resuming_job_waits_for_a_runner_whose_agent_was_not_probed_yet() -> None:
    """Not probed is not "not advertised": the job waits (visibly) instead of failing closed."""
    unprobed = runner("a", agent_capabilities=None)
    decision = _route([unprobed], session=SessionPolicy.RESUME)
    assert decision.outcome is RouteOutcome.WAITING
    assert _reasons(decision)["a"] == "MissingCapability:session-load/AgentNotProbed"
    assert "a (MissingCapability:session-load/AgentNotProbed)" in decision.message
    # A fresh job needs nothing of the agent, and runs there at once.
    assert _route([unprobed]).outcome is RouteOutcome.ASSIGNED
    # Beside a runner whose agent lacks it: still waiting, not failed with the other's reason.
    lacking = runner("b", agent_capabilities=["session-fork"])
    assert _route([unprobed, lacking], session=SessionPolicy.RESUME).outcome is RouteOutcome.WAITING
    assert _route([lacking], session=SessionPolicy.RESUME).outcome is RouteOutcome.FAILED


def test_efforts_not_learnt_are_left_to_the_runner() -> None:
    """A model whose efforts the probe did not learn (None) is not refused an effort at queue time."""
    unlearnt = runner("a", models=["small", "large"], efforts={"small": ["low"], "large": None})
    decision = _route([unlearnt], mappings=[mapping("anthropic", "large", effort="high")])
    assert decision.choice is not None and decision.choice.effort == "high"
    learnt = _route([unlearnt], mappings=[mapping("anthropic", "small", effort="high")])
    assert learnt.reason is Reason.EFFORT_NOT_OFFERED


def test_a_report_without_the_advertisement_has_learnt_no_efforts() -> None:
    """A runner that never probed its agent (or is older than per-model efforts) reports none learnt."""
    report = _report(declared=["diff-review"], advertised=None)
    view = _view(report)
    assert view.agent_capabilities is None
    assert view.offers_effort("anything", "high")
    verdict = decide_runner_capabilities_condition(report)
    assert (verdict.status, verdict.reason) == (None, Reason.AGENT_NOT_PROBED)

"""Runner qualification, decided purely: rounds, probes in order, what blocks the runner, and when to look again."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from helmhive.api.audit import AuditAction
from helmhive.api.common import ControlState
from helmhive.api.qualification import (
    ProbeKind,
    ProbeOutcome,
    QualificationSpec,
    QualificationState,
    RunnerQualification,
)
from helmhive.api.reasons import Reason
from helmhive.api.runner import ReportedStatus
from helmhive.policy.routing.inputs import decide_pinned_runners
from helmhive.policy.routing.route import RunnerView
from helmhive.policy.runners.pool import PoolRef
from helmhive.policy.runners.probes import build_probe_job, build_qualification_objects
from helmhive.policy.runners.qualification import (
    MAX_FAILURES,
    ProbeJobView,
    QualificationDecision,
    QualificationFacts,
    apply_qualification,
    build_probe_job_name,
    decide_qualification,
    decide_round_backoff,
    parse_probe_job,
)
from helmhive.policy.runners.state import ConditionVerdict, RunnerDerived

NOW = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
REGISTERED = NOW - dt.timedelta(minutes=5)
RUNNER = "pool-a-0"
SPEC = QualificationSpec(probes=[ProbeKind.CONNECTION_TEST, ProbeKind.REVIEW_PROBE], every_seconds=3600)


def facts(
    *,
    stored: RunnerQualification | None = None,
    jobs: dict[str, ProbeJobView] | None = None,
    may_start: bool = True,
    registered_at: dt.datetime | None = REGISTERED,
    generation: int = 1,
) -> QualificationFacts:
    return QualificationFacts(
        runner=RUNNER,
        registered_at=registered_at,
        credential_generation=generation,
        stored=stored,
        jobs=jobs or {},
        may_start=may_start,
    )


def job(
    kind: ProbeKind, round_: int, outcome: ProbeOutcome, *, at: dt.datetime = NOW, reason: str = ""
) -> ProbeJobView:
    finished = at if outcome in (ProbeOutcome.SUCCEEDED, ProbeOutcome.FAILED) else None
    return ProbeJobView(
        name=build_probe_job_name(RUNNER, round_, kind),
        kind=kind,
        round=round_,
        outcome=outcome,
        reason=reason,
        finished_at=finished,
    )


def jobs(*views: ProbeJobView) -> dict[str, ProbeJobView]:
    return {v.name: v for v in views}


def decide(spec: QualificationSpec | None = SPEC, *, now: dt.datetime = NOW, **kw: Any) -> QualificationDecision:
    return decide_qualification(spec=spec, facts=facts(**kw), now=now)


def qualified_record(*, at: dt.datetime = NOW, round_: int = 1) -> RunnerQualification:
    """The record after round ``round_`` passed at ``at``."""
    first = decide(now=at)
    assert first.record is not None
    record = first.record.model_copy(update={"round": round_})
    done = decide(
        stored=record,
        jobs=jobs(
            job(ProbeKind.CONNECTION_TEST, round_, ProbeOutcome.SUCCEEDED, at=at),
            job(ProbeKind.REVIEW_PROBE, round_, ProbeOutcome.SUCCEEDED, at=at),
        ),
        now=at,
    )
    assert done.record is not None and done.record.state is QualificationState.QUALIFIED
    return done.record


def test_a_new_runner_is_pending_and_its_first_probe_starts() -> None:
    decision = decide()
    assert decision.record is not None
    assert decision.record.round == 1 and decision.record.state is QualificationState.QUALIFYING
    assert decision.start is not None and decision.start.kind is ProbeKind.CONNECTION_TEST
    assert decision.start.job == f"{RUNNER}-q1-connection"
    assert decision.block is not None and decision.block.reason == Reason.QUALIFICATION_PENDING
    assert decision.condition is not None and decision.condition.status is None  # Qualified=Unknown
    assert [p.kind for p in decision.record.probes] == [ProbeKind.CONNECTION_TEST, ProbeKind.REVIEW_PROBE]


def test_no_probe_starts_without_a_free_slot_and_the_runner_asks_to_be_woken() -> None:
    decision = decide(may_start=False)
    assert decision.start is None and decision.wants_slot
    assert decision.block is not None and decision.block.reason == Reason.QUALIFICATION_PENDING


def test_probes_run_one_at_a_time_in_the_pools_order() -> None:
    record = decide().record
    running = decide(stored=record, jobs=jobs(job(ProbeKind.CONNECTION_TEST, 1, ProbeOutcome.RUNNING)))
    assert running.start is None and not running.wants_slot  # one in flight: nothing else starts
    assert running.record is not None and running.record.probes[0].outcome is ProbeOutcome.RUNNING
    passed = decide(stored=running.record, jobs=jobs(job(ProbeKind.CONNECTION_TEST, 1, ProbeOutcome.SUCCEEDED)))
    assert passed.start is not None and passed.start.kind is ProbeKind.REVIEW_PROBE
    assert passed.block is not None and passed.block.reason == Reason.QUALIFICATION_PENDING
    assert passed.ended is None


def test_a_passed_round_qualifies_the_runner_is_audited_and_schedules_the_next() -> None:
    record = decide().record
    both = jobs(
        job(ProbeKind.CONNECTION_TEST, 1, ProbeOutcome.SUCCEEDED, at=NOW - dt.timedelta(seconds=30)),
        job(ProbeKind.REVIEW_PROBE, 1, ProbeOutcome.SUCCEEDED, at=NOW - dt.timedelta(seconds=10)),
    )
    decision = decide(stored=record, jobs=both)
    assert decision.record is not None and decision.record.state is QualificationState.QUALIFIED
    assert decision.block is None
    assert decision.condition == ConditionVerdict(
        status=True, reason=Reason.QUALIFIED, message=decision.condition.message if decision.condition else ""
    )
    assert decision.ended is AuditAction.RUNNER_QUALIFIED
    assert decision.record.qualified_at == NOW - dt.timedelta(seconds=10)
    assert decision.review_at == NOW - dt.timedelta(seconds=10) + dt.timedelta(seconds=3600)
    again = decide(stored=decision.record, jobs=both)
    assert again.ended is None and again.record == decision.record  # nothing new: no second audit, no write


def test_a_failed_probe_fails_the_round_and_makes_the_runner_need_attention() -> None:
    record = decide().record
    failed = job(ProbeKind.CONNECTION_TEST, 1, ProbeOutcome.FAILED, reason="AgentCrashed")
    decision = decide(stored=record, jobs=jobs(failed))
    assert decision.record is not None and decision.record.state is QualificationState.FAILED
    assert decision.record.failures == 1
    assert decision.block is not None and decision.block.reason == Reason.QUALIFICATION_FAILED
    assert "connection-test" in decision.block.message and "AgentCrashed" in decision.block.message
    assert decision.ended is AuditAction.RUNNER_QUALIFICATION_FAILED
    assert decision.start is None  # the review probe never starts after a failure
    assert decision.record.probes[1].outcome is ProbeOutcome.PENDING
    assert decision.review_at == NOW + dt.timedelta(seconds=30)
    derived = schedulable_derivation()
    blocked = apply_qualification(derived, decision)
    assert blocked.schedulable.status is False and blocked.schedulable.reason == Reason.QUALIFICATION_FAILED
    assert blocked.reported_status is ReportedStatus.NEEDS_ATTENTION


def test_after_the_backoff_a_failed_runner_tries_a_new_round() -> None:
    record = decide().record
    failed = decide(
        stored=record, jobs=jobs(job(ProbeKind.CONNECTION_TEST, 1, ProbeOutcome.FAILED, reason="TimedOut"))
    ).record
    too_soon = decide(stored=failed, now=NOW + dt.timedelta(seconds=29))
    assert too_soon.record == failed and too_soon.start is None
    retry = decide(stored=failed, now=NOW + dt.timedelta(seconds=30))
    assert retry.record is not None and retry.record.round == 2 and retry.record.failures == 1
    assert retry.start is not None and retry.start.job == f"{RUNNER}-q2-connection"
    # Still failed (and NeedsAttention) while the retry runs: the last failure is kept.
    assert retry.block is not None and retry.block.reason == Reason.QUALIFICATION_FAILED
    assert "round 1: connection-test" in retry.block.message and "round 2 retries" in retry.block.message
    passed = decide(
        stored=retry.record,
        jobs=jobs(
            job(ProbeKind.CONNECTION_TEST, 2, ProbeOutcome.SUCCEEDED),
            job(ProbeKind.REVIEW_PROBE, 2, ProbeOutcome.SUCCEEDED),
        ),
        now=NOW + dt.timedelta(seconds=40),
    )
    assert passed.block is None and passed.record is not None
    assert (passed.record.failures, passed.record.last_failure) == (0, "")


def test_a_failed_periodic_round_is_not_hidden_by_an_earlier_pass() -> None:
    qualified = qualified_record()
    due = NOW + dt.timedelta(seconds=3600)
    periodic = decide(stored=qualified, now=due).record
    failed = decide(stored=periodic, jobs=jobs(job(ProbeKind.CONNECTION_TEST, 2, ProbeOutcome.FAILED, at=due)), now=due)
    assert failed.block is not None and failed.block.reason == Reason.QUALIFICATION_FAILED
    retry = decide(stored=failed.record, now=due + dt.timedelta(seconds=30))
    assert retry.record is not None and retry.record.round == 3
    assert retry.block is not None and retry.block.reason == Reason.QUALIFICATION_FAILED


def test_the_retry_delay_doubles_and_is_capped() -> None:
    delays = [decide_round_backoff(failures=n, spec=SPEC).total_seconds() for n in range(1, 10)]
    assert delays[:4] == [30, 60, 120, 240]
    assert max(delays) == 3600 and delays == sorted(delays)
    no_period = QualificationSpec(probes=[ProbeKind.CONNECTION_TEST])
    assert decide_round_backoff(failures=40, spec=no_period) == dt.timedelta(hours=1)


@pytest.mark.parametrize("change", ["registration", "credential"])
def test_a_new_registration_or_credential_starts_over(change: str) -> None:
    qualified = qualified_record()
    kw: dict[str, Any] = (
        {"registered_at": NOW} if change == "registration" else {"generation": 2, "registered_at": REGISTERED}
    )
    decision = decide(stored=qualified, **kw)
    assert decision.record is not None and decision.record.round == 2
    assert decision.record.qualified_at is None  # what passed before does not count for the new target
    assert decision.block is not None and decision.block.reason == Reason.QUALIFICATION_PENDING
    assert decision.start is not None


def test_a_periodic_round_keeps_a_qualified_runner_schedulable_until_stale() -> None:
    qualified = qualified_record()
    due = NOW + dt.timedelta(seconds=3600)
    busy = decide(stored=qualified, may_start=False, now=due)
    assert busy.record is not None and busy.record.round == 2 and busy.record.state is QualificationState.QUALIFYING
    assert busy.block is None and busy.wants_slot  # still qualified while the round waits for a slot
    assert busy.review_at == NOW + dt.timedelta(seconds=7200)  # staleness: twice everySeconds by default
    stale = decide(stored=busy.record, may_start=False, now=NOW + dt.timedelta(seconds=7200))
    assert stale.block is not None and stale.block.reason == Reason.QUALIFICATION_STALE
    assert apply_qualification(schedulable_derivation(), stale).reported_status is ReportedStatus.NEEDS_ATTENTION


def test_a_changed_probe_list_starts_a_new_round() -> None:
    qualified = qualified_record()
    wider = QualificationSpec(probes=[ProbeKind.CONNECTION_TEST, ProbeKind.IMPLEMENTATION_PROBE], every_seconds=3600)
    decision = decide(wider, stored=qualified)
    assert decision.record is not None and decision.record.round == 2
    assert [p.kind for p in decision.record.probes] == wider.probes


def test_without_probes_there_is_no_record_and_no_block() -> None:
    decision = decide(None, stored=qualified_record())
    assert decision.record is None and decision.condition is None and decision.block is None


def test_an_unregistered_runner_waits_without_a_record() -> None:
    decision = decide(registered_at=None)
    assert decision.record is None and decision.start is None
    assert decision.condition is not None and decision.condition.reason == Reason.QUALIFICATION_PENDING


def test_a_block_never_hides_an_earlier_reason() -> None:
    offline = dataclasses.replace(
        schedulable_derivation(),
        schedulable=ConditionVerdict(status=False, reason=Reason.HEARTBEAT_STALE),
        reported_status=ReportedStatus.OFFLINE,
    )
    kept = apply_qualification(offline, decide())
    assert kept.schedulable.reason == Reason.HEARTBEAT_STALE and kept.reported_status is ReportedStatus.OFFLINE


def test_probe_job_names_are_bounded_and_unique() -> None:
    long_a, long_b = "a" * 60 + "-0", "a" * 60 + "-1"
    names = {build_probe_job_name(r, 12, k) for r in (long_a, long_b) for k in ProbeKind}
    assert len(names) == 6 and all(len(n) <= 63 for n in names)
    assert build_probe_job_name("short-0", 3, ProbeKind.REVIEW_PROBE) == "short-0-q3-review"


def _job_body(**status: Any) -> dict[str, Any]:
    pool = PoolRef(name="pool-a", namespace="team", uid="u-pool")
    body = build_probe_job(
        pool=pool,
        runner=RUNNER,
        runner_uid="u-runner",
        kind=ProbeKind.REVIEW_PROBE,
        name=build_probe_job_name(RUNNER, 4, ProbeKind.REVIEW_PROBE),
        round_=4,
        timeout_seconds=300,
    )
    body["metadata"]["resourceVersion"] = "7"
    body["status"] = status
    return body


def _cond(ctype: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "lastTransitionTime": "2026-06-01T12:00:00Z"}


def test_parse_probe_job_reads_the_outcome() -> None:
    parsed = parse_probe_job(_job_body())
    assert parsed is not None
    key, view = parsed
    assert key == ("team", RUNNER) and view.round == 4 and view.kind is ProbeKind.REVIEW_PROBE
    assert view.outcome is ProbeOutcome.PENDING
    waiting = parse_probe_job(_job_body(conditions=[_cond("Routed", "False", "WaitingForCapacity")]))
    assert waiting is not None and waiting[1].outcome is ProbeOutcome.PENDING
    assert waiting[1].reason == "WaitingForCapacity"
    refused = parse_probe_job(_job_body(conditions=[_cond("Routed", "False", "MissingCapability:diff-review")]))
    assert refused is not None and refused[1].outcome is ProbeOutcome.FAILED
    assert refused[1].finished_at == NOW
    done = parse_probe_job(_job_body(conditions=[_cond("Succeeded", "True", "Completed")]))
    assert done is not None and done[1].outcome is ProbeOutcome.SUCCEEDED
    violated = parse_probe_job(_job_body(conditions=[_cond("Succeeded", "False", "OutputContractViolated")]))
    assert violated is not None and violated[1].outcome is ProbeOutcome.FAILED


def test_a_probe_failure_the_operator_reruns_is_not_its_outcome_yet() -> None:
    crashed = parse_probe_job(_job_body(conditions=[_cond("Succeeded", "False", "AgentCrashed")], attempts=0))
    assert crashed is not None and crashed[1].outcome is ProbeOutcome.RUNNING
    final = parse_probe_job(_job_body(conditions=[_cond("Succeeded", "False", "AgentCrashed")], attempts=1))
    assert final is not None and final[1].outcome is ProbeOutcome.FAILED


def test_other_jobs_are_not_probes() -> None:
    body = _job_body()
    del body["metadata"]["labels"]["helmhive.dev/qualification"]
    assert parse_probe_job(body) is None


def test_the_spec_refuses_a_stale_bound_below_the_period() -> None:
    with pytest.raises(ValidationError, match="staleAfterSeconds needs everySeconds"):
        QualificationSpec(probes=[ProbeKind.CONNECTION_TEST], stale_after_seconds=600)
    with pytest.raises(ValidationError, match="staleAfterSeconds needs everySeconds"):
        QualificationSpec.model_validate({"probes": ["connection-test"], "everySeconds": 900, "staleAfterSeconds": 600})
    with pytest.raises(ValidationError):
        QualificationSpec.model_validate({"probes": ["change-planning"]})
    ok = QualificationSpec.model_validate({"probes": ["connection-test"], "everySeconds": 900})
    assert ok.stale_after() == dt.timedelta(seconds=1800)


def test_the_pools_objects_bind_each_probe_to_its_profile() -> None:
    pool = PoolRef(name="pool-a", namespace="team", uid="u-pool")
    workspace, *profiles = build_qualification_objects(pool, SPEC, provider="anthropic")
    bindings = {b["jobKind"]: b["profile"] for b in workspace["spec"]["profiles"]}
    assert bindings == {p["spec"]["envelope"]: p["metadata"]["name"] for p in profiles}
    for obj in (workspace, *profiles):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-pool"
    for profile in profiles:
        assert profile["spec"]["providerMappings"] == [{"provider": "anthropic"}]
        assert "memory" not in profile["spec"]  # the default: no memory


def schedulable_derivation() -> RunnerDerived:
    yes = ConditionVerdict(status=True, reason=Reason.SCHEDULABLE)
    return RunnerDerived(
        reported_status=ReportedStatus.ONLINE,
        effective_control_state=ControlState.ACTIVE,
        online=yes,
        authenticated=yes,
        schedulable=yes,
        heartbeat_time=NOW,
    )


def _view(name: str, *, reason: str | None = None, serves: bool = True) -> RunnerView:
    return RunnerView(
        namespace="team",
        name=name,
        pool="pool-a",
        provider="anthropic",
        schedulable=reason is None,
        schedulable_reason=reason or Reason.SCHEDULABLE.value,
        default_model="m",
        serves_namespace=serves,
    )


def test_a_probe_sees_only_its_runner_past_qualifications_own_block() -> None:
    fleet = [
        _view("pool-a-0", reason=Reason.QUALIFICATION_FAILED, serves=False),
        _view("pool-a-1"),
        _view("pool-b-0", reason=Reason.QUALIFICATION_PENDING),
    ]
    (pinned,) = decide_pinned_runners(fleet, namespace="team", name="pool-a-0")
    assert pinned.name == "pool-a-0" and pinned.schedulable and pinned.serves_namespace
    for reason in (Reason.QUALIFICATION_PENDING, Reason.QUALIFICATION_STALE):
        (again,) = decide_pinned_runners([_view("x-0", reason=reason)], namespace="team", name="x-0")
        assert again.schedulable
    (offline,) = decide_pinned_runners([_view("x-0", reason=Reason.HEARTBEAT_STALE)], namespace="team", name="x-0")
    assert not offline.schedulable and offline.schedulable_reason == Reason.HEARTBEAT_STALE
    assert decide_pinned_runners(fleet, namespace="other", name="pool-a-0") == []


def test_a_probe_waits_while_an_earlier_rounds_probe_is_still_in_flight() -> None:
    qualified = qualified_record()
    left_over = job(ProbeKind.REVIEW_PROBE, 1, ProbeOutcome.RUNNING)
    rotated = decide(stored=qualified, generation=2, jobs=jobs(left_over))
    assert rotated.record is not None and rotated.record.round == 2
    assert rotated.start is None and not rotated.wants_slot  # the old job's deletion wakes the loop
    gone = decide(stored=rotated.record, generation=2)
    assert gone.start is not None and gone.start.job == f"{RUNNER}-q2-connection"


def test_failed_rounds_are_counted_up_to_the_schemas_bound() -> None:
    record = decide().record
    assert record is not None
    many = record.model_copy(update={"failures": MAX_FAILURES})
    failed = decide(stored=many, jobs=jobs(job(ProbeKind.CONNECTION_TEST, 1, ProbeOutcome.FAILED)))
    assert failed.record is not None and failed.record.failures == MAX_FAILURES
    RunnerQualification.model_validate(failed.record.to_wire())  # still a valid status


def test_a_failure_the_operator_will_not_rerun_is_the_probes_outcome() -> None:
    closed = _cond("Succeeded", "False", "AgentCrashed")
    closed["message"] = "the agent crashed; not re-run: the failure is older than the re-run window"
    parsed = parse_probe_job(_job_body(conditions=[closed], attempts=0))
    assert parsed is not None and parsed[1].outcome is ProbeOutcome.FAILED

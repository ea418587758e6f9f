"""Fresh authenticated health and the report digest: AuthStale, ReportStale and when to look again. Pure."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from helmhive.api.common import ControlState
from helmhive.api.reasons import Reason
from helmhive.api.runner import (
    AuthReport,
    AuthState,
    ModelCatalogue,
    ModelEntry,
    ReportedStatus,
    RunnerReport,
    RunnerSpec,
    build_report_digest,
)
from helmhive.api.runnerpool import HeartbeatSettings, RunnerPoolSpec
from helmhive.policy.runners.state import LeaseView, PoolFacts, RunnerDerived, decide_runner_status
from helmhive.runner.program.report import decide_verified_at, reverify_interval

NOW = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
GRACE = dt.timedelta(seconds=2)
MAX_AGE = dt.timedelta(seconds=600)
NAME = "pool-a-0"


def a_report(*, verified_ago: float | None = 60, reported_ago: float = 60, **auth: Any) -> RunnerReport:
    verified = None if verified_ago is None else NOW - dt.timedelta(seconds=verified_ago)
    return RunnerReport(
        provider="anthropic",
        adapter={"type": "acp", "name": "reference", "version": "1"},  # type: ignore[arg-type]
        authentication=AuthReport(
            state=auth.get("state", AuthState.AUTHENTICATED),
            reason=auth.get("reason", "LoggedIn"),
            verified_at=verified,
        ),
        environment_fingerprint="sha256:x",
        catalogue=ModelCatalogue(models=[ModelEntry(id="claude-sonnet-5-5")], default="claude-sonnet-5-5"),
        credential_generation=1,
        pod_name=NAME,
        reported_at=NOW - dt.timedelta(seconds=reported_ago),
    )


def a_lease(report: RunnerReport | None, *, age: float = 1, digest: str | None = None) -> LeaseView:
    return LeaseView(
        holder=NAME,
        renew_time=NOW - dt.timedelta(seconds=age),
        duration_seconds=20,
        digest=digest if digest is not None else (build_report_digest(report) if report else None),
    )


def derive(report: RunnerReport | None, lease: LeaseView | None, *, now: dt.datetime = NOW) -> RunnerDerived:
    return decide_runner_status(
        name=NAME,
        spec=RunnerSpec.model_validate({"poolRef": {"name": "pool-a"}}),
        report=report,
        pool=PoolFacts(control_state=ControlState.ACTIVE, credential_generation=1, auth_max_age=MAX_AGE),
        lease=lease,
        now=now,
        grace=GRACE,
    )


def test_fresh_confirmed_authenticated_runner_is_schedulable_and_reviewed_at_the_lease_expiry() -> None:
    report = a_report()
    derived = derive(report, a_lease(report))
    assert derived.is_schedulable and derived.reported_status is ReportedStatus.ONLINE
    # The next thing that can change without an event: the Lease expiring (renewTime + 20 s + grace).
    assert derived.review_at == NOW - dt.timedelta(seconds=1) + dt.timedelta(seconds=22, microseconds=1)


@pytest.mark.parametrize("verified_ago", [None, 600, 601, 86400])
def test_authentication_older_than_the_bound_is_auth_stale(verified_ago: float | None) -> None:
    report = a_report(verified_ago=verified_ago)
    derived = derive(report, a_lease(report))
    assert derived.reported_status is ReportedStatus.NEEDS_ATTENTION
    assert derived.authenticated.status is None and derived.authenticated.reason == Reason.AUTH_STALE
    assert derived.schedulable.status is False and derived.schedulable.reason == Reason.AUTH_STALE
    assert "heartbeat.authMaxAgeSeconds" in derived.schedulable.message


def test_auth_goes_stale_exactly_at_its_review_instant() -> None:
    report = a_report(verified_ago=590)
    lease = dataclasses.replace(a_lease(report), duration_seconds=600)
    before = derive(report, lease)
    assert before.is_schedulable
    assert before.review_at == NOW + dt.timedelta(seconds=10)  # verifiedAt + 600 s, sooner than the Lease
    assert derive(report, lease, now=before.review_at).schedulable.reason == Reason.AUTH_STALE


def test_a_lease_digest_that_disagrees_is_a_stale_report_after_the_grace() -> None:
    report = a_report(reported_ago=60)
    other = a_report(state=AuthState.UNAUTHENTICATED, reason="NotLoggedIn")
    lease = a_lease(report, digest=build_report_digest(other), age=1)
    # The two writes reach the operator by separate watches: grace after the later one (the Lease).
    assert derive(report, lease).review_at == NOW + dt.timedelta(seconds=1)
    derived = derive(report, lease, now=NOW + dt.timedelta(seconds=1))
    assert derived.reported_status is ReportedStatus.NEEDS_ATTENTION
    assert derived.schedulable.reason == Reason.REPORT_STALE
    assert derived.authenticated.reason == Reason.REPORT_STALE


def test_renewals_do_not_postpone_a_disagreement_timed_from_when_its_digest_was_first_seen() -> None:
    report = a_report(reported_ago=60)
    other = build_report_digest(a_report(state=AuthState.FAILING, reason="AgentCrashed"))
    first_seen = NOW - dt.timedelta(seconds=1.5)
    for renewed_ago in (1.0, 0.5, 0.0):  # the runner keeps renewing with the disagreeing digest
        lease = dataclasses.replace(a_lease(report, digest=other, age=renewed_ago), digest_since=first_seen)
        assert derive(report, lease).review_at == first_seen + GRACE
    assert derive(report, lease, now=first_seen + GRACE).schedulable.reason == Reason.REPORT_STALE


def test_a_lease_without_a_digest_is_a_stale_report() -> None:
    report = a_report()
    lease = dataclasses.replace(a_lease(report, age=3), digest=None)
    assert derive(report, lease).schedulable.reason == Reason.REPORT_STALE


def test_a_report_just_written_waits_the_grace_for_its_lease() -> None:
    # The runner wrote a new report 0.5 s ago; its Lease (renewed 1 s ago) still has the old digest.
    old = a_report(state=AuthState.UNAUTHENTICATED, reason="NotLoggedIn")
    report = a_report(reported_ago=0.5)
    lease = a_lease(old, age=1)
    pending = derive(report, lease)
    assert pending.is_schedulable, "in flight: the report is the newer of the two"
    assert pending.review_at == NOW - dt.timedelta(seconds=0.5) + GRACE
    assert derive(report, lease, now=pending.review_at).schedulable.reason == Reason.REPORT_STALE
    renewed = a_lease(report, age=0)
    assert derive(report, renewed, now=pending.review_at).is_schedulable


def test_an_unauthenticated_report_has_no_auth_deadline() -> None:
    report = a_report(state=AuthState.UNAUTHENTICATED, reason="NotLoggedIn", verified_ago=None)
    derived = derive(report, a_lease(report))
    assert derived.schedulable.reason == Reason.UNAUTHENTICATED
    assert derived.review_at is not None and derived.review_at <= NOW + dt.timedelta(seconds=22)


def test_the_digest_covers_catalogue_and_auth_but_not_prose_or_jobs() -> None:
    report = a_report()
    base = build_report_digest(report)
    assert base.startswith("sha256:") and len(base) == 71
    same = report.model_copy(
        update={
            "active_jobs": 3,
            "reported_at": NOW,
            "authentication": report.authentication.model_copy(update={"message": "prose"}),
        }
    )
    assert build_report_digest(same) == base
    for update in (
        {"catalogue": ModelCatalogue(models=[ModelEntry(id="claude-opus-5-5")], default="claude-opus-5-5")},
        {"authentication": report.authentication.model_copy(update={"state": AuthState.FAILING})},
        {"authentication": report.authentication.model_copy(update={"verified_at": NOW})},
    ):
        assert build_report_digest(report.model_copy(update=update)) != base


# --- The runner's side: when verifiedAt moves -----------------------------------------------------


def test_verified_at_moves_on_a_new_verdict_and_otherwise_once_a_quarter_of_the_bound() -> None:
    ok = AuthReport(state=AuthState.AUTHENTICATED, reason="LoggedIn")
    assert reverify_interval(600) == dt.timedelta(seconds=150)
    first = decide_verified_at(previous=None, current=ok, probed_at=NOW, auth_max_age_seconds=600)
    assert first == NOW
    published = ok.model_copy(update={"verified_at": first})
    later = NOW + dt.timedelta(seconds=149)
    assert decide_verified_at(previous=published, current=ok, probed_at=later, auth_max_age_seconds=600) == NOW
    due = NOW + dt.timedelta(seconds=150)
    assert decide_verified_at(previous=published, current=ok, probed_at=due, auth_max_age_seconds=600) == due
    failing = AuthReport(state=AuthState.FAILING, reason="AgentCrashed")
    assert decide_verified_at(previous=published, current=failing, probed_at=later, auth_max_age_seconds=600) == later


@pytest.mark.parametrize(
    ("heartbeat", "where"),
    [
        ({"authMaxAgeSeconds": 60}, "heartbeat.authMaxAgeSeconds"),
        ({"authMaxAgeSeconds": 86401}, "heartbeat.authMaxAgeSeconds"),
        ({"authMaxAgeSeconds": "soon"}, "heartbeat.authMaxAgeSeconds"),
    ],
)
def test_the_pool_bound_is_validated_with_its_field_path(heartbeat: dict[str, Any], where: str) -> None:
    spec = {
        "provider": "anthropic",
        "adapter": {"type": "claude-cli"},
        "image": "runner:1",
        "credential": {"secretRef": {"name": "key"}},
        "heartbeat": heartbeat,
    }
    with pytest.raises(ValueError) as caught:
        RunnerPoolSpec.model_validate(spec)
    assert where in str(caught.value)
    assert HeartbeatSettings().auth_max_age_seconds == 3600

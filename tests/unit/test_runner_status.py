"""The runner state machine: control state x heartbeat x authentication x credential -> status and reasons."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from typing import Any

import pytest

from helmhive.api.audit import AuditAction
from helmhive.api.common import ControlState
from helmhive.api.reasons import Reason
from helmhive.api.runner import AuthState, ReportedStatus, RunnerReport, RunnerSpec, RunnerStatus, build_report_digest
from helmhive.policy.conditions import find_condition
from helmhive.policy.runners.state import (
    LeaseView,
    PoolFacts,
    RunnerDerived,
    decide_effective_control_state,
    decide_pool_counts,
    decide_runner_status,
    format_time,
)
from helmhive.policy.runners.status import build_runner_status, decide_runner_transitions

NOW = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
GRACE = dt.timedelta(seconds=2)
NAME = "pool-a-0"


def report(*, auth: AuthState = AuthState.AUTHENTICATED, generation: int = 1, **extra: Any) -> RunnerReport:
    wire: dict[str, Any] = {
        "provider": "anthropic",
        "adapter": {"type": "acp", "name": "reference", "version": "1.0.0"},
        "authentication": {
            "state": auth.value,
            "reason": "SessionCreated" if auth is AuthState.AUTHENTICATED else "",
            "verifiedAt": "2026-06-01T11:59:00Z",
        },
        "environmentFingerprint": "sha256:abc",
        "credentialGeneration": generation,
        "podName": NAME,
        "reportedAt": "2026-06-01T11:59:00Z",
        **extra,
    }
    return RunnerReport.model_validate(wire)


def lease(*, age: float = 1.0, duration: int = 20, holder: str | None = NAME) -> LeaseView:
    return LeaseView(holder=holder, renew_time=NOW - dt.timedelta(seconds=age), duration_seconds=duration)


def derive(
    *,
    runner_state: ControlState | None = None,
    pool_state: ControlState = ControlState.ACTIVE,
    the_report: RunnerReport | None = None,
    the_lease: LeaseView | None = None,
    pool_generation: int = 1,
    credential_available: bool = True,
    now: dt.datetime = NOW,
    confirm: bool = True,
) -> RunnerDerived:
    """``confirm``: the Lease carries the report's digest, as a runner's does after writing it."""
    if confirm and the_lease is not None and the_report is not None and the_lease.digest is None:
        the_lease = dataclasses.replace(the_lease, digest=build_report_digest(the_report))
    return decide_runner_status(
        name=NAME,
        spec=RunnerSpec.model_validate({"poolRef": {"name": "pool-a"}, "controlState": runner_state}),
        report=the_report,
        pool=PoolFacts(
            control_state=pool_state,
            credential_generation=pool_generation,
            credential_available=credential_available,
        ),
        lease=the_lease,
        now=now,
        grace=GRACE,
    )


# --- Effective control state: the most restrictive of pool and runner ----------------------------

STATES = list(ControlState)


@pytest.mark.parametrize(("pool_state", "runner_state"), list(itertools.product(STATES, [None, *STATES])))
def test_effective_control_state_is_the_most_restrictive(
    pool_state: ControlState, runner_state: ControlState | None
) -> None:
    effective = decide_effective_control_state(pool=pool_state, runner=runner_state)
    candidates = [pool_state] if runner_state is None else [pool_state, runner_state]
    assert effective in candidates
    assert all(STATES.index(effective) >= STATES.index(c) for c in candidates)


def test_control_state_order_is_active_draining_disabled_revoked() -> None:
    assert (
        decide_effective_control_state(pool=ControlState.DRAINING, runner=ControlState.ACTIVE) is ControlState.DRAINING
    )
    assert decide_effective_control_state(pool=ControlState.DRAINING, runner=ControlState.DISABLED) is (
        ControlState.DISABLED
    )
    assert decide_effective_control_state(pool=ControlState.ACTIVE, runner=ControlState.REVOKED) is ControlState.REVOKED


# --- The whole table ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "reported", "online_reason", "schedulable_reason"),
    [
        pytest.param(
            {"the_report": report(), "the_lease": lease()}, "Online", "HeartbeatFresh", "Schedulable", id="ok"
        ),
        pytest.param({"the_lease": lease()}, "NeedsAttention", "HeartbeatFresh", "NeverReported", id="no-report"),
        pytest.param({"the_report": report()}, "Offline", "LeaseMissing", "LeaseMissing", id="no-lease"),
        pytest.param(
            {"the_report": report(), "the_lease": lease(age=23)},
            "Offline",
            "HeartbeatStale",
            "HeartbeatStale",
            id="stale",
        ),
        pytest.param(
            {"the_report": report(), "the_lease": lease(age=21.5)},
            "Online",
            "HeartbeatFresh",
            "Schedulable",
            id="late-within-grace",
        ),
        pytest.param(
            {"the_report": report(), "the_lease": lease(holder="pool-a-1")},
            "Offline",
            "HeartbeatStale",
            "HeartbeatStale",
            id="lease-held-by-another",
        ),
        pytest.param(
            {"the_report": report(auth=AuthState.UNAUTHENTICATED), "the_lease": lease()},
            "NeedsAttention",
            "HeartbeatFresh",
            "Unauthenticated",
            id="unauthenticated",
        ),
        pytest.param(
            {"the_report": report(auth=AuthState.FAILING), "the_lease": lease()},
            "NeedsAttention",
            "HeartbeatFresh",
            "AdapterFailing",
            id="failing",
        ),
        pytest.param(
            {"the_report": report(auth=AuthState.UNKNOWN), "the_lease": lease()},
            "NeedsAttention",
            "HeartbeatFresh",
            "AuthenticationUnknown",
            id="auth-unknown",
        ),
        pytest.param(
            {"the_report": report(generation=1), "the_lease": lease(), "pool_generation": 2},
            "Online",
            "HeartbeatFresh",
            "CredentialRotated",
            id="rotated",
        ),
        pytest.param(
            {"the_report": report(), "the_lease": lease(), "credential_available": False},
            "Online",
            "HeartbeatFresh",
            "CredentialMissing",
            id="secret-gone",
        ),
        pytest.param(
            {"the_report": report(), "the_lease": lease(), "runner_state": ControlState.DRAINING},
            "Online",
            "HeartbeatFresh",
            "Draining",
            id="draining",
        ),
        pytest.param(
            {"the_report": report(), "the_lease": lease(), "pool_state": ControlState.DISABLED},
            "Online",
            "HeartbeatFresh",
            "Disabled",
            id="pool-disabled",
        ),
        pytest.param(
            {"the_report": report(auth=AuthState.UNAUTHENTICATED), "runner_state": ControlState.REVOKED},
            "Offline",
            "LeaseMissing",
            "Revoked",
            id="revoked-wins-over-everything",
        ),
    ],
)
def test_state_machine(kwargs: dict[str, Any], reported: str, online_reason: str, schedulable_reason: str) -> None:
    derived = derive(**kwargs)
    assert derived.reported_status.value == reported
    assert derived.online.reason == online_reason
    assert derived.schedulable.reason == schedulable_reason
    assert derived.is_schedulable is (schedulable_reason == "Schedulable")


@pytest.mark.parametrize("control", STATES)
@pytest.mark.parametrize("auth", list(AuthState))
@pytest.mark.parametrize("lease_age", [None, 1.0, 30.0], ids=["no-lease", "fresh", "stale"])
@pytest.mark.parametrize("generation", [1, 2], ids=["current", "old"])
def test_only_active_online_authenticated_current_is_schedulable(
    control: ControlState, auth: AuthState, lease_age: float | None, generation: int
) -> None:
    derived = derive(
        runner_state=control,
        the_report=report(auth=auth, generation=generation),
        the_lease=None if lease_age is None else lease(age=lease_age),
        pool_generation=1,
    )
    expected = (
        control is ControlState.ACTIVE and auth is AuthState.AUTHENTICATED and lease_age == 1.0 and generation == 1
    )
    assert derived.is_schedulable is expected
    # Every other combination names its reason, never a generic one.
    assert derived.schedulable.reason != Reason.NOT_SCHEDULABLE
    if not expected:
        assert derived.schedulable.status is False
        assert derived.schedulable.reason in {r.value for r in Reason}


def test_offline_when_the_lease_expires_and_online_when_renewed() -> None:
    base = lease(age=0)
    assert derive(the_report=report(), the_lease=base).reported_status is ReportedStatus.ONLINE
    # renewTime + 20 s + 2 s grace: still Online at the boundary, Offline just after.
    at_boundary = NOW + dt.timedelta(seconds=22)
    assert derive(the_report=report(), the_lease=base, now=at_boundary).reported_status is ReportedStatus.ONLINE
    after = at_boundary + dt.timedelta(milliseconds=1)
    stale = derive(the_report=report(), the_lease=base, now=after)
    assert stale.reported_status is ReportedStatus.OFFLINE
    assert "expired after 20s plus 2s grace" in stale.online.message
    renewed = LeaseView(holder=NAME, renew_time=after, duration_seconds=20)
    assert derive(the_report=report(), the_lease=renewed, now=after).reported_status is ReportedStatus.ONLINE


# --- What the operator writes -------------------------------------------------------------------


def observed(**status: Any) -> RunnerStatus:
    return RunnerStatus.model_validate(status)


def test_status_holds_the_three_conditions_and_never_the_report() -> None:
    derived = derive(the_report=report(), the_lease=lease())
    update = build_runner_status(observed=observed(report=report().to_wire()), derived=derived, generation=3, now=NOW)
    status = update.status
    assert update.changed
    assert "report" not in status
    assert status["reportedStatus"] == "Online"
    assert status["effectiveControlState"] == "Active"
    assert status["observedGeneration"] == 3
    assert status["lastHeartbeatTime"] == format_time(NOW - dt.timedelta(seconds=1))
    assert status["registeredAt"] == "2026-06-01T11:59:00Z"  # no registeredAt reported: the first report's time
    for ctype, reason in (
        ("Online", "HeartbeatFresh"),
        ("Authenticated", "Authenticated"),
        ("Schedulable", "Schedulable"),
    ):
        cond = find_condition(status["conditions"], ctype)
        assert cond is not None
        assert (cond["status"], cond["reason"], cond["observedGeneration"]) == ("True", reason, 3)


def test_an_unchanged_derivation_is_not_a_change_even_as_the_heartbeat_moves() -> None:
    first = build_runner_status(
        observed=observed(report=report().to_wire()),
        derived=derive(the_report=report(), the_lease=lease(age=1)),
        generation=1,
        now=NOW,
    )
    stored = observed(report=report().to_wire(), **first.status)
    later = NOW + dt.timedelta(seconds=30)
    again = build_runner_status(
        observed=stored,
        derived=derive(the_report=report(), the_lease=lease(age=-29), now=later),
        generation=1,
        now=later,
    )
    assert not again.changed
    assert again.status["lastHeartbeatTime"] != first.status["lastHeartbeatTime"]
    # A change of status moves the transition time of that condition only.
    stale = derive(the_report=report(), the_lease=lease(), now=later)  # renewed 31 s before, for 20 s
    offline = build_runner_status(observed=stored, derived=stale, generation=1, now=later)
    assert offline.changed
    online = find_condition(offline.status["conditions"], "Online")
    auth = find_condition(offline.status["conditions"], "Authenticated")
    assert online is not None and auth is not None
    assert online["lastTransitionTime"] == "2026-06-01T12:00:30Z"
    assert auth["lastTransitionTime"] == "2026-06-01T12:00:00Z"


def test_kstatus_conditions_follow_schedulable_and_are_written_only_when_they_change() -> None:
    def kstatus(update: Any) -> dict[str, tuple[str, str]]:
        return {
            c["type"]: (c["status"], c["reason"])
            for c in update.status["conditions"]
            if c["type"] in ("Reconciling", "Stalled")
        }

    registering = build_runner_status(observed=observed(), derived=derive(the_lease=lease()), generation=1, now=NOW)
    assert kstatus(registering) == {"Reconciling": ("True", "NeverReported")}
    stored = observed(report=report().to_wire(), **registering.status)
    schedulable = build_runner_status(
        observed=stored, derived=derive(the_report=report(), the_lease=lease()), generation=1, now=NOW
    )
    assert schedulable.changed and kstatus(schedulable) == {}, "Reconciling is removed, not set False"
    later = NOW + dt.timedelta(seconds=30)
    stored = observed(report=report().to_wire(), **schedulable.status)
    stale = derive(the_report=report(), the_lease=lease(), now=later)  # renewed 31 s before, for 20 s
    offline = build_runner_status(observed=stored, derived=stale, generation=1, now=later)
    assert kstatus(offline) == {"Stalled": ("True", "HeartbeatStale")}
    stored = observed(report=report().to_wire(), **offline.status)
    still = build_runner_status(
        observed=stored,
        derived=derive(the_report=report(), the_lease=lease(), now=later + dt.timedelta(seconds=5)),
        generation=1,
        now=later,
    )
    assert not still.changed, "the same verdict writes nothing"
    drained = build_runner_status(
        observed=stored,
        derived=derive(the_report=report(), the_lease=lease(), runner_state=ControlState.DRAINING),
        generation=1,
        now=later,
    )
    assert kstatus(drained) == {}, "drained by an administrator: neither condition (kstatus: Current)"


# --- Audited transitions ------------------------------------------------------------------------


def actions(transitions: list[Any]) -> list[AuditAction]:
    return [t.action for t in transitions]


def test_first_report_is_a_registration_and_a_new_registered_at_is_another() -> None:
    first = report(registeredAt="2026-06-01T11:58:00.123456Z")
    derived = derive(the_report=first, the_lease=lease())
    transitions = decide_runner_transitions(name=NAME, observed=observed(report=first.to_wire()), derived=derived)
    assert actions(transitions) == [AuditAction.RUNNER_REGISTERED]
    assert transitions[0].after == "2026-06-01T11:58:00.123456Z"
    stored = build_runner_status(observed=observed(report=first.to_wire()), derived=derived, generation=1, now=NOW)
    # The stored registration round-trips exactly, so a refresh of the same registration is not audited again.
    same = observed(report=first.to_wire(), **stored.status)
    assert decide_runner_transitions(name=NAME, observed=same, derived=derived) == []
    restarted = report(registeredAt="2026-06-01T12:00:00Z")
    again = observed(**{**stored.status, "report": restarted.to_wire()})
    assert actions(decide_runner_transitions(name=NAME, observed=again, derived=derived)) == [
        AuditAction.RUNNER_REGISTERED
    ]


def test_status_and_control_state_changes_are_audited_and_revocation_is_its_own_action() -> None:
    base = observed(reportedStatus="Online", effectiveControlState="Active", registeredAt="2026-06-01T11:59:00Z")
    offline = derive(the_report=None, the_lease=None)
    changed = decide_runner_transitions(name=NAME, observed=base, derived=offline)
    assert actions(changed) == [AuditAction.RUNNER_STATUS_CHANGED]
    assert (changed[0].before, changed[0].after) == ("Online", "Offline")
    assert "LeaseMissing" in changed[0].message
    draining = derive(the_lease=lease(), runner_state=ControlState.DRAINING, the_report=None)
    assert AuditAction.RUNNER_CONTROL_STATE_CHANGED in actions(
        decide_runner_transitions(name=NAME, observed=base, derived=draining)
    )
    revoked = derive(the_lease=lease(), runner_state=ControlState.REVOKED)
    transitions = decide_runner_transitions(name=NAME, observed=base, derived=revoked)
    assert AuditAction.RUNNER_REVOKED in actions(transitions)
    assert AuditAction.RUNNER_CONTROL_STATE_CHANGED not in actions(transitions)
    # The first derivation of an Active runner is not a control-state change.
    fresh = decide_runner_transitions(name=NAME, observed=observed(), derived=derive(the_lease=lease()))
    assert fresh == []


def test_pool_counts() -> None:
    runners = [
        derive(the_report=report(), the_lease=lease()),
        derive(the_report=report(), the_lease=lease(), runner_state=ControlState.DRAINING),
        derive(the_report=report(auth=AuthState.UNAUTHENTICATED), the_lease=lease()),
        derive(the_report=report()),
    ]
    counts = decide_pool_counts(replicas=5, runners=runners)
    assert (counts.desired, counts.ready, counts.schedulable) == (5, 2, 1)
    assert counts.to_wire() == {"desiredReplicas": 5, "readyReplicas": 2, "schedulableRunners": 1}
    assert not counts.differs_from({"desiredReplicas": 5, "readyReplicas": 2, "schedulableRunners": 1, "x": 1})
    assert counts.differs_from({"desiredReplicas": 5, "readyReplicas": 1, "schedulableRunners": 1})


def test_models_summary_puts_the_default_first_and_stays_bounded() -> None:
    from helmhive.api.runner import ModelCatalogue, ModelEntry, RunnerReport
    from helmhive.policy.runners.status import summarise_models

    base = RunnerReport.model_validate(
        {
            "provider": "p",
            "adapter": {"type": "acp", "name": "a", "version": "1"},
            "authentication": {"state": "Authenticated"},
            "environmentFingerprint": "x",
            "podName": "p-0",
            "reportedAt": "2026-01-01T00:00:00Z",
        }
    )
    two = base.model_copy(
        update={"catalogue": ModelCatalogue(default="b", models=[ModelEntry(id="a"), ModelEntry(id="b")])}
    )
    assert summarise_models(two) == "b,a"
    many = base.model_copy(
        update={"catalogue": ModelCatalogue(models=[ModelEntry(id=f"model-{i:03d}") for i in range(64)])}
    )
    text = summarise_models(many)
    assert len(text) <= 256
    assert text.startswith("model-000,") and text.endswith(",+40")
    assert summarise_models(None) == ""

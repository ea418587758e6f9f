"""Derives a Runner's state, and a pool's counts, from observed facts. Pure.

What the operator then writes (the status and the audited transitions) is built from the
derivation by :mod:`helmhive.policy.runners.status`.

Inputs are the Runner's spec (set by an administrator), its report (written by the runner),
the pool's control state and credential facts, the runner's Lease, ``now`` and a grace
period. Nothing here reads the clock, talks to the API server or sees a credential.

The state machine (``docs/runners.md`` has it as a table)::

    effective control state = most restrictive of pool and runner (Active < Draining < Disabled < Revoked)
    reported status         = Offline         if the Lease is missing, held by another, or
                                              renewTime + leaseDuration + grace < now
                                              (unless the heartbeat hold applies: the stored
                                              status is kept, Online=Unknown/HeartbeatHeld)
                              NeedsAttention  else if there is no report, the report is stale (the
                                              Lease's digest disagrees), it is not Authenticated,
                                              or its verifiedAt is older than authMaxAgeSeconds
                              Online          otherwise
    Schedulable             = the first rule that fails names the reason:
                              Revoked, Disabled, Draining           (control state)
                              NeverReported                         (no report yet)
                              LeaseMissing, HeartbeatStale          (Offline)
                              HeartbeatHeld                         (held, see below)
                              ReportStale, AdapterFailing,
                              Unauthenticated, AuthenticationUnknown,
                              AuthStale                             (NeedsAttention)
                              CredentialMissing                     (the pool's Secret is gone)
                              CredentialRotated                     (report.credentialGeneration is not the pool's)
                              otherwise True, reason Schedulable.

**The heartbeat hold.** A stale ``renewTime`` proves a runner dead only if the operator could
have seen a renewal. After the operator lost the API server (or etcd) for a while, or right
after it starts, every runner's Lease looks stale at once; Kubernetes' node lifecycle controller
faces the same and gives nodes a grace period measured from its own observation. So the caller
passes a :class:`HeartbeatHold` (:func:`decide_heartbeat_hold`): while contact is lost, and for
one Lease duration plus the grace after it returned, a runner whose *only* fault is the age of
its Lease (held by itself) is not derived Offline: it keeps its stored reported status, with
``Online=Unknown`` and ``Schedulable=False``, both ``HeartbeatHeld`` (routing waits for it rather
than failing closed, and no job on it is ended ``RunnerLost``). A runner already stored Offline
stays Offline. A runner that renews in the window is simply Online again; one that does not is
Offline at the end of the hold.

Nothing here polls. Each derivation also returns ``review_at``: the earliest instant at which
the same inputs would derive something else (the Lease expires, ``verifiedAt`` passes the
bound, a digest disagreement outlasts the grace). The caller derives a runner again when its
Runner or Lease changes, or at that instant -- one wake per runner, not a timer.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.common import ControlState
from helmhive.api.qualification import QualificationSpec
from helmhive.api.reasons import Reason
from helmhive.api.runner import AuthState, ReportedStatus, RunnerReport, RunnerSpec
from helmhive.policy.runners.freshness import (
    LeaseView,
    decide_auth_stale_at,
    decide_report_stale_at,
    decide_review_at,
    format_time,
)

__all__ = [
    "CONTROL_ORDER",
    "ConditionVerdict",
    "HeartbeatHold",
    "LeaseView",
    "PoolCounts",
    "PoolFacts",
    "RunnerDerived",
    "decide_auth_stale_at",
    "decide_authentication",
    "decide_effective_control_state",
    "decide_heartbeat",
    "decide_heartbeat_hold",
    "decide_pool_counts",
    "decide_report_stale_at",
    "decide_review_at",
    "decide_runner_status",
    "format_time",
]

CONTROL_ORDER: tuple[ControlState, ...] = (
    ControlState.ACTIVE,
    ControlState.DRAINING,
    ControlState.DISABLED,
    ControlState.REVOKED,
)
_CONTROL_REASON = {
    ControlState.DRAINING: Reason.CONTROL_DRAINING,
    ControlState.DISABLED: Reason.CONTROL_DISABLED,
    ControlState.REVOKED: Reason.CONTROL_REVOKED,
}


@dataclass(frozen=True, kw_only=True)
class PoolFacts:
    """What a runner's derivation needs from its pool."""

    control_state: ControlState = ControlState.ACTIVE
    credential_generation: int = 0
    credential_available: bool = True
    auth_max_age: dt.timedelta = dt.timedelta(seconds=3600)
    qualification: QualificationSpec | None = None
    """The pool's qualification probes (:mod:`helmhive.policy.runners.qualification` decides with them)."""


@dataclass(frozen=True, kw_only=True)
class ConditionVerdict:
    """One condition's status, fixed reason name and message."""

    status: bool | None
    reason: str
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class HeartbeatHold:
    """Hold Offline verdicts derived from heartbeat age (see the module docstring)."""

    until: dt.datetime | None
    """When the hold ends; None while the operator has no contact with the API server (no end known yet)."""
    stored: ReportedStatus | None
    """The runner's stored ``reportedStatus``: kept while held (a runner stored Offline is not held)."""

    def applies(self, now: dt.datetime) -> bool:
        return self.stored is not ReportedStatus.OFFLINE and (self.until is None or now < self.until)


def decide_heartbeat_hold(
    *, contact: bool, returned_at: float, now: float, lease_duration_s: float, grace_s: float
) -> float | None:
    """Seconds the heartbeat hold has left, on a monotonic clock; None once it is over.

    ``contact``: the operator can read the API server now; ``returned_at``: when it last
    regained contact (or started). While there is no contact the hold lasts (``inf``); after,
    it lasts one Lease duration plus the grace from ``returned_at``.
    """
    if not contact:
        return float("inf")
    left = returned_at + lease_duration_s + grace_s - now
    return left if left > 0 else None


@dataclass(frozen=True, kw_only=True)
class RunnerDerived:
    """Everything the operator derives about one runner."""

    reported_status: ReportedStatus
    effective_control_state: ControlState
    online: ConditionVerdict
    authenticated: ConditionVerdict
    schedulable: ConditionVerdict
    heartbeat_time: dt.datetime | None
    review_at: dt.datetime | None = None
    """When these inputs next derive something else, if ever (derive again then)."""

    @property
    def is_schedulable(self) -> bool:
        return self.schedulable.status is True


def decide_effective_control_state(*, pool: ControlState, runner: ControlState | None) -> ControlState:
    """The more restrictive of the pool's and the runner's control state."""
    states = [pool] if runner is None else [pool, runner]
    return max(states, key=CONTROL_ORDER.index)


def decide_heartbeat(
    *, runner_name: str, lease: LeaseView | None, now: dt.datetime, grace: dt.timedelta
) -> ConditionVerdict:
    """Online if the runner's own Lease was renewed within its duration plus ``grace``."""
    if lease is None:
        return ConditionVerdict(status=False, reason=Reason.LEASE_MISSING, message=f"no Lease {runner_name} exists")
    if lease.holder != runner_name:
        return ConditionVerdict(
            status=False,
            reason=Reason.HEARTBEAT_STALE,
            message=f"Lease {runner_name} is held by {lease.holder or 'nobody'}, not by the runner",
        )
    expires = lease.expires_at(grace)
    if lease.renew_time is None or expires is None or expires < now:
        renewed = format_time(lease.renew_time) if lease.renew_time else "never"
        return ConditionVerdict(
            status=False,
            reason=Reason.HEARTBEAT_STALE,
            message=f"Lease last renewed {renewed}; it expired after {lease.duration_seconds}s plus "
            f"{grace.total_seconds():g}s grace",
        )
    # No renew time in the message: it would change the condition, and cost a write, on every renewal.
    return ConditionVerdict(
        status=True,
        reason=Reason.HEARTBEAT_FRESH,
        message=f"the Lease is renewed within its {lease.duration_seconds}s duration",
    )


def decide_authentication(
    *,
    report: RunnerReport | None,
    lease: LeaseView | None = None,
    now: dt.datetime | None = None,
    grace: dt.timedelta = dt.timedelta(0),
    max_age: dt.timedelta | None = None,
) -> ConditionVerdict:
    """The Authenticated condition: the runner's report, if the Lease confirms it and it is fresh.

    Without ``now`` only the report's own state counts (for callers that have no Lease).
    """
    if report is None:
        return ConditionVerdict(status=None, reason=Reason.NEVER_REPORTED, message="the runner has not reported yet")
    if now is not None:
        stale_at = decide_report_stale_at(report=report, lease=lease, grace=grace)
        if stale_at is not None and stale_at <= now:
            return ConditionVerdict(
                status=None,
                reason=Reason.REPORT_STALE,
                message="the Lease's report digest disagrees with the report: the runner's latest report "
                "was not written (or its Lease carries no digest)",
            )
    auth = report.authentication
    detail = f"{auth.reason}: {auth.message}".strip(": ") if (auth.reason or auth.message) else ""
    match auth.state:
        case AuthState.AUTHENTICATED:
            if now is not None and max_age is not None:
                auth_stale_at = decide_auth_stale_at(report=report, max_age=max_age)
                if auth_stale_at is None or auth_stale_at <= now:
                    when = format_time(auth.verified_at) if auth.verified_at else "never"
                    return ConditionVerdict(
                        status=None,
                        reason=Reason.AUTH_STALE,
                        message=f"authentication last verified {when}; the pool allows "
                        f"{max_age.total_seconds():g}s (heartbeat.authMaxAgeSeconds)",
                    )
            return ConditionVerdict(status=True, reason=Reason.AUTHENTICATED, message=detail)
        case AuthState.FAILING:
            return ConditionVerdict(
                status=False, reason=Reason.ADAPTER_FAILING, message=detail or "the adapter is failing"
            )
        case AuthState.UNAUTHENTICATED:
            return ConditionVerdict(
                status=False, reason=Reason.UNAUTHENTICATED, message=detail or "the provider login failed"
            )
        case _:
            return ConditionVerdict(status=None, reason=Reason.AUTHENTICATION_UNKNOWN, message=detail)


def _schedulable(
    *,
    control: ControlState,
    report: RunnerReport | None,
    online: ConditionVerdict,
    authenticated: ConditionVerdict,
    pool: PoolFacts,
) -> ConditionVerdict:
    if control is not ControlState.ACTIVE:
        return ConditionVerdict(
            status=False, reason=_CONTROL_REASON[control], message=f"the control state is {control.value}"
        )
    if report is None:
        return ConditionVerdict(status=False, reason=Reason.NEVER_REPORTED, message="the runner has not reported yet")
    if online.status is not True:
        return ConditionVerdict(status=False, reason=online.reason, message=online.message)
    if authenticated.status is not True:
        return ConditionVerdict(status=False, reason=authenticated.reason, message=authenticated.message)
    if not pool.credential_available:
        return ConditionVerdict(
            status=False, reason=Reason.CREDENTIAL_MISSING, message="the pool's credential Secret is missing"
        )
    if report.credential_generation != pool.credential_generation:
        return ConditionVerdict(
            status=False,
            reason=Reason.CREDENTIAL_ROTATED,
            message=f"reported with credential generation {report.credential_generation}; "
            f"the pool's credential is generation {pool.credential_generation}",
        )
    return ConditionVerdict(status=True, reason=Reason.SCHEDULABLE, message="Active, Online and Authenticated")


def decide_runner_status(
    *,
    name: str,
    spec: RunnerSpec,
    report: RunnerReport | None,
    pool: PoolFacts,
    lease: LeaseView | None,
    now: dt.datetime,
    grace: dt.timedelta,
    hold: HeartbeatHold | None = None,
) -> RunnerDerived:
    """Derive the reported status, effective control state and conditions of runner ``name``."""
    control = decide_effective_control_state(pool=pool.control_state, runner=spec.control_state)
    online = decide_heartbeat(runner_name=name, lease=lease, now=now, grace=grace)
    authenticated = decide_authentication(report=report, lease=lease, now=now, grace=grace, max_age=pool.auth_max_age)
    held = (
        hold is not None
        and hold.applies(now)
        and online.reason == Reason.HEARTBEAT_STALE
        and lease is not None
        and lease.holder == name
        and lease.renew_time is not None
    )
    review_at = decide_review_at(report=report, lease=lease, now=now, grace=grace, max_age=pool.auth_max_age)
    if held:
        assert hold is not None and lease is not None and lease.renew_time is not None
        online = ConditionVerdict(
            status=None,
            reason=Reason.HEARTBEAT_HELD,
            message=f"Lease last renewed {format_time(lease.renew_time)}; not Offline yet: the operator lost "
            "contact with the API server, and gives runners one Lease duration plus grace to renew after it returns",
        )
        ends = hold.until + dt.timedelta(microseconds=1) if hold.until is not None else None
        review_at = min(t for t in (review_at, ends) if t is not None) if (review_at or ends) else None
    if held:
        reported = hold.stored if hold is not None and hold.stored is not None else ReportedStatus.NEEDS_ATTENTION
    elif online.status is not True:
        reported = ReportedStatus.OFFLINE
    elif authenticated.status is not True:
        reported = ReportedStatus.NEEDS_ATTENTION
    else:
        reported = ReportedStatus.ONLINE
    return RunnerDerived(
        reported_status=reported,
        effective_control_state=control,
        online=online,
        authenticated=authenticated,
        schedulable=_schedulable(control=control, report=report, online=online, authenticated=authenticated, pool=pool),
        heartbeat_time=lease.renew_time if lease is not None else None,
        review_at=review_at,
    )


@dataclass(frozen=True, kw_only=True)
class PoolCounts:
    """The pool's printer-column counts."""

    desired: int
    ready: int
    schedulable: int

    def to_wire(self) -> dict[str, int]:
        return {"desiredReplicas": self.desired, "readyReplicas": self.ready, "schedulableRunners": self.schedulable}

    def differs_from(self, status: Mapping[str, Any]) -> bool:
        return any(status.get(key) != value for key, value in self.to_wire().items())


def decide_pool_counts(*, replicas: int, runners: Iterable[RunnerDerived]) -> PoolCounts:
    """Desired = spec.replicas; ready = runners Online; schedulable = runners Schedulable."""
    ready = schedulable = 0
    for derived in runners:
        ready += derived.reported_status is ReportedStatus.ONLINE
        schedulable += derived.is_schedulable
    return PoolCounts(desired=replicas, ready=ready, schedulable=schedulable)

"""Runner freshness, pure: the Lease as the derivation sees it, and the instants at which a runner's
derived status changes with no event -- the Lease expires, ``verifiedAt`` passes the pool's
bound, a report-digest disagreement outlasts its grace.

:mod:`helmhive.policy.runners.state` decides with these; the pool loop schedules one review per
runner at :func:`decide_review_at`. No clock, no I/O.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from helmhive.api.runner import AuthState, RunnerReport, build_report_digest

__all__ = [
    "LeaseView",
    "decide_auth_stale_at",
    "decide_report_stale_at",
    "decide_review_at",
    "format_time",
]


def format_time(when: dt.datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, keeping microseconds when there are any (round-trips exactly)."""
    return when.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, kw_only=True)
class LeaseView:
    """The parts of a runner's ``coordination.k8s.io`` Lease that matter."""

    holder: str | None
    renew_time: dt.datetime | None
    duration_seconds: int
    digest: str | None = None
    """The ``helmhive.dev/report-digest`` annotation: what the runner's report says as of this renewal."""
    digest_since: dt.datetime | None = None
    """When the operator first saw this Lease carry ``digest`` (None: use ``renew_time``)."""

    def expires_at(self, grace: dt.timedelta) -> dt.datetime | None:
        if self.renew_time is None:
            return None
        return self.renew_time + dt.timedelta(seconds=self.duration_seconds) + grace


def decide_report_stale_at(*, report: RunnerReport, lease: LeaseView | None, grace: dt.timedelta) -> dt.datetime | None:
    """When a disagreement between the Lease's digest and the report makes the report stale; None if they agree.

    The runner writes its report and then its Lease, and the two reach the operator by separate
    watches, so a disagreement counts ``grace`` after the later of the report's write and the
    moment the Lease's digest was first seen (not its latest renewal, which moves every few seconds).
    """
    if lease is None or lease.digest == build_report_digest(report):
        return None
    since = lease.digest_since or lease.renew_time
    latest = max(report.reported_at, since) if since is not None else report.reported_at
    return latest + grace


def decide_auth_stale_at(*, report: RunnerReport, max_age: dt.timedelta) -> dt.datetime | None:
    """When the report's authentication becomes too old to trust; None if it was never verified."""
    verified = report.authentication.verified_at
    return verified + max_age if verified is not None else None


def decide_review_at(
    *,
    report: RunnerReport | None,
    lease: LeaseView | None,
    now: dt.datetime,
    grace: dt.timedelta,
    max_age: dt.timedelta,
) -> dt.datetime | None:
    """The earliest instant after ``now`` at which the derivation changes without any new event."""
    expires = lease.expires_at(grace) if lease is not None and lease.holder else None
    # Offline strictly after the expiry (see decide_heartbeat), so look just after it.
    instants = [expires + dt.timedelta(microseconds=1) if expires is not None else None]
    if report is not None:
        instants.append(decide_report_stale_at(report=report, lease=lease, grace=grace))
        if report.authentication.state is AuthState.AUTHENTICATED:
            instants.append(decide_auth_stale_at(report=report, max_age=max_age))
    future = [when for when in instants if when is not None and when > now]
    return min(future) if future else None

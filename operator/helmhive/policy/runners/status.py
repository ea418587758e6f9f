"""What the operator writes about a Runner, from what :mod:`helmhive.policy.runners.state` derived. Pure.

:func:`build_runner_status` is the operator's whole share of a Runner's status (every field but
``report``, which is the runner's) and whether it differs from what is stored;
:func:`decide_runner_transitions` names the transitions between the stored status and the new
derivation that the audit trail must record: a registration, a control-state change (or a
revocation), a reported-status change.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from helmhive.api.audit import AuditAction
from helmhive.api.common import ControlState
from helmhive.api.reasons import ConditionType
from helmhive.api.runner import ReportedStatus, RunnerReport, RunnerStatus
from helmhive.policy.conditions import set_condition
from helmhive.policy.kstatus import with_kstatus
from helmhive.policy.runners.capabilities import decide_runner_capabilities_condition
from helmhive.policy.runners.freshness import format_time
from helmhive.policy.runners.qualification import QualificationDecision
from helmhive.policy.runners.state import RunnerDerived

__all__ = [
    "RunnerStatusUpdate",
    "RunnerTransition",
    "build_runner_status",
    "decide_registration",
    "decide_runner_transitions",
    "summarise_models",
]


@dataclass(frozen=True, kw_only=True)
class RunnerStatusUpdate:
    """The operator's whole share of a Runner's status, and whether it differs from what is stored."""

    status: dict[str, Any]
    changed: bool


def decide_registration(observed: RunnerStatus, report: RunnerReport | None) -> dt.datetime | None:
    """The runner's registration: its report's ``registeredAt``, else the one already audited."""
    if report is None:
        return observed.registered_at
    if report.registered_at is not None:
        return report.registered_at
    return observed.registered_at or report.reported_at


def build_runner_status(
    *,
    observed: RunnerStatus,
    derived: RunnerDerived,
    generation: int | None,
    now: dt.datetime,
    qualification: QualificationDecision | None = None,
) -> RunnerStatusUpdate:
    """Return every status field the operator owns (never ``report``); ``changed`` ignores the heartbeat time.

    ``qualification`` (its pool names probes) adds the ``Qualified`` condition and
    ``qualification``; without it both are left out, so the apply removes them.
    """
    conditions: list[dict[str, Any]] = [c.to_wire() for c in observed.conditions]
    changed = False
    verdicts = [
        (ConditionType.ONLINE, derived.online),
        (ConditionType.AUTHENTICATED, derived.authenticated),
        (ConditionType.SCHEDULABLE, derived.schedulable),
        (ConditionType.CAPABILITIES_ADVERTISED, decide_runner_capabilities_condition(observed.report)),
    ]
    if qualification is not None and qualification.condition is not None:
        verdicts.append((ConditionType.QUALIFIED, qualification.condition))
    elif any(c.get("type") == ConditionType.QUALIFIED for c in conditions):
        conditions, changed = [c for c in conditions if c.get("type") != ConditionType.QUALIFIED], True
    for ctype, verdict in verdicts:
        update = set_condition(
            conditions,
            type=ctype,
            status=verdict.status,
            reason=verdict.reason,
            message=verdict.message,
            generation=generation,
            now=now,
        )
        conditions, changed = update.conditions, changed or update.changed
    derived_kstatus = with_kstatus("Runner", {"conditions": conditions}, generation=generation, now=now)
    if derived_kstatus.get("conditions", conditions) != conditions:
        conditions, changed = derived_kstatus["conditions"], True
    registered = decide_registration(observed, observed.report)
    models = summarise_models(observed.report)
    status: dict[str, Any] = {
        "reportedStatus": derived.reported_status.value,
        "effectiveControlState": derived.effective_control_state.value,
        "conditions": conditions,
    }
    if models:
        status["models"] = models
    if generation is not None:
        status["observedGeneration"] = generation
    if derived.heartbeat_time is not None:
        status["lastHeartbeatTime"] = format_time(derived.heartbeat_time)
    if registered is not None:
        status["registeredAt"] = format_time(registered)
    record = qualification.record if qualification is not None else None
    if record is not None:
        status["qualification"] = record.to_wire()
    changed = (
        changed
        or observed.reported_status != derived.reported_status
        or observed.effective_control_state != derived.effective_control_state
        or observed.observed_generation != generation
        or observed.registered_at != registered
        or (observed.models or "") != models
        or observed.qualification != record
    )
    return RunnerStatusUpdate(status=status, changed=changed)


def summarise_models(report: RunnerReport | None, *, limit: int = 256) -> str:
    """The advertised model ids for the printer column, default first, bounded to ``limit``."""
    if report is None:
        return ""
    ids = [m.id for m in report.catalogue.models]
    default = report.catalogue.default
    ordered = ([default] if default else []) + [i for i in ids if i != default]
    text = ",".join(ordered)
    if len(text) <= limit:
        return text
    cut = text[: limit - 8].rsplit(",", 1)[0]
    return f"{cut},+{len(ordered) - len(cut.split(','))}"


@dataclass(frozen=True, kw_only=True)
class RunnerTransition:
    """One audited transition of a runner: the action, the before and after values, and a message."""

    action: AuditAction
    before: str | None
    after: str | None
    message: str


def decide_runner_transitions(*, name: str, observed: RunnerStatus, derived: RunnerDerived) -> list[RunnerTransition]:
    """The transitions between the stored status and ``derived`` that the audit trail must record."""
    out: list[RunnerTransition] = []
    report = observed.report
    registered = decide_registration(observed, report)
    if report is not None and registered is not None and registered != observed.registered_at:
        out.append(
            RunnerTransition(
                action=AuditAction.RUNNER_REGISTERED,
                before=format_time(observed.registered_at) if observed.registered_at else None,
                after=format_time(registered),
                message=f"runner {name} registered (pod {report.pod_name}, provider {report.provider}, "
                f"adapter {report.adapter.name} {report.adapter.version})",
            )
        )
    old_control, new_control = observed.effective_control_state, derived.effective_control_state
    if old_control != new_control and (old_control is not None or new_control is not ControlState.ACTIVE):
        revoked = new_control is ControlState.REVOKED
        out.append(
            RunnerTransition(
                action=AuditAction.RUNNER_REVOKED if revoked else AuditAction.RUNNER_CONTROL_STATE_CHANGED,
                before=old_control.value if old_control else None,
                after=new_control.value,
                message=f"runner {name} control state {old_control.value if old_control else 'unset'} "
                f"-> {new_control.value}",
            )
        )
    old_status = observed.reported_status
    if old_status is not None and old_status != derived.reported_status:
        out.append(
            RunnerTransition(
                action=AuditAction.RUNNER_STATUS_CHANGED,
                before=old_status.value,
                after=derived.reported_status.value,
                message=f"runner {name} is {derived.reported_status.value} (was {old_status.value}): {_why(derived)}",
            )
        )
    return out


def _why(derived: RunnerDerived) -> str:
    if derived.online.status is not True:
        return derived.online.reason
    if derived.authenticated.status is not True or derived.reported_status is ReportedStatus.ONLINE:
        return derived.authenticated.reason
    return derived.schedulable.reason  # NeedsAttention for a failed or stale qualification

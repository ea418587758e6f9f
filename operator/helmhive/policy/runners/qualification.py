"""Runner qualification, decided purely: which probe to start, the round's record, and what it blocks.

A pool that names probes (``spec.qualification``) has each runner qualified by *rounds*: the
probes, one AgentJob at a time and in the pool's order, routed to that runner only. Given the
stored record (``Runner.status.qualification``), the runner's registration and the pool's
credential generation, the runner's probe jobs, and whether a probe may take a slot now,
:func:`decide_qualification` returns the new record, the ``Qualified`` condition, the
``Schedulable`` block if any, the probe job to create, and when to look again. Nothing here reads
the clock or does I/O.

The rules (``docs/runners.md#qualification``):

- **A round starts** on a new registration (``report.registeredAt``) or credential generation
  (then nothing passed counts any more), when the pool's probe list changed, ``everySeconds``
  after the last passed round ended, and after a failed one, when its backoff has passed
  (:func:`decide_round_backoff`: 30 s, doubling, capped at ``everySeconds`` or one hour).
- **A probe starts** only when the runner is otherwise schedulable, no other probe of it is in
  flight, it has a free slot, and no user job waits for a slot on it (``may_start``).
- **It blocks** the runner (``Schedulable=False``): ``QualificationPending`` until a round passed
  for this registration and credential; ``QualificationFailed`` after a failed round;
  ``QualificationStale`` once the last passed round is older than ``staleAfterSeconds``. A qualified
  runner stays schedulable while its next round waits or runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.audit import AuditAction
from helmhive.api.qualification import (
    QUALIFICATION_LABEL,
    QUALIFICATION_PROBE_LABEL,
    QUALIFICATION_ROUND_ANNOTATION,
    ProbeKind,
    ProbeOutcome,
    ProbeRecord,
    QualificationSpec,
    QualificationState,
    RunnerQualification,
)
from helmhive.api.reasons import ConditionType, Reason
from helmhive.api.runner import ReportedStatus
from helmhive.policy.agentjob.failed import decide_pending_requeue
from helmhive.policy.agentjob.state import parse_agent_job
from helmhive.policy.runners.freshness import format_time
from helmhive.policy.runners.state import ConditionVerdict, RunnerDerived
from helmhive.policy.waiting import WAITING_REASONS, parse_timestamp

__all__ = [
    "BLOCKING_REASONS",
    "MAX_FAILURES",
    "ProbeJobView",
    "QualificationDecision",
    "QualificationFacts",
    "apply_qualification",
    "build_probe_job_name",
    "decide_qualification",
    "decide_round_backoff",
    "parse_probe_job",
]

BLOCKING_REASONS = frozenset(
    {Reason.QUALIFICATION_PENDING.value, Reason.QUALIFICATION_FAILED.value, Reason.QUALIFICATION_STALE.value}
)
"""The Schedulable reasons qualification sets; a probe job of the same runner is routed despite them."""

_SHORT = {
    ProbeKind.CONNECTION_TEST: "connection",
    ProbeKind.IMPLEMENTATION_PROBE: "implementation",
    ProbeKind.REVIEW_PROBE: "review",
}
_NAME_LIMIT = 63
_UNFINISHED = (ProbeOutcome.PENDING, ProbeOutcome.RUNNING)
MAX_FAILURES = 1000
"""Failed rounds in a row are counted up to this (the schema's bound; the backoff is capped long before)."""
_FIRST_RETRY = dt.timedelta(seconds=30)
_MAX_RETRY = dt.timedelta(hours=1)


def build_probe_job_name(runner: str, round_: int, kind: ProbeKind) -> str:
    """``<runner>-q<round>-<probe>``; a long runner name is cut and given a digest, so names stay unique."""
    suffix = f"-q{round_}-{_SHORT[kind]}"
    name = runner + suffix
    if len(name) <= _NAME_LIMIT:
        return name
    digest = hashlib.sha256(runner.encode()).hexdigest()[:8]
    keep = _NAME_LIMIT - len(suffix) - len(digest) - 1
    return f"{runner[:keep].rstrip('-')}-{digest}{suffix}"


@dataclass(frozen=True, kw_only=True)
class ProbeJobView:
    """One qualification AgentJob, as read from its labels and conditions."""

    name: str
    kind: ProbeKind
    round: int
    outcome: ProbeOutcome
    reason: str = ""
    finished_at: dt.datetime | None = None


def parse_probe_job(body: Mapping[str, Any]) -> tuple[tuple[str, str], ProbeJobView] | None:
    """((namespace, runner), view) of a qualification job; None for any other job or unreadable labels.

    Finished: its ``Succeeded`` condition, or a final ``Routed=False`` (it failed closed at queue
    time). Otherwise Running once assigned, else Pending with the routing's reason.
    """
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    runner = labels.get(QUALIFICATION_LABEL)
    try:
        kind = ProbeKind(str(labels.get(QUALIFICATION_PROBE_LABEL)))
        round_ = int((meta.get("annotations") or {}).get(QUALIFICATION_ROUND_ANNOTATION) or "")
    except ValueError:
        return None
    if not runner:
        return None
    job = parse_agent_job(body)
    succeeded = job.condition(ConditionType.SUCCEEDED)
    routed = job.condition(ConditionType.ROUTED)
    outcome, reason, finished_at = ProbeOutcome.PENDING, "", None
    if decide_pending_requeue(job):
        # An infrastructure failure the operator re-runs once: not the probe's outcome yet.
        outcome, reason = ProbeOutcome.RUNNING, str((succeeded or {}).get("reason") or "")
    elif succeeded is not None and succeeded.get("status") in ("True", "False"):
        outcome = ProbeOutcome.SUCCEEDED if succeeded["status"] == "True" else ProbeOutcome.FAILED
        reason = str(succeeded.get("reason") or "")
        finished_at = parse_timestamp(succeeded.get("lastTransitionTime"))
    elif routed is not None and routed.get("status") == "False":
        reason = str(routed.get("reason") or "")
        if reason != Reason.WAITING_FOR_CAPACITY.value and reason not in WAITING_REASONS:
            outcome, finished_at = ProbeOutcome.FAILED, parse_timestamp(routed.get("lastTransitionTime"))
    elif job.assigned_runner is not None:
        outcome, reason = ProbeOutcome.RUNNING, Reason.ASSIGNED.value
    view = ProbeJobView(name=job.name, kind=kind, round=round_, outcome=outcome, reason=reason, finished_at=finished_at)
    return (job.namespace, str(runner)), view


@dataclass(frozen=True, kw_only=True)
class QualificationFacts:
    """What one runner's qualification is decided from, besides the pool's spec and ``now``."""

    runner: str
    registered_at: dt.datetime | None
    """The runner's registration (its report's ``registeredAt``); None until it reported."""
    credential_generation: int
    """The pool's credential generation."""
    stored: RunnerQualification | None
    jobs: Mapping[str, ProbeJobView]
    """The runner's probe jobs, by name."""
    may_start: bool
    """Otherwise schedulable, a free slot, and no user job waiting for one on it."""


@dataclass(frozen=True, kw_only=True)
class QualificationDecision:
    """What :func:`decide_qualification` found for one runner."""

    record: RunnerQualification | None
    condition: ConditionVerdict | None
    """The ``Qualified`` condition; None when the pool names no probes (the condition is removed)."""
    block: ConditionVerdict | None
    """Set when qualification makes the runner unschedulable."""
    start: ProbeRecord | None = None
    """The probe job to create now (its ``job`` is the name)."""
    wants_slot: bool = False
    """A probe is due but may not start now: look again when a slot on the runner frees."""
    review_at: dt.datetime | None = None
    """When the same inputs decide something else (a round due, the backoff over, staleness)."""
    ended: AuditAction | None = None
    """The round just ended: ``RunnerQualified`` or ``RunnerQualificationFailed`` (to audit)."""
    message: str = ""


def decide_round_backoff(*, failures: int, spec: QualificationSpec) -> dt.timedelta:
    """The wait after ``failures`` failed rounds in a row: 30 s, doubling, capped."""
    cap = dt.timedelta(seconds=spec.every_seconds) if spec.every_seconds else _MAX_RETRY
    delay: dt.timedelta = _FIRST_RETRY * (2 ** min(max(failures - 1, 0), 16))
    return delay if delay < cap else cap


def _new_round(facts: QualificationFacts, spec: QualificationSpec, now: dt.datetime) -> RunnerQualification:
    stored = facts.stored
    same_target = stored is not None and _target(stored) == (facts.registered_at, facts.credential_generation)
    return RunnerQualification(
        state=QualificationState.QUALIFYING,
        round=(stored.round + 1) if stored is not None else 1,
        registered_at=facts.registered_at,
        credential_generation=facts.credential_generation,
        started_at=now,
        qualified_at=stored.qualified_at if stored is not None and same_target else None,
        failures=stored.failures if stored is not None and same_target else 0,
        last_failure=stored.last_failure if stored is not None and same_target else "",
        probes=[ProbeRecord(kind=kind) for kind in spec.probes],
    )


def _target(record: RunnerQualification) -> tuple[dt.datetime | None, int]:
    return (record.registered_at, record.credential_generation)


def _due(facts: QualificationFacts, spec: QualificationSpec, now: dt.datetime) -> tuple[bool, dt.datetime | None]:
    """Whether a new round starts now; otherwise when one will (None: only on an event)."""
    stored = facts.stored
    if stored is None or _target(stored) != (facts.registered_at, facts.credential_generation):
        return True, None
    if [p.kind for p in stored.probes] != list(spec.probes):
        return True, None
    if stored.state is QualificationState.QUALIFIED and stored.finished_at is not None and spec.every_seconds:
        at = stored.finished_at + dt.timedelta(seconds=spec.every_seconds)
        return now >= at, at
    if stored.state is QualificationState.FAILED and stored.finished_at is not None:
        at = stored.finished_at + decide_round_backoff(failures=stored.failures, spec=spec)
        return now >= at, at
    return False, None


def _advance(
    record: RunnerQualification, facts: QualificationFacts, now: dt.datetime
) -> tuple[RunnerQualification, ProbeRecord | None, bool]:
    """Walk the round's probes over their jobs: (record, probe to start, waits for a slot)."""
    probes: list[ProbeRecord] = []
    start: ProbeRecord | None = None
    wants_slot = False
    state, finished = record.state, record.finished_at
    blocked = False  # an earlier probe has not succeeded: later ones stay Pending
    # An unfinished probe of an earlier round (deleted by the operator once a new round starts)
    # still holds the runner: at most one probe is in flight.
    elsewhere = any(j.round != record.round and j.outcome in _UNFINISHED for j in facts.jobs.values())
    for probe in record.probes:
        if blocked:
            probes.append(ProbeRecord(kind=probe.kind))
            continue
        name = build_probe_job_name(facts.runner, record.round, probe.kind)
        job = facts.jobs.get(name)
        if job is None:
            blocked = True
            if elsewhere:
                probes.append(ProbeRecord(kind=probe.kind))  # its end or deletion wakes the loop
            elif facts.may_start:
                start = ProbeRecord(kind=probe.kind, job=name, outcome=ProbeOutcome.PENDING)
                probes.append(start)
            else:
                wants_slot = True
                probes.append(ProbeRecord(kind=probe.kind))
            continue
        probes.append(
            ProbeRecord(
                kind=probe.kind, job=name, outcome=job.outcome, reason=job.reason[:256], finished_at=job.finished_at
            )
        )
        if job.outcome is ProbeOutcome.FAILED:
            blocked = True
            state, finished = QualificationState.FAILED, job.finished_at or now
        elif job.outcome is not ProbeOutcome.SUCCEEDED:
            blocked = True
    updated = record.model_copy(update={"probes": probes, "state": state, "finished_at": finished})
    if state is QualificationState.QUALIFYING and not blocked:
        ends = [p.finished_at for p in probes if p.finished_at is not None]
        done = max(ends) if ends else now
        passed = {"state": QualificationState.QUALIFIED, "finished_at": done, "qualified_at": done}
        updated = updated.model_copy(update={**passed, "failures": 0, "last_failure": ""})
    elif state is QualificationState.FAILED and record.state is not QualificationState.FAILED:
        failed = _failed_probe(updated)
        why = f"{failed.kind.value} probe {failed.job} failed: {failed.reason or 'no reason'}" if failed else "failed"
        failures = min(record.failures + 1, MAX_FAILURES)
        update = {"failures": failures, "last_failure": f"round {record.round}: {why}"[:512]}
        updated = updated.model_copy(update=update)
    return updated, start, wants_slot


def _failed_probe(record: RunnerQualification) -> ProbeRecord | None:
    return next((p for p in record.probes if p.outcome is ProbeOutcome.FAILED), None)


def _verdicts(
    record: RunnerQualification, spec: QualificationSpec, now: dt.datetime
) -> tuple[ConditionVerdict, ConditionVerdict | None, dt.datetime | None]:
    """The Qualified condition, the Schedulable block, and when staleness begins."""
    stale_after = spec.stale_after()
    stale_at = record.qualified_at + stale_after if record.qualified_at and stale_after else None
    if record.state is QualificationState.FAILED or record.failures:
        # A retry round of a failed runner still shows the failure until a round passes.
        retrying = f"; round {record.round} retries" if record.state is QualificationState.QUALIFYING else ""
        message = f"qualification {record.last_failure or 'failed'}{retrying}"
        block = ConditionVerdict(status=False, reason=Reason.QUALIFICATION_FAILED, message=message)
        return block, block, None
    if record.qualified_at is None:
        current = next((p for p in record.probes if p.outcome is not ProbeOutcome.SUCCEEDED), None)
        doing = ""
        if current is not None:
            doing = f": {current.kind.value} probe " + (
                f"{current.job} {current.outcome.value}" + (f" ({current.reason})" if current.reason else "")
                if current.job
                else "waits to start"
            )
        block = ConditionVerdict(
            status=None,
            reason=Reason.QUALIFICATION_PENDING,
            message=f"not qualified yet for this registration and credential; round {record.round}{doing}",
        )
        return block, ConditionVerdict(status=False, reason=block.reason, message=block.message), None
    if stale_at is not None and now >= stale_at:
        block = ConditionVerdict(
            status=False,
            reason=Reason.QUALIFICATION_STALE,
            message=f"last qualified {format_time(record.qualified_at)}, more than "
            f"{stale_after.total_seconds():g}s ago (qualification.staleAfterSeconds)"
            if stale_after
            else "",
        )
        return block, block, None
    kinds = ", ".join(p.kind.value for p in record.probes)
    qualified = ConditionVerdict(
        status=True,
        reason=Reason.QUALIFIED,
        message=f"passed {kinds} at {format_time(record.qualified_at)}",
    )
    return qualified, None, stale_at


def decide_qualification(
    *, spec: QualificationSpec | None, facts: QualificationFacts, now: dt.datetime
) -> QualificationDecision:
    """Decide one runner's qualification (see the module docstring)."""
    if spec is None:
        return QualificationDecision(record=None, condition=None, block=None)
    if facts.registered_at is None:
        pending = ConditionVerdict(
            status=None, reason=Reason.QUALIFICATION_PENDING, message="the runner has not registered yet"
        )
        return QualificationDecision(record=facts.stored, condition=pending, block=None)
    due, due_at = _due(facts, spec, now)
    record = _new_round(facts, spec, now) if due or facts.stored is None else facts.stored
    before = facts.stored.state if facts.stored is not None and not due else None
    start: ProbeRecord | None = None
    wants_slot = False
    if record.state is QualificationState.QUALIFYING:
        record, start, wants_slot = _advance(record, facts, now)
        due_at = None
    condition, block, stale_at = _verdicts(record, spec, now)
    ended = None
    if record.state is not QualificationState.QUALIFYING and before is QualificationState.QUALIFYING:
        ended = (
            AuditAction.RUNNER_QUALIFIED
            if record.state is QualificationState.QUALIFIED
            else AuditAction.RUNNER_QUALIFICATION_FAILED
        )
    if record.state is QualificationState.QUALIFIED and spec.every_seconds and record.finished_at is not None:
        due_at = record.finished_at + dt.timedelta(seconds=spec.every_seconds)
    elif record.state is QualificationState.FAILED and record.finished_at is not None:
        due_at = record.finished_at + decide_round_backoff(failures=record.failures, spec=spec)
    candidates = [t for t in (due_at, stale_at) if t is not None and t > now]
    return QualificationDecision(
        record=record,
        condition=condition,
        block=block,
        start=start,
        wants_slot=wants_slot,
        review_at=min(candidates) if candidates else None,
        ended=ended,
        message=condition.message,
    )


_ATTENTION = frozenset({Reason.QUALIFICATION_FAILED.value, Reason.QUALIFICATION_STALE.value})


def apply_qualification(derived: RunnerDerived, decision: QualificationDecision) -> RunnerDerived:
    """``derived`` with qualification's block: Schedulable False, and NeedsAttention when failed or stale.

    Only a runner otherwise schedulable is blocked (an earlier rule's reason says more). The
    decision's ``review_at`` joins the derivation's.
    """
    times = [t for t in (derived.review_at, decision.review_at) if t is not None]
    review_at = min(times) if times else None
    if decision.block is None or not derived.is_schedulable:
        return dataclasses.replace(derived, review_at=review_at)
    reported = derived.reported_status
    if decision.block.reason in _ATTENTION and reported is ReportedStatus.ONLINE:
        reported = ReportedStatus.NEEDS_ATTENTION
    return dataclasses.replace(derived, schedulable=decision.block, reported_status=reported, review_at=review_at)

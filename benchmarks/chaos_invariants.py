"""The chaos run's invariants, as pure checks over what was recorded: no I/O here.

The harness (:mod:`chaos_rig`) records every change of every AgentJob and Runner from a watch
(:class:`JobEvent`, :class:`RunnerEvent`, in the API server's order) and lists the objects,
AuditRecords and logs at the end; these functions say what is wrong with that record:

* :func:`check_job_history`: no double assignment (a job's runner changes only through the
  documented re-queue: ``status.attempts`` grows by one, ``Routed=Unknown`` with a retryable
  reason such as ``RunnerLost``, at most ``MAX_AUTOMATIC_RETRIES`` times), no finished job
  unfinished again, and no over-commit (no runner holds more unfinished jobs than its
  concurrency after any event);
* :func:`check_over_commit`: the same over-commit rule on one sampled list of jobs;
* :func:`check_settled`: every job ended routed and finished, or failed closed with a reason;
* :func:`check_job_audit` and :func:`check_runner_audit`: every assignment (job, attempt,
  runner) is named by a ``JobRouted`` decision of that job (in a batch), every ``reportedStatus`` transition
  and every registration of a runner has its record;
* :func:`sweep_canary`: the planted credential appears in no text swept.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.policy.agentjob.retry import MAX_AUTOMATIC_RETRIES, RETRYABLE_REASONS
from helmhive.policy.audit.routing import iter_routing_decisions

__all__ = [
    "JobEvent",
    "RunnerEvent",
    "Violation",
    "check_job_audit",
    "check_job_history",
    "check_over_commit",
    "check_runner_audit",
    "check_settled",
    "job_event",
    "runner_event",
    "sweep_canary",
]

RETRYABLE = frozenset(r.value for r in RETRYABLE_REASONS)
NOT_TERMINAL_ROUTED = frozenset({"WaitingForCapacity", "Pending", ""})


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One broken invariant: its name (``double-assignment``, ``over-commit``, ...) and what was seen."""

    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


@dataclass(frozen=True, kw_only=True)
class JobEvent:
    """One stored version of an AgentJob, as the watch delivered it (or a re-list after a gap)."""

    name: str
    uid: str
    resource_version: str
    runner: str | None
    attempts: int
    finished: bool
    succeeded_reason: str
    routed_status: str
    routed_reason: str
    deleted: bool = False
    relisted: bool = False
    at: float = 0.0
    """When the watch delivered it (seconds since the run started), for reading a history afterwards."""


@dataclass(frozen=True, kw_only=True)
class RunnerEvent:
    """One stored version of a Runner: its derived status and its registration time."""

    name: str
    reported_status: str | None
    registered_at: str | None
    relisted: bool = False
    at: float = 0.0


def _condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return {}


def job_event(obj: Mapping[str, Any], *, deleted: bool = False, relisted: bool = False, at: float = 0.0) -> JobEvent:
    """The recorded facts of one AgentJob object."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    succeeded, routed = _condition(obj, "Succeeded"), _condition(obj, "Routed")
    return JobEvent(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        runner=(status.get("assignment") or {}).get("runner") or None,
        attempts=int(status.get("attempts") or 0),
        finished=succeeded.get("status") in ("True", "False"),
        succeeded_reason=str(succeeded.get("reason") or ""),
        routed_status=str(routed.get("status") or ""),
        routed_reason=str(routed.get("reason") or ""),
        deleted=deleted,
        relisted=relisted,
        at=at,
    )


def runner_event(obj: Mapping[str, Any], *, relisted: bool = False, at: float = 0.0) -> RunnerEvent:
    status = obj.get("status") or {}
    return RunnerEvent(
        name=str((obj.get("metadata") or {}).get("name", "")),
        reported_status=status.get("reportedStatus") or None,
        registered_at=status.get("registeredAt") or None,
        relisted=relisted,
        at=at,
    )


def _held(state: Mapping[str, JobEvent]) -> Counter[str]:
    return Counter(e.runner for e in state.values() if e.runner and not e.finished and not e.deleted)


class _Load:
    """Which unfinished jobs each runner holds, kept up to date event by event."""

    def __init__(self) -> None:
        self.by_runner: dict[str, set[str]] = {}
        self.where: dict[str, str] = {}

    def update(self, event: JobEvent) -> int:
        """Apply ``event``; return the load of the runner it now holds (0 if none)."""
        old = self.where.pop(event.uid, None)
        if old is not None:
            self.by_runner[old].discard(event.uid)
        if event.runner and not event.finished and not event.deleted:
            self.where[event.uid] = event.runner
            self.by_runner.setdefault(event.runner, set()).add(event.uid)
            return len(self.by_runner[event.runner])
        return 0


def check_job_history(events: Iterable[JobEvent], *, concurrency: int) -> tuple[list[Violation], int, int]:
    """Replay the recorded history in order; return the violations, the re-queues seen and the peak load.

    A runner change (or a dropped assignment) is allowed only where ``attempts`` grows: the
    re-queue. The event that shows the larger count must carry ``Routed`` with a retryable
    reason unless the job was already assigned again in it or it comes from a re-list (a watch
    gap can hide the step).
    """
    violations: list[Violation] = []
    state: dict[str, JobEvent] = {}
    load = _Load()
    requeues = peak = 0
    relist: list[JobEvent] = []  # a re-list is one snapshot: judged once all of it is applied

    def judge(event: JobEvent, held: int, *, after_relist: bool = False) -> None:
        nonlocal peak
        peak = max(peak, held)
        if held > concurrency:
            at = "after a re-list, " if after_relist else ""
            violations.append(
                Violation(
                    invariant="over-commit",
                    detail=f"{at}job {event.name} rv {event.resource_version} makes {held} on {event.runner} "
                    f"> {concurrency}",
                )
            )

    def end_relist() -> None:
        last: dict[str, JobEvent] = {e.runner: e for e in relist if e.runner}
        for runner, event in last.items():
            judge(event, len(load.by_runner.get(runner, ())), after_relist=True)
        relist.clear()

    for event in events:
        before = state.get(event.uid)
        if before is not None and not event.deleted:
            violations += _step(before, event)
            requeues += max(0, event.attempts - before.attempts)
        state[event.uid] = event
        held = load.update(event)
        if event.relisted:
            # Items of a re-list come one by one: before the last one is applied, jobs finished during
            # the watch gap still count as held. Judging mid-list reports loads that never existed.
            relist.append(event)
            continue
        end_relist()
        judge(event, held)
    end_relist()
    return violations, requeues, peak


def _step(before: JobEvent, event: JobEvent) -> list[Violation]:
    """What is wrong with one job going from ``before`` to ``event``."""
    where = f"job {event.name} rv {before.resource_version} -> {event.resource_version}"
    if event.attempts < before.attempts:
        return [Violation(invariant="attempts-decreased", detail=f"{where}: {before.attempts} -> {event.attempts}")]
    out = []
    if event.attempts > before.attempts:
        if event.attempts > MAX_AUTOMATIC_RETRIES:
            out.append(
                Violation(
                    invariant="re-run-too-often", detail=f"{where}: attempts {event.attempts} > {MAX_AUTOMATIC_RETRIES}"
                )
            )
        shows_step = event.runner is None and not event.finished and not event.relisted
        if shows_step and event.routed_reason not in RETRYABLE:
            out.append(
                Violation(
                    invariant="requeue-without-reason",
                    detail=f"{where}: Routed {event.routed_status}/{event.routed_reason!r}",
                )
            )
        return out
    if before.runner and event.runner != before.runner:
        out.append(
            Violation(
                invariant="double-assignment",
                detail=f"{where}: runner {before.runner} -> {event.runner} at attempt {event.attempts}",
            )
        )
    if before.finished and not event.finished:
        out.append(
            Violation(
                invariant="unfinished-again",
                detail=f"{where}: was {before.succeeded_reason}, unfinished at attempt {event.attempts}",
            )
        )
    return out


def check_over_commit(jobs: Iterable[Mapping[str, Any]], *, concurrency: int, when: str) -> list[Violation]:
    """Over-commit on one listed sample of jobs."""
    held = _held({str(j["metadata"]["uid"]): job_event(j) for j in jobs})
    return [
        Violation(invariant="over-commit", detail=f"{when}: runner {r} holds {n} > {concurrency}")
        for r, n in held.items()
        if n > concurrency
    ]


def is_settled(job: Mapping[str, Any]) -> bool:
    """Ended with a named outcome: finished (``Succeeded`` True or False with a reason) or failed closed."""
    succeeded, routed = _condition(job, "Succeeded"), _condition(job, "Routed")
    if succeeded.get("status") in ("True", "False"):
        return bool(succeeded.get("reason"))
    return routed.get("status") == "False" and str(routed.get("reason") or "") not in NOT_TERMINAL_ROUTED


def outcome(job: Mapping[str, Any]) -> str:
    succeeded, routed = _condition(job, "Succeeded"), _condition(job, "Routed")
    if succeeded.get("status") in ("True", "False"):
        return f"Succeeded={succeeded['status']}/{succeeded.get('reason')}"
    return f"Routed={routed.get('status')}/{routed.get('reason')}"


def check_settled(jobs: Iterable[Mapping[str, Any]], *, bound: float) -> list[Violation]:
    out = []
    for job in jobs:
        if not is_settled(job):
            status = job.get("status") or {}
            out.append(
                Violation(
                    invariant="lost-job",
                    detail=f"job {job['metadata']['name']} not ended "
                    f"{bound:g} s after the faults stopped: {outcome(job)}, runner "
                    f"{(status.get('assignment') or {}).get('runner')}, attempts {status.get('attempts', 0)}",
                )
            )
    return out


def check_job_audit(events: Iterable[JobEvent], audits: Iterable[Mapping[str, Any]]) -> list[Violation]:
    """Every (job, attempt, runner) assignment seen has a ``JobRouted`` decision of that job naming the runner.

    Decisions are read from the ``RoutingDecisions`` batches (and from per-decision records of
    older versions, passed through as they are).
    """
    named: dict[str, set[str]] = {}
    for record in iter_routing_decisions(audits):
        spec = record.get("spec") or {}
        if spec.get("action") == "JobRouted":
            uid = str((spec.get("object") or {}).get("uid") or "")
            named.setdefault(uid, set()).add(str((spec.get("details") or {}).get("runner") or ""))
    seen: dict[tuple[str, int, str], str] = {}
    for event in events:
        if event.runner:
            seen.setdefault((event.uid, event.attempts, event.runner), event.name)
    out = []
    for (uid, attempt, runner), name in sorted(seen.items(), key=lambda kv: kv[1]):
        if runner not in named.get(uid, set()):
            has = sorted(named.get(uid, set()))
            out.append(
                Violation(
                    invariant="audit-job-routed",
                    detail=f"job {name} assigned to {runner} at attempt "
                    f"{attempt} has no JobRouted record naming it (records name {has or 'nothing'})",
                )
            )
    return out


def _instant(text: str | None) -> dt.datetime | str | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text


def check_runner_audit(events: Iterable[RunnerEvent], audits: Iterable[Mapping[str, Any]]) -> list[Violation]:
    """Every ``reportedStatus`` change seen has a ``RunnerStatusChanged`` record with the same before and
    after (as many records as changes, at least), and every registration a ``RunnerRegistered`` record."""
    changes: Counter[tuple[str, str, str]] = Counter()
    registrations: set[tuple[str, object]] = set()
    last: dict[str, RunnerEvent] = {}
    for event in events:
        before = last.get(event.name)
        if before is not None and not event.relisted:
            old, new = before.reported_status, event.reported_status
            if old and new and old != new:
                changes[(event.name, old, new)] += 1
        if event.registered_at and (before is None or before.registered_at != event.registered_at):
            registrations.add((event.name, _instant(event.registered_at)))
        last[event.name] = event
    recorded: Counter[tuple[str, str, str]] = Counter()
    registered: set[tuple[str, object]] = set()
    for record in audits:
        spec = record.get("spec") or {}
        name = str((spec.get("object") or {}).get("name") or "")
        before = str((spec.get("before") or {}).get("value") or "")
        after = str((spec.get("after") or {}).get("value") or "")
        if spec.get("action") == "RunnerStatusChanged":
            recorded[(name, before, after)] += 1
        elif spec.get("action") == "RunnerRegistered":
            registered.add((name, _instant(after)))
    out = [
        Violation(
            invariant="audit-runner-status",
            detail=f"runner {name} went {old} -> {new} {n} time(s), "
            f"{recorded[(name, old, new)]} RunnerStatusChanged record(s)",
        )
        for (name, old, new), n in sorted(changes.items())
        if recorded[(name, old, new)] < n
    ]
    out += [
        Violation(invariant="audit-runner-registered", detail=f"runner {name} registered at {when}: no record")
        for name, when in sorted(registrations - registered, key=str)
    ]
    return out


def sweep_canary(canary: str, texts: Mapping[str, str]) -> list[Violation]:
    """The planted credential in any swept text (an object, an Event, a log) is a leak."""
    return [
        Violation(invariant="secret-leaked", detail=f"the canary credential appears in {where}")
        for where, text in sorted(texts.items())
        if canary in text
    ]

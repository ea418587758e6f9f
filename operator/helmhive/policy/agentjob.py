"""An AgentJob's life: its state, read once from the object, and one status patch per step. Pure.

The operator, the runner and the CLI fetch a job, call this module and write what it returns;
none of them decides on its own whether a job is bound, assigned, running or finished, or
builds a status field by hand. :func:`parse_agent_job` reads the object once into an
:class:`AgentJob`: the handful of fields every decision needs (metadata, the condition each
type has, the assignment's runner) are read eagerly and cheaply, because the operator asks on
every watch event; the typed models (:class:`~helmhive.api.job.AgentJobSpec`,
:class:`~helmhive.api.job.AgentJobStatus`) are validated on first use, once per object.

A job's life, and the step that writes each move (each returns a :class:`StatusPatch`):

- **bind** (queue step): the profile revision and snapshot, chosen at queue time; a job waiting
  for a reference sheds its waiting ``Routed``/``Ready``. The router writes it together with
  **route**, in one conditional write.
- **wait** (queue step): a reference does not exist yet: ``Routed=False``/``Ready=False`` with
  ``WaitingForWorkspace`` or ``WaitingForProfile``, until a deadline.
- **fail** (queue step): failed closed at queue time (deadline passed, invalid profile…).
- **route** (router): assigned, waiting for capacity, or failed closed
  (:func:`helmhive.policy.routing.build_status_patch`).
- **start** (runner): ``Running=True``, ``result.startedAt``, the session and memory report.
- **finish** (runner): ``Running=False``, ``Succeeded`` and ``Ready`` with the ending's reason,
  ``result``.
- **lost** (operator, for a runner that cannot): the runner went Offline or was deleted while
  it held the job: ended ``RunnerLost``.
- **requeue** (operator): a job lost, or ended by its runner with an infrastructure reason, that
  :func:`helmhive.policy.retry.decide_job_retry` lets run again: only the binding is kept,
  ``attempts`` grows by one, ``Routed=Unknown`` with the failure's reason
  (:mod:`helmhive.policy.failed_jobs` decides it for a job the runner ended).
- **close** (operator): a job its runner ended with an infrastructure reason that is not run
  again: the verdict (``not re-run: <why>``) is added to its ``Succeeded`` and ``Ready`` messages.

Every write is a JSON merge patch of only the fields its step owns (``None`` deletes a field),
made conditional by the caller with :meth:`StatusPatch.conditional` (the resourceVersion the
decision was made from; a 409 means re-read and decide again).

Status fields and their writers (one writer per step; a field with two writers has them in
turn: the operator until the runner starts the job, the runner until it ends it, the operator
again only when the runner is lost or the job is re-queued or closed). ``observedGeneration`` is
written by no step; re-queue keeps it. :data:`STATUS_WRITERS` is this table as data (a unit test keeps them equal)::

    field                  writer    steps
    profile                operator  bind, route
    routing                operator  route, requeue
    assignment             operator  route, requeue
    attempts               operator  requeue
    session                runner    start
    session                operator  requeue
    result                 runner    start, finish
    result                 operator  lost, requeue
    conditions[Routed]     operator  bind, wait, fail, route, requeue
    conditions[Ready]      operator  bind, wait, fail, route, lost, requeue, close
    conditions[Ready]      runner    start, finish
    conditions[Running]    runner    start, finish
    conditions[Running]    operator  lost, requeue
    conditions[Succeeded]  runner    finish
    conditions[Succeeded]  operator  lost, requeue, close

(``requeue`` writes a field by deleting it: the job starts over as a bound job.)
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from helmhive.api.job import AgentJobSpec, AgentJobStatus, ProfileBinding
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.conditions import set_condition
from helmhive.policy.retry import RetryDecision, decide_job_retry
from helmhive.policy.routing import RouteOutcome, RoutingDecision, build_status_patch
from helmhive.policy.waiting import WAITING_REASONS, build_bound_conditions, build_unbound_conditions

__all__ = [
    "NOT_RERUN",
    "STATUS_WRITERS",
    "STEP_WRITERS",
    "AgentJob",
    "LostOutcome",
    "StatusPatch",
    "Step",
    "Writer",
    "apply_merge_patch",
    "bind",
    "close",
    "decide_finished",
    "decide_held_runner",
    "decide_lost",
    "decide_needs_binding",
    "decide_needs_routing",
    "fail",
    "finish",
    "lost",
    "parse_agent_job",
    "requeue",
    "route",
    "start",
    "wait",
    "written_fields",
]

RunnerKey = tuple[str, str]
"""(namespace, name) of a Runner."""


class Writer(enum.StrEnum):
    """Who writes a status field: the operator or the job's runner."""

    OPERATOR = "operator"
    RUNNER = "runner"


class Step(enum.StrEnum):
    """A step of a job's life; each writes one :class:`StatusPatch`."""

    BIND = "bind"
    WAIT = "wait"
    FAIL = "fail"
    ROUTE = "route"
    START = "start"
    FINISH = "finish"
    LOST = "lost"
    REQUEUE = "requeue"
    CLOSE = "close"


STEP_WRITERS: Mapping[Step, Writer] = {
    Step.BIND: Writer.OPERATOR,
    Step.WAIT: Writer.OPERATOR,
    Step.FAIL: Writer.OPERATOR,
    Step.ROUTE: Writer.OPERATOR,
    Step.START: Writer.RUNNER,
    Step.FINISH: Writer.RUNNER,
    Step.LOST: Writer.OPERATOR,
    Step.REQUEUE: Writer.OPERATOR,
    Step.CLOSE: Writer.OPERATOR,
}

_O, _R = Writer.OPERATOR, Writer.RUNNER
STATUS_WRITERS: Mapping[str, Mapping[Writer, frozenset[Step]]] = {
    "profile": {_O: frozenset({Step.BIND, Step.ROUTE})},
    "routing": {_O: frozenset({Step.ROUTE, Step.REQUEUE})},
    "assignment": {_O: frozenset({Step.ROUTE, Step.REQUEUE})},
    "attempts": {_O: frozenset({Step.REQUEUE})},
    "session": {_R: frozenset({Step.START}), _O: frozenset({Step.REQUEUE})},
    "result": {_R: frozenset({Step.START, Step.FINISH}), _O: frozenset({Step.LOST, Step.REQUEUE})},
    "conditions[Routed]": {_O: frozenset({Step.BIND, Step.WAIT, Step.FAIL, Step.ROUTE, Step.REQUEUE})},
    "conditions[Ready]": {
        _O: frozenset({Step.BIND, Step.WAIT, Step.FAIL, Step.ROUTE, Step.LOST, Step.REQUEUE, Step.CLOSE}),
        _R: frozenset({Step.START, Step.FINISH}),
    },
    "conditions[Running]": {_R: frozenset({Step.START, Step.FINISH}), _O: frozenset({Step.LOST, Step.REQUEUE})},
    "conditions[Succeeded]": {_R: frozenset({Step.FINISH}), _O: frozenset({Step.LOST, Step.REQUEUE, Step.CLOSE})},
}
"""Every status field a step writes, by writer, with the steps that write it (the docstring's table)."""

_FINAL = ("True", "False")


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The job, read once -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AgentJob:
    """One AgentJob as read from the API server: what every decision needs, and its typed models on demand."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    generation: int | None
    deleting: bool
    cancel: bool
    raw_spec: Mapping[str, Any]
    raw_status: Mapping[str, Any]
    conditions: tuple[dict[str, Any], ...]
    """``status.conditions`` as read (wire form; the steps build on them)."""
    condition_status: Mapping[str, tuple[str, str]]
    """Each condition type's (status, reason)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    # Typed models, validated once on first use (None when the object does not validate).

    @functools.cached_property
    def spec(self) -> AgentJobSpec | None:
        try:
            return AgentJobSpec.model_validate(self.raw_spec)
        except ValidationError:
            return None

    @functools.cached_property
    def status(self) -> AgentJobStatus | None:
        try:
            return AgentJobStatus.model_validate(self.raw_status)
        except ValidationError:
            return None

    @functools.cached_property
    def binding(self) -> ProfileBinding | None:
        """``status.profile`` as the typed binding; None when absent or unusable."""
        raw = self.raw_status.get("profile")
        if not raw:
            return None
        try:
            return ProfileBinding.model_validate(raw)
        except ValidationError:
            return None

    # State.

    def _condition(self, ctype: str) -> tuple[str, str] | None:
        return self.condition_status.get(ctype)

    @property
    def bound(self) -> bool:
        """``status.profile`` is written (its revision was chosen at queue time)."""
        return bool(self.raw_status.get("profile"))

    @property
    def profile_name(self) -> str | None:
        profile = self.raw_status.get("profile")
        name = profile.get("name") if isinstance(profile, Mapping) else None
        return str(name) if name else None

    @property
    def waiting_for_reference(self) -> bool:
        """Not bound, ``Routed=False`` with ``WaitingForWorkspace`` or ``WaitingForProfile``."""
        routed = self._condition(ConditionType.ROUTED)
        return not self.bound and routed is not None and routed[0] == "False" and routed[1] in WAITING_REASONS

    @property
    def waiting_for_capacity(self) -> bool:
        """Bound, not assigned, ``Routed=False/WaitingForCapacity``."""
        routed = self._condition(ConditionType.ROUTED)
        return (
            not self.assigned
            and routed is not None
            and routed[0] == "False"
            and routed[1] == Reason.WAITING_FOR_CAPACITY.value
        )

    @property
    def failed_closed(self) -> bool:
        """Never assigned and refused for good: ``Routed=False`` with a reason that is not a wait."""
        routed = self._condition(ConditionType.ROUTED)
        if self.assigned or routed is None or routed[0] != "False":
            return False
        return routed[1] not in WAITING_REASONS and routed[1] != Reason.WAITING_FOR_CAPACITY.value

    @property
    def assigned(self) -> bool:
        """``status.assignment`` names a runner."""
        assignment = self.raw_status.get("assignment")
        return isinstance(assignment, Mapping) and bool(assignment.get("runner"))

    @property
    def assigned_runner(self) -> RunnerKey | None:
        """The runner of ``status.assignment`` (its namespace: ``runnerNamespace``, else the job's), if any."""
        assignment = self.raw_status.get("assignment")
        if not isinstance(assignment, Mapping) or not assignment.get("runner"):
            return None
        return (str(assignment.get("runnerNamespace") or self.namespace), str(assignment["runner"]))

    @property
    def running(self) -> bool:
        """The runner marked it ``Running=True``."""
        running = self._condition(ConditionType.RUNNING)
        return running is not None and running[0] == "True"

    @property
    def started(self) -> bool:
        """The runner started it at some point (``result.startedAt``): it may have acted."""
        result = self.raw_status.get("result")
        return isinstance(result, Mapping) and bool(result.get("startedAt"))

    @property
    def finished(self) -> bool:
        """``Succeeded`` is True or False (ended by its runner, or by the operator when the runner was lost)."""
        succeeded = self._condition(ConditionType.SUCCEEDED)
        return succeeded is not None and succeeded[0] in _FINAL

    @property
    def failed(self) -> bool:
        succeeded = self._condition(ConditionType.SUCCEEDED)
        return succeeded is not None and succeeded[0] == "False"

    @property
    def cancelled(self) -> bool:
        """Finished with reason ``Cancelled`` (``spec.cancel`` or deletion while it ran)."""
        succeeded = self._condition(ConditionType.SUCCEEDED)
        return succeeded is not None and succeeded[0] == "False" and succeeded[1] == Reason.CANCELLED.value

    @property
    def lost(self) -> bool:
        """Ended because its runner was lost (``Succeeded=False/RunnerLost``)."""
        succeeded = self._condition(ConditionType.SUCCEEDED)
        return succeeded is not None and succeeded[0] == "False" and succeeded[1] == Reason.RUNNER_LOST.value

    @property
    def requeued(self) -> bool:
        """Re-queued after its runner was lost (``Routed=Unknown/RunnerLost``), not assigned again yet."""
        routed = self._condition(ConditionType.ROUTED)
        return not self.assigned and routed is not None and routed == ("Unknown", Reason.RUNNER_LOST.value)

    @property
    def held_runner(self) -> RunnerKey | None:
        """The runner an assigned, unfinished job holds a slot on (started or not); None otherwise."""
        return None if self.finished else self.assigned_runner

    @property
    def routing_attempts(self) -> int:
        """``status.routing.attempts``: the capacity waits written so far."""
        routing = self.raw_status.get("routing")
        try:
            return int((routing or {}).get("attempts") or 0) if isinstance(routing, Mapping) else 0
        except (TypeError, ValueError):
            return 0

    @property
    def attempts(self) -> int:
        """``status.attempts``: the automatic re-runs made so far."""
        try:
            return int(self.raw_status.get("attempts") or 0)
        except (TypeError, ValueError):
            return 0

    @property
    def needs_binding(self) -> bool:
        """Still to be bound at queue time: not bound, not deleted, not failed closed (a wait still needs it)."""
        if self.deleting or self.bound:
            return False
        routed = self._condition(ConditionType.ROUTED)
        return routed is None or routed[0] != "False" or routed[1] in WAITING_REASONS

    @property
    def needs_routing(self) -> bool:
        """Awaits a routing decision: bound, not assigned, not failed closed, not cancelled or deleted.

        ``Routed=False`` with ``WaitingForCapacity`` still awaits one; any other ``Routed=False``
        reason is final (the job failed closed at queue time).
        """
        if self.deleting or self.cancel or not self.bound or self.raw_status.get("assignment"):
            return False
        routed = self._condition(ConditionType.ROUTED)
        return routed is None or routed[0] != "False" or routed[1] == Reason.WAITING_FOR_CAPACITY.value


def parse_agent_job(body: Mapping[str, Any]) -> AgentJob:
    """Read an AgentJob object once. Never raises: unusable parts read as absent."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    if not isinstance(status, Mapping):
        status = {}
    if not isinstance(spec, Mapping):
        spec = {}
    conditions = tuple(dict(c) for c in status.get("conditions") or () if isinstance(c, Mapping))
    generation = meta.get("generation")
    return AgentJob(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        generation=generation if isinstance(generation, int) else None,
        deleting=bool(meta.get("deletionTimestamp")),
        cancel=bool(spec.get("cancel")),
        raw_spec=spec,
        raw_status=status,
        conditions=conditions,
        condition_status={
            str(c.get("type")): (str(c.get("status") or ""), str(c.get("reason") or "")) for c in conditions
        },
    )


def decide_held_runner(body: Mapping[str, Any]) -> RunnerKey | None:
    """:attr:`AgentJob.held_runner` of a job object (index functions call this on every event)."""
    return parse_agent_job(body).held_runner


def decide_finished(body: Mapping[str, Any]) -> bool:
    """:attr:`AgentJob.finished` of a job object."""
    return parse_agent_job(body).finished


def decide_needs_binding(body: Mapping[str, Any]) -> bool:
    """:attr:`AgentJob.needs_binding` of a job object."""
    return parse_agent_job(body).needs_binding


def decide_needs_routing(body: Mapping[str, Any]) -> bool:
    """:attr:`AgentJob.needs_routing` of a job object."""
    return parse_agent_job(body).needs_routing


# Status patches -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StatusPatch:
    """A JSON merge patch of ``status`` written by one step (``None`` deletes a field)."""

    step: Step
    status: dict[str, Any]

    @property
    def writer(self) -> Writer:
        return STEP_WRITERS[self.step]

    def conditional(self, resource_version: str) -> dict[str, Any]:
        """The body to merge-patch onto the status subresource, conditional on ``resource_version``."""
        return {"metadata": {"resourceVersion": resource_version}, "status": self.status}


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the API server does with ``application/merge-patch+json``)."""
    if not isinstance(patch, Mapping):
        return patch
    merged: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = apply_merge_patch(merged.get(key), value)
    return merged


def written_fields(job: AgentJob, patch: StatusPatch) -> set[str]:
    """The fields of :data:`STATUS_WRITERS` that ``patch`` changes on ``job`` (a condition by its type)."""
    fields = {k for k in patch.status if k != "conditions"}
    if "conditions" in patch.status:
        before = {c.get("type"): c for c in job.conditions}
        after = {c.get("type"): c for c in patch.status["conditions"] or ()}
        fields |= {f"conditions[{t}]" for t in before.keys() | after.keys() if before.get(t) != after.get(t)}
    return fields


def _set_conditions(
    job: AgentJob, updates: Sequence[tuple[str, bool | None, str, str]], *, now: dt.datetime
) -> list[dict[str, Any]]:
    current = [dict(c) for c in job.conditions]
    for ctype, value, reason, message in updates:
        current = set_condition(
            current, type=ctype, status=value, reason=reason, message=message, generation=job.generation, now=now
        ).conditions
    return current


def bind(job: AgentJob, *, binding: Mapping[str, Any]) -> StatusPatch:
    """Bound at queue time: ``status.profile``; a job that waited for a reference sheds its waiting conditions."""
    status: dict[str, Any] = {"profile": dict(binding)}
    cleared = build_bound_conditions(job.conditions)
    if cleared is not None:
        status["conditions"] = cleared
    return StatusPatch(step=Step.BIND, status=status)


def wait(job: AgentJob, *, reason: Reason, message: str, now: dt.datetime) -> StatusPatch | None:
    """Waiting for a reference: ``Routed=False``/``Ready=False`` with the waiting reason; None if already so."""
    return _unbound(Step.WAIT, job, reason=reason, message=message, now=now)


def fail(job: AgentJob, *, reason: Reason, message: str, now: dt.datetime) -> StatusPatch | None:
    """Failed closed at queue time: ``Routed=False``/``Ready=False`` with ``reason``; None if already so."""
    return _unbound(Step.FAIL, job, reason=reason, message=message, now=now)


def _unbound(step: Step, job: AgentJob, *, reason: Reason, message: str, now: dt.datetime) -> StatusPatch | None:
    update = build_unbound_conditions(
        job.conditions, reason=reason, message=message, generation=job.generation, now=now
    )
    return StatusPatch(step=step, status={"conditions": update.conditions}) if update.changed else None


def route(
    job: AgentJob,
    *,
    decision: RoutingDecision,
    memory_ids: Sequence[str] = (),
    binding: Mapping[str, Any] | None = None,
    now: dt.datetime,
) -> StatusPatch:
    """The router's decision: routing, conditions, the assignment when routed, and the binding when given.

    ``routing.attempts`` counts the capacity waits written: one more for a wait.
    """
    waiting = decision.outcome is RouteOutcome.WAITING
    status = build_status_patch(
        decision=decision,
        conditions=job.conditions,
        generation=job.generation,
        attempts=job.routing_attempts + 1 if waiting else job.routing_attempts,
        memory_ids=memory_ids,
        now=now,
    )
    if binding is not None:
        status["profile"] = dict(binding)
    return StatusPatch(step=Step.ROUTE, status=status)


_CLEARED_RESULT = {
    "summary": None,
    "output": None,
    "artifacts": None,
    "validationErrors": None,
    "patch": None,
    "checks": None,
}


def start(
    job: AgentJob,
    *,
    runner: str,
    message: str,
    session: Mapping[str, Any] | None,
    now: dt.datetime,
    memory: Mapping[str, Any] | None = None,
) -> StatusPatch:
    """The runner started the job: ``Running=True``/``Ready=Unknown`` (``Started``), ``result`` reset but ``startedAt``.

    ``memory`` is the run-time memory report (``status.result.memory``); None clears an earlier one.
    """
    text = f"running on runner {runner}: {message}"
    status: dict[str, Any] = {
        "conditions": _set_conditions(
            job,
            [(ConditionType.RUNNING, True, Reason.STARTED, text), (ConditionType.READY, None, Reason.STARTED, text)],
            now=now,
        ),
        "result": {
            "outcome": Reason.STARTED.value,
            "startedAt": _iso(now),
            **_CLEARED_RESULT,
            "completedAt": None,
            "memory": dict(memory) if memory is not None else None,
        },
    }
    if session is not None:
        status["session"] = dict(session)
    return StatusPatch(step=Step.START, status=status)


def finish(
    job: AgentJob, *, succeeded: bool, reason: str, message: str, result: Mapping[str, Any], now: dt.datetime
) -> StatusPatch:
    """The runner ended the job: ``Running=False``, ``Succeeded`` and ``Ready`` with ``reason``, and ``result``."""
    conditions = _set_conditions(
        job,
        [
            (ConditionType.RUNNING, False, reason, message),
            (ConditionType.SUCCEEDED, succeeded, reason, message),
            (ConditionType.READY, succeeded, reason, message),
        ],
        now=now,
    )
    previous = job.raw_status.get("result")
    started = previous.get("startedAt") if isinstance(previous, Mapping) else None
    body: dict[str, Any] = {**_CLEARED_RESULT, **dict(result), "outcome": reason, "completedAt": _iso(now)}
    if started and "startedAt" not in result:
        body["startedAt"] = started
    return StatusPatch(step=Step.FINISH, status={"conditions": conditions, "result": body})


def _lost_conditions(job: AgentJob, *, message: str, now: dt.datetime) -> list[dict[str, Any]]:
    updates: list[tuple[str, bool | None, str, str]] = [
        (ConditionType.SUCCEEDED, False, Reason.RUNNER_LOST, message),
        (ConditionType.READY, False, Reason.RUNNER_LOST, message),
    ]
    if ConditionType.RUNNING in job.condition_status:
        updates.append((ConditionType.RUNNING, False, Reason.RUNNER_LOST, message))
    return _set_conditions(job, updates, now=now)


def _lost_result(job: AgentJob, now: dt.datetime) -> dict[str, Any]:
    previous = job.raw_status.get("result")
    summary = previous.get("summary") if isinstance(previous, Mapping) else None
    return {"outcome": Reason.RUNNER_LOST.value, "completedAt": _iso(now), "summary": summary or ""}


def lost(job: AgentJob, *, message: str, why_not_rerun: str, now: dt.datetime) -> StatusPatch:
    """Its runner was lost and it is not run again: ``Succeeded=False``/``Ready=False`` (and ``Running=False``
    if it had started) with ``RunnerLost``; ``result.outcome = RunnerLost`` and ``completedAt``.

    The assignment and the rest of the result stay (a job that may have written keeps its history).
    """
    conditions = _with_verdict(_lost_conditions(job, message=message, now=now), message, why_not_rerun)
    return StatusPatch(step=Step.LOST, status={"conditions": conditions, "result": _lost_result(job, now)})


NOT_RERUN = "; not re-run: "
"""What separates an ended job's message from the operator's verdict; its presence means "decided"."""

_MESSAGE_MAX = 1024


def _with_verdict(conditions: list[dict[str, Any]], message: str, why: str) -> list[dict[str, Any]]:
    """``Succeeded`` and ``Ready`` say ``<message>; not re-run: <why>``; the message is shortened first,
    so the verdict (which later events look for) always fits."""
    verdict = f"{NOT_RERUN}{why}"[: _MESSAGE_MAX // 2]
    text = message[: _MESSAGE_MAX - len(verdict)] + verdict
    for cond in conditions:
        if cond["type"] in (ConditionType.SUCCEEDED, ConditionType.READY):
            cond["message"] = text
    return conditions


def close(job: AgentJob, *, why_not_rerun: str) -> StatusPatch:
    """Its runner ended it with an infrastructure reason and it is not run again: the verdict is added to
    the ``Succeeded`` and ``Ready`` messages (status, reason and times stay the runner's)."""
    succeeded = next((c for c in job.conditions if c.get("type") == ConditionType.SUCCEEDED), {})
    message = str(succeeded.get("message") or "")
    conditions = _with_verdict([dict(c) for c in job.conditions], message, why_not_rerun)
    return StatusPatch(step=Step.CLOSE, status={"conditions": conditions})


_KEPT_ON_REQUEUE = frozenset({"profile", "observedGeneration"})


def requeue(
    job: AgentJob, *, message: str, retry_message: str, now: dt.datetime, reason: Reason = Reason.RUNNER_LOST
) -> StatusPatch:
    """It failed for the infrastructure (``reason``: its runner was lost, by default) and may run again:
    every status field but the binding and ``observedGeneration`` is deleted, ``attempts`` grows by one,
    ``Routed=Unknown`` with ``reason`` says why.
    """
    conditions = set_condition(
        [],
        type=ConditionType.ROUTED,
        status=None,
        reason=reason,
        message=f"{message}; re-queued: {retry_message}",
        generation=job.generation,
        now=now,
    ).conditions
    status: dict[str, Any] = {k: None for k in job.raw_status if k not in _KEPT_ON_REQUEUE}
    status.update({"attempts": job.attempts + 1, "conditions": conditions})
    return StatusPatch(step=Step.REQUEUE, status=status)


@dataclass(frozen=True, kw_only=True)
class LostOutcome:
    """What the lost step decided for a job: the patch (``lost`` or ``requeue``) and the retry decision."""

    patch: StatusPatch
    retry: RetryDecision | None

    @property
    def requeued(self) -> bool:
        return self.patch.step is Step.REQUEUE


def decide_lost(job: AgentJob, *, message: str, now: dt.datetime) -> LostOutcome:
    """End a job whose runner was lost, or re-queue it when :func:`decide_job_retry` allows it.

    The retry decision reads the job as it would be once ended (``Succeeded=False/RunnerLost``).
    """
    ended_status = {
        **job.raw_status,
        "conditions": _lost_conditions(job, message=message, now=now),
        "result": {**(job.raw_status.get("result") or {}), **_lost_result(job, now)},
    }
    decision = decide_job_retry(job={"spec": job.raw_spec, "status": ended_status})
    if decision is not None and decision.retry:
        return LostOutcome(patch=requeue(job, message=message, retry_message=decision.message, now=now), retry=decision)
    why = decision.message if decision is not None else "not re-run"
    return LostOutcome(patch=lost(job, message=message, why_not_rerun=why, now=now), retry=decision)

"""An AgentJob read once: :class:`AgentJob` and its state properties, and :func:`parse_agent_job`. Pure.

The handful of fields every decision needs (metadata, the condition each type has, the
assignment's runner) are read eagerly and cheaply, because the operator asks on every watch
event; the typed models are validated on first use, once per object. The ``decide_*`` helpers
answer one property of a raw job object (index functions call them on every event). The job's
life and the status writer table: :mod:`helmhive.policy.agentjob.life`, which re-exports this module.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from helmhive.api.job import AgentJobSpec, AgentJobStatus, ProfileBinding
from helmhive.api.profile import EffectiveProfile
from helmhive.api.qualification import QUALIFICATION_LABEL
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.waiting import WAITING_REASONS

__all__ = [
    "AgentJob",
    "RunnerKey",
    "decide_finished",
    "decide_held_runner",
    "decide_needs_binding",
    "decide_needs_routing",
    "parse_agent_job",
]

RunnerKey = tuple[str, str]
"""(namespace, name) of a Runner."""


_FINAL = ("True", "False")


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
    qualifies: str | None = None
    """The runner this job qualifies (label ``helmhive.dev/qualification``): routing considers only it."""

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
        if not raw or not isinstance(raw, Mapping):
            return None
        try:
            return _parse_binding(raw)
        except ValidationError:
            return None

    # State.

    def _condition(self, ctype: str) -> tuple[str, str] | None:
        return self.condition_status.get(ctype)

    def condition(self, ctype: str) -> Mapping[str, Any] | None:
        """The condition of type ``ctype`` as read (wire form, with its message and times), if any."""
        return next((c for c in self.conditions if c.get("type") == ctype), None)

    def status_part(self, field: str) -> Mapping[str, Any]:
        """``status.<field>`` when it is an object (``assignment``, ``result``, ``profile``…), else empty."""
        part = self.raw_status.get(field)
        return part if isinstance(part, Mapping) else {}

    def with_status(self, status: Mapping[str, Any]) -> AgentJob:
        """This job as it would read with ``status`` in place of its own (to decide on a status about to be written)."""
        conditions = _read_conditions(status)
        return dataclasses.replace(
            self, raw_status=status, conditions=conditions, condition_status=_condition_status(conditions)
        )

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
    def refused(self) -> bool:
        """``Routed=False`` with a final reason: not a wait for a reference or for capacity."""
        routed = self._condition(ConditionType.ROUTED)
        if routed is None or routed[0] != "False":
            return False
        return routed[1] not in WAITING_REASONS and routed[1] != Reason.WAITING_FOR_CAPACITY.value

    @property
    def failed_closed(self) -> bool:
        """Never assigned and refused for good (:attr:`refused`)."""
        return not self.assigned and self.refused

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
    def recorded_attempts(self) -> int | None:
        """``status.attempts``: the automatic re-runs made so far; None when the field cannot be read
        (the re-run decision then spends no re-run on the job: :mod:`helmhive.policy.agentjob.retry`)."""
        try:
            return int(self.raw_status.get("attempts") or 0)
        except (TypeError, ValueError):
            return None

    @property
    def attempts(self) -> int:
        """``status.attempts`` as a count: :attr:`recorded_attempts`, 0 when it cannot be read."""
        recorded = self.recorded_attempts
        return 0 if recorded is None else recorded

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


_SNAPSHOTS: OrderedDict[tuple[str, str, str], tuple[dict[str, Any], EffectiveProfile]] = OrderedDict()
_SNAPSHOTS_KEPT = 64


def _parse_binding(raw: Mapping[str, Any]) -> ProfileBinding:
    """``status.profile`` parsed; the snapshot of a revision seen before is not validated again.

    A burst of jobs bound to one revision carries the same snapshot thousands of times: a
    snapshot equal to the one kept for its (name, revision, hash) reuses that parsed profile
    (read-only for every caller); any other is validated and kept.
    """
    snapshot = raw.get("snapshot")
    key = (str(raw.get("name")), str(raw.get("revision")), str(raw.get("hash")))
    kept = _SNAPSHOTS.get(key)
    if kept is not None and kept[0] == snapshot:
        return ProfileBinding.model_validate({**raw, "snapshot": kept[1]})
    binding = ProfileBinding.model_validate(raw)
    if isinstance(snapshot, Mapping):
        _SNAPSHOTS[key] = (copy.deepcopy(dict(snapshot)), binding.snapshot)
        while len(_SNAPSHOTS) > _SNAPSHOTS_KEPT:
            _SNAPSHOTS.popitem(last=False)
    return binding


def parse_agent_job(body: Mapping[str, Any]) -> AgentJob:
    """Read an AgentJob object once. Never raises: unusable parts read as absent."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    if not isinstance(status, Mapping):
        status = {}
    if not isinstance(spec, Mapping):
        spec = {}
    conditions = _read_conditions(status)
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
        condition_status=_condition_status(conditions),
        qualifies=_qualifies(meta),
    )


def _qualifies(meta: Mapping[str, Any]) -> str | None:
    labels = meta.get("labels")
    value = labels.get(QUALIFICATION_LABEL) if isinstance(labels, Mapping) else None
    return str(value) if value else None


def _read_conditions(status: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    raw = status.get("conditions")
    return tuple(dict(c) for c in raw if isinstance(c, Mapping)) if isinstance(raw, list | tuple) else ()


def _condition_status(conditions: tuple[dict[str, Any], ...]) -> dict[str, tuple[str, str]]:
    return {str(c.get("type")): (str(c.get("status") or ""), str(c.get("reason") or "")) for c in conditions}


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

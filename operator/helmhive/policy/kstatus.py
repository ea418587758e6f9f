"""kstatus's view of each kind: progressing, ready, failed or suspended, and the conditions that say it. Pure.

Flux (and kpt, and ``kubectl``'s own waiters built on it) judge a custom resource with kstatus
(``sigs.k8s.io/cli-utils/pkg/kstatus``): ``status.observedGeneration`` behind
``metadata.generation`` is InProgress; a ``Reconciling=True`` condition is InProgress; a
``Stalled=True`` condition is Failed; otherwise ``Ready=True`` or no ``Ready`` at all is
Current, and ``Ready`` False or Unknown is InProgress. Without ``Stalled`` a failed job would
read as InProgress for ever, and a Runner (which has no ``Ready``) as Current while it registers.

So each kind's existing verdicts (its ``Ready``, or a Runner's ``Schedulable``…) are read by one
``decide_<kind>_progress`` here into a :class:`Progress`, with the same reason sets the Argo CD
health checks in ``charts/helmhive/argocd`` mirror (a unit test keeps them equal), and
:func:`build_kstatus_conditions` turns that into the two abnormal-true conditions, the one place
of that mapping:

- :attr:`Progress.PROGRESSING`: ``Reconciling=True``, no ``Stalled``;
- :attr:`Progress.FAILED`: ``Stalled=True``, no ``Reconciling``;
- :attr:`Progress.READY` and :attr:`Progress.SUSPENDED`: neither (absent means False).

Each carries the reason and message of the condition it was derived from (always a named reason).
A writer calls :func:`with_kstatus` on the status it is about to write, in the same write, so the
two never disagree and a status that did not change costs no write.

No I/O; ``now`` is an argument.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.conditions import ConditionUpdate, find_condition, set_condition
from helmhive.policy.finality import NOT_RERUN, RETRYABLE_REASONS, TERMINAL_REASONS
from helmhive.policy.waiting import WAITING_REASONS

__all__ = [
    "CHANGE_SUSPENDED_REASONS",
    "DECIDERS",
    "RUNNER_STARTING_REASONS",
    "RUNNER_SUSPENDED_REASONS",
    "WARM_POD_FAILED_REASONS",
    "Progress",
    "ProgressVerdict",
    "build_kstatus_conditions",
    "decide_agentjob_progress",
    "decide_change_progress",
    "decide_memory_record_progress",
    "decide_profile_progress",
    "decide_runner_progress",
    "decide_runnerpool_progress",
    "with_kstatus",
]


class Progress(enum.StrEnum):
    """Where an object is, as GitOps tools need to know it."""

    PROGRESSING = "Progressing"
    """It will move on by itself: queued, waiting for capacity or a reference, running, starting."""
    READY = "Ready"
    """It is what its spec asks for: a job succeeded, a pool's runners are up, a profile is valid."""
    FAILED = "Failed"
    """It failed and will not move on without a person: failed closed, a final reason, an invalid spec."""
    SUSPENDED = "Suspended"
    """Held on purpose: drained or disabled by an administrator, a plan awaiting a person's approval,
    a memory record past the expiry its spec set. Neither condition: kstatus reads ``Ready`` if there is one."""


@dataclass(frozen=True, kw_only=True)
class ProgressVerdict:
    """A :class:`Progress` with the named reason and the message of the condition it was read from."""

    progress: Progress
    reason: str
    message: str = ""


CHANGE_SUSPENDED_REASONS = frozenset({Reason.AWAITING_APPROVAL, Reason.APPROVAL_DIGEST_MISMATCH})
"""A Change's ``Ready`` reasons that wait for a person to approve its plan."""
RUNNER_SUSPENDED_REASONS = frozenset({Reason.CONTROL_DRAINING, Reason.CONTROL_DISABLED})
"""A Runner's ``Schedulable`` reasons that an administrator chose."""
RUNNER_STARTING_REASONS = frozenset(
    {
        Reason.NEVER_REPORTED,
        Reason.LEASE_MISSING,
        Reason.CREDENTIAL_ROTATED,
        Reason.HEARTBEAT_HELD,
        Reason.AUTHENTICATION_UNKNOWN,
        Reason.QUALIFICATION_PENDING,
    }
)
"""A Runner's ``Schedulable`` reasons while it registers, renews, catches up with a rotated credential or
runs its first qualification round."""
WARM_POD_FAILED_REASONS = frozenset({Reason.WARM_POD_FAILING, Reason.WARM_PODS_NOT_KEPT})
"""A JobPod pool's ``WarmPodsReady`` reasons that no waiting mends."""


def _conditions(status: Mapping[str, Any]) -> Sequence[dict[str, Any]]:
    conditions = status.get("conditions")
    return conditions if isinstance(conditions, list) else []


def _from(cond: Mapping[str, Any], progress: Progress) -> ProgressVerdict:
    return ProgressVerdict(
        progress=progress, reason=str(cond.get("reason") or Reason.PENDING), message=str(cond.get("message") or "")
    )


def _pending(message: str) -> ProgressVerdict:
    return ProgressVerdict(progress=Progress.PROGRESSING, reason=Reason.PENDING, message=message)


def _base(reason: Any) -> str:
    return str(reason or "").split(":", 1)[0]


def decide_agentjob_progress(status: Mapping[str, Any]) -> ProgressVerdict:
    """From ``Ready``: True is ready; False is failed, but for a job waiting for a reference, or one ended
    for an infrastructure reason whose re-run the operator has not decided yet (no ``; not re-run:``);
    absent or Unknown (queued, waiting for capacity, running) is progressing."""
    conditions = _conditions(status)
    ready = find_condition(conditions, ConditionType.READY)
    if ready is None:
        routed = find_condition(conditions, ConditionType.ROUTED)  # a re-queued job has only Routed
        return _from(routed, Progress.PROGRESSING) if routed else _pending("waiting for the operator to route the job")
    if ready.get("status") == "True":
        return _from(ready, Progress.READY)
    if ready.get("status") != "False":
        return _from(ready, Progress.PROGRESSING)
    base = _base(ready.get("reason"))
    undecided = base in RETRYABLE_REASONS and NOT_RERUN not in str(ready.get("message") or "")
    return _from(ready, Progress.PROGRESSING if undecided or base in WAITING_REASONS else Progress.FAILED)


def decide_change_progress(status: Mapping[str, Any]) -> ProgressVerdict:
    """From ``Ready``: True (the review approved the patch) is ready; a final reason is failed; awaiting
    a person's approval is suspended; anything else (a stage pending or running) is progressing."""
    ready = find_condition(_conditions(status), ConditionType.READY)
    if ready is None:
        return _pending("waiting for the operator to start the change")
    if ready.get("status") == "True":
        return _from(ready, Progress.READY)
    reason = ready.get("reason")
    if reason in TERMINAL_REASONS:
        return _from(ready, Progress.FAILED)
    if reason in CHANGE_SUSPENDED_REASONS:
        return _from(ready, Progress.SUSPENDED)
    return _from(ready, Progress.PROGRESSING)


def decide_runnerpool_progress(status: Mapping[str, Any]) -> ProgressVerdict:
    """Ready when this generation is reconciled (``Ready=True``), its credential Secret is there, a JobPod
    pool's warm pods are ready and as many runners are Online as it wants; failed for ``Ready=False``
    (an invalid spec, objects the API server refused) or a warm pod that cannot start; else progressing."""
    conditions = _conditions(status)
    ready = find_condition(conditions, ConditionType.READY)
    if ready is None:
        return _pending("waiting for the operator to reconcile the pool")
    if ready.get("status") == "False":
        return _from(ready, Progress.FAILED)
    if ready.get("status") != "True":
        return _from(ready, Progress.PROGRESSING)
    credential = find_condition(conditions, ConditionType.CREDENTIAL_AVAILABLE)
    if credential is not None and credential.get("status") != "True":
        return _from(credential, Progress.PROGRESSING)  # applied with the pool, the Secret may come a moment later
    warm = find_condition(conditions, ConditionType.WARM_PODS_READY)
    if warm is not None and warm.get("status") != "True":
        failed = warm.get("reason") in WARM_POD_FAILED_REASONS
        return _from(warm, Progress.FAILED if failed else Progress.PROGRESSING)
    desired, online = int(status.get("desiredReplicas") or 0), int(status.get("readyReplicas") or 0)
    if online < desired:
        return ProgressVerdict(
            progress=Progress.PROGRESSING,
            reason=Reason.RUNNER_PODS_STARTING,
            message=f"{online} of {desired} runners Online",
        )
    return _from(ready, Progress.READY)


def decide_runner_progress(status: Mapping[str, Any]) -> ProgressVerdict:
    """From ``Schedulable``: True is ready; drained or disabled is suspended; registering, renewing,
    catching up with a rotated credential or qualifying for the first time is progressing; anything
    else (its heartbeat or login failing, its credential missing, revoked, a failed or stale
    qualification) is failed."""
    schedulable = find_condition(_conditions(status), ConditionType.SCHEDULABLE)
    if schedulable is None:
        return _pending("waiting for the runner to register")
    if schedulable.get("status") == "True":
        return _from(schedulable, Progress.READY)
    reason = schedulable.get("reason")
    if reason in RUNNER_SUSPENDED_REASONS:
        return _from(schedulable, Progress.SUSPENDED)
    if reason in RUNNER_STARTING_REASONS:
        return _from(schedulable, Progress.PROGRESSING)
    return _from(schedulable, Progress.FAILED)


def decide_profile_progress(status: Mapping[str, Any]) -> ProgressVerdict:
    """From ``Valid``: True is ready, False (its spec widens its envelope, names no mapping…) is failed."""
    valid = find_condition(_conditions(status), ConditionType.VALID)
    if valid is None:
        return _pending("waiting for the operator to check the profile")
    return _from(valid, Progress.READY if valid.get("status") == "True" else Progress.FAILED)


def decide_memory_record_progress(status: Mapping[str, Any]) -> ProgressVerdict:
    """From ``Active``: True is ready; waiting for its Workspace is progressing; past its expiry is
    suspended (its spec said so); any other reason (no such Workspace or service, an invalid spec) is failed."""
    active = find_condition(_conditions(status), ConditionType.ACTIVE)
    if active is None:
        return _pending("waiting for the operator to check the record")
    if active.get("status") == "True":
        return _from(active, Progress.READY)
    reason = active.get("reason")
    if reason in WAITING_REASONS:
        return _from(active, Progress.PROGRESSING)
    if reason == Reason.EXPIRED:
        return _from(active, Progress.SUSPENDED)
    return _from(active, Progress.FAILED)


DECIDERS: Mapping[str, Callable[[Mapping[str, Any]], ProgressVerdict]] = {
    "AgentJob": decide_agentjob_progress,
    "Change": decide_change_progress,
    "MemoryRecord": decide_memory_record_progress,
    "Profile": decide_profile_progress,
    "Runner": decide_runner_progress,
    "RunnerPool": decide_runnerpool_progress,
}
"""Each kind that carries kstatus conditions, by ``kind``."""

_SHOWN: Mapping[Progress, ConditionType | None] = {
    Progress.PROGRESSING: ConditionType.RECONCILING,
    Progress.FAILED: ConditionType.STALLED,
    Progress.READY: None,
    Progress.SUSPENDED: None,
}


def build_kstatus_conditions(
    conditions: Sequence[dict[str, Any]] | None,
    *,
    verdict: ProgressVerdict,
    generation: int | None,
    now: dt.datetime,
) -> ConditionUpdate:
    """``conditions`` with ``Reconciling`` or ``Stalled`` set True for ``verdict``, the other one removed."""
    shown = _SHOWN[verdict.progress]
    kept = [dict(c) for c in conditions or () if c.get("type") not in _KSTATUS_TYPES or c.get("type") == shown]
    changed = len(kept) != len(conditions or ())
    if shown is None:
        return ConditionUpdate(kept, changed)
    update = set_condition(
        kept,
        type=shown.value,
        status=True,
        reason=str(verdict.reason),
        message=verdict.message,
        generation=generation,
        now=now,
    )
    return ConditionUpdate(update.conditions, changed or update.changed)


_KSTATUS_TYPES = frozenset({ConditionType.RECONCILING, ConditionType.STALLED})


def with_kstatus(kind: str, status: Mapping[str, Any], *, generation: int | None, now: dt.datetime) -> dict[str, Any]:
    """``status`` (a whole status, as it will be stored) with its kstatus conditions and ``observedGeneration``."""
    verdict = DECIDERS[kind](status)
    update = build_kstatus_conditions(_conditions(status), verdict=verdict, generation=generation, now=now)
    result = dict(status)
    if update.changed:
        result["conditions"] = update.conditions
    if generation is not None:
        result["observedGeneration"] = generation
    return result

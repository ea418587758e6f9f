"""A pool's warm set: how many warm job pods to create and which to delete. Pure.

The warm set is the pool's job pods labelled warm and claimed by no job (:attr:`PodView.warm`).
:func:`decide_warm_pods` keeps ``execution.warmPods`` of them alive: it deletes those that ended
(a warm pod that failed or exited can never be claimed) and those beyond the count, and creates the
shortfall. A claimed pod is never in the warm set, so it is never deleted here; a pod already being
deleted is neither counted nor deleted again. A warm pod that cannot start (an image that cannot be
pulled, say) is kept: deleting it would only pull again at the reconciler's rate.

:func:`decide_warm_condition` says how the warm set is doing, for the pool's ``WarmPodsReady``
condition: ready, still starting, failing (a pod that cannot start or cannot be scheduled, named
with the kubelet's or the scheduler's reason), or not kept (the operator's writes refused).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from helmhive.api.reasons import Reason
from helmhive.policy.jobpods.outcome import CANNOT_RUN_REASONS, CANNOT_START_REASONS
from helmhive.policy.jobpods.view import PodView

__all__ = ["WarmPlan", "WarmVerdict", "decide_warm_condition", "decide_warm_pods"]

_NEVER = dt.datetime.max.replace(tzinfo=dt.UTC)


@dataclass(frozen=True, kw_only=True)
class WarmPlan:
    """What the operator does to the pool's warm set: create ``create`` pods, delete ``delete``.

    Delete each with the preconditions ``{uid, resourceVersion}`` it was read with: a pod claimed
    since (the claim changes its resourceVersion) is then refused (409 Conflict) and stays.
    """

    create: int
    delete: tuple[PodView, ...]


def _readiest_first(pod: PodView) -> tuple[bool, dt.datetime, str]:
    """Running pods before the rest, the longest started first: the ones a scale-down keeps."""
    return (pod.status.phase != "Running", pod.status.start_time or _NEVER, pod.name)


def decide_warm_pods(*, want: int, pods: Sequence[PodView]) -> WarmPlan:
    """The plan that leaves ``want`` live warm pods among the pool's job pods ``pods``.

    Deleted: every warm pod that ended, then the live ones beyond ``want``, those not running yet
    and the most recently started first. Raises ValueError for a negative ``want``.
    """
    if want < 0:
        raise ValueError(f"want must be at least 0, not {want}")
    warm = [p for p in pods if p.warm and not p.deleting]
    ended = [p for p in warm if p.ended]
    live = sorted((p for p in warm if not p.ended), key=_readiest_first)
    return WarmPlan(create=max(0, want - len(live)), delete=(*ended, *live[want:]))


@dataclass(frozen=True, kw_only=True)
class WarmVerdict:
    """The pool's ``WarmPodsReady`` condition, and how many warm pods are ready to be claimed."""

    status: bool
    reason: Reason
    message: str
    ready: int


_FAILING_WAITS = CANNOT_START_REASONS | {"ErrImagePull", "CrashLoopBackOff"}
"""A warm pod's container reasons that the pool reports (``ErrImagePull`` too: a warm pod has time to wait)."""


def _failing(pod: PodView) -> str | None:
    """Why ``pod`` cannot become ready (unschedulable, a container that cannot start or ended), or None."""
    scheduled = pod.condition("PodScheduled")
    if scheduled is not None and scheduled.status == "False" and scheduled.reason == "Unschedulable":
        return f"Unschedulable: {scheduled.message}"
    if pod.ended:
        return f"{pod.status.phase} {pod.status.reason}: {pod.status.message}".rstrip(": ")
    for container in pod.status.container_statuses:
        waiting, ended = container.state.waiting, container.state.terminated
        if waiting is not None and waiting.reason in _FAILING_WAITS:
            return f"container {container.name} {waiting.reason}: {waiting.message}".rstrip(": ")
        if ended is not None and ended.reason in CANNOT_RUN_REASONS:
            return f"container {container.name} {ended.reason}: {ended.message}".rstrip(": ")
    return None


def decide_warm_condition(*, want: int, pods: Sequence[PodView], keep_error: str = "") -> WarmVerdict:
    """The warm set's condition, from the pool's job pods ``pods`` and the last refused write (``keep_error``).

    In order: writes refused (``WarmPodsNotKept``), a pod that cannot become ready
    (``WarmPodFailing``, the first by name), fewer than ``want`` ready (``WarmPodsStarting``), else
    ready (``WarmPodsReady``, or ``NoWarmPods`` for ``want`` 0).
    """
    warm = sorted((p for p in pods if p.warm and not p.deleting), key=lambda p: p.name)
    ready = sum(1 for p in warm if not p.ended and (c := p.condition("Ready")) is not None and c.status == "True")
    if keep_error:
        message = f"warm job pods not kept ({ready} of {want} ready): {keep_error}"
        return WarmVerdict(status=False, reason=Reason.WARM_PODS_NOT_KEPT, message=message[:1024], ready=ready)
    failing = next(((p.name, why) for p in warm if (why := _failing(p)) is not None), None)
    if failing is not None and ready < want:
        message = f"warm pod {failing[0]} cannot become ready ({ready} of {want} ready): {failing[1]}"
        return WarmVerdict(status=False, reason=Reason.WARM_POD_FAILING, message=message[:1024], ready=ready)
    if want == 0:
        message = "execution.warmPods is 0: each job's pod is created when the job starts"
        return WarmVerdict(status=True, reason=Reason.NO_WARM_PODS, message=message, ready=ready)
    if ready < want:
        message = f"{ready} of {want} warm pods ready"
        return WarmVerdict(status=False, reason=Reason.WARM_PODS_STARTING, message=message, ready=ready)
    return WarmVerdict(status=True, reason=Reason.WARM_PODS_READY, message=f"{ready} warm pods ready", ready=ready)

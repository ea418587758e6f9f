"""A pool's warm set: how many warm job pods to create and which to delete. Pure.

The warm set is the pool's job pods labelled warm and claimed by no job (:attr:`PodView.warm`).
:func:`decide_warm_pods` keeps ``execution.warmPods`` of them alive: it deletes those that ended
(a warm pod that failed or exited can never be claimed) and those beyond the count, and creates the
shortfall. A claimed pod is never in the warm set, so it is never deleted here; a pod already being
deleted is neither counted nor deleted again. A warm pod that cannot start (an image that cannot be
pulled, say) is kept: deleting it would only pull again at the reconciler's rate.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from helmhive.policy.jobpods.view import PodView

__all__ = ["WarmPlan", "decide_warm_pods"]

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

"""A job's pod (``RunnerPool.spec.execution.mode: JobPod``): claimed or created, waited for, judged, deleted.

:func:`ensure_job_pod` gets the job a pod of its own: it lists the pool's warm pods (labelled
warm, running, not being deleted: :func:`decide_claim_order`) and claims the first it can with
:func:`~helmhive.policy.jobpods.pod.build_claim_patch`, a merge patch conditional on the pod's
``resourceVersion`` -- a pod another runner claimed first answers 409 and the next is tried; with
none left it creates one from runner.json's ``jobPodTemplate``
(:func:`~helmhive.policy.jobpods.pod.build_cold_job_pod`). Either way the pod is the job's: owned by
its AgentJob, labelled with it and this runner, ended by the kubelet after the job's timeout.

:func:`wait_job_pod` waits (a watch, no polling) until the pod runs with an address and its shim
started (:func:`decide_pod_start`), or until its state means the job cannot run
(:func:`~helmhive.policy.jobpods.outcome.decide_job_pod_outcome`: ``JobPodFailed``, ``JobPodLost``...),
at most the pool's ``execution.startTimeoutSeconds``: then the pod's state says why it has not
started (:func:`~helmhive.policy.jobpods.outcome.decide_start_timeout`: ``JobPodFailed:Unschedulable``...).
:func:`read_job_pod_outcome` asks the same of the pod once, after the link failed or the agent
died: whether the pod says why; :func:`watch_job_pod_loss` watches for it while the agent runs (a
pod deleted, evicted, drained or OOM-killed ends the job at once, not when the link notices).
:func:`remove_job_pod` deletes it (gone already is done);
:func:`remove_job_pods` every pod this runner had for a job an earlier process of it lost.
``decide_*``/``build_*`` are pure.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from helmhive.api.jobpod import AGENT_CONTAINER, LABEL_JOB, LABEL_RUNNER, LABEL_WARM, SHIM_CONTAINER
from helmhive.api.reasons import Reason, detailed
from helmhive.policy.jobpods.identity import JobRef, build_job_pod_selector, label_value
from helmhive.policy.jobpods.outcome import JobPodOutcome, decide_job_pod_outcome, decide_start_timeout
from helmhive.policy.jobpods.pod import build_claim_patch, build_cold_job_pod
from helmhive.policy.jobpods.view import PodView
from helmhive.runner.kube import Conflict, NotFound, RunnerKube

__all__ = [
    "AcquiredPod",
    "StartedPod",
    "build_job_selector",
    "build_warm_selector",
    "decide_claim_order",
    "decide_pod_loss",
    "decide_pod_start",
    "ensure_job_pod",
    "read_job_pod_outcome",
    "remove_job_pod",
    "remove_job_pods",
    "wait_job_pod",
    "watch_job_pod_loss",
]

_CREATE_TRIES = 3
_NEVER = dt.datetime.max.replace(tzinfo=dt.UTC)


@dataclass(frozen=True, kw_only=True)
class AcquiredPod:
    """The job's pod: its name, and whether it was claimed from the warm set (else created for the job)."""

    name: str
    claimed: bool


@dataclass(frozen=True, kw_only=True)
class StartedPod:
    """A job pod whose shim runs: where the runner reaches it."""

    name: str
    ip: str


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in labels.items())


def build_warm_selector(pool: str) -> str:
    """The label selector of ``pool``'s warm pods (claimed ones have lost the warm label)."""
    return _selector({**build_job_pod_selector(pool), LABEL_WARM: "true"})


def build_job_selector(*, pool: str, job: str, runner: str) -> str:
    """The label selector of the pods ``runner`` claimed or created for ``job`` (labels hold 63 characters
    of a name: the pod's owner says whose it is)."""
    return _selector({**build_job_pod_selector(pool), LABEL_JOB: label_value(job), LABEL_RUNNER: label_value(runner)})


def decide_claim_order(pods: Sequence[Mapping[str, Any]]) -> list[PodView]:
    """The warm pods worth claiming, the longest started first: running, unclaimed, not being deleted."""
    views = [PodView.parse(pod) for pod in pods]
    ready = [v for v in views if v.warm and not v.deleting and v.status.phase == "Running"]
    return sorted(ready, key=lambda v: (v.status.start_time or _NEVER, v.name))


def _shim_started(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    shim = next((c for c in statuses if isinstance(c, Mapping) and c.get("name") == SHIM_CONTAINER), None)
    return shim is not None and isinstance(shim.get("state"), Mapping) and "running" in shim["state"]


def decide_pod_start(pod: Mapping[str, Any] | None) -> StartedPod | JobPodOutcome | None:
    """What the pod's state (None: gone) means before the job runs in it: it can be reached, it never
    will be (the outcome that ends the job), or neither yet (None: wait)."""
    view = PodView.parse(pod) if pod is not None else None
    outcome = decide_job_pod_outcome(pod=view, job_finished=False)
    if outcome is not None or pod is None or view is None:
        return outcome
    if view.ended:  # the shim exited before the job used the pod: nothing can run in it any more
        why = f"pod {view.name} ended ({view.status.phase}) before the job could start in it"
        return JobPodOutcome(reason=detailed(Reason.JOB_POD_LOST, "Ended"), base=Reason.JOB_POD_LOST, message=why)
    ip = str((pod.get("status") or {}).get("podIP") or "")
    if view.status.phase == "Running" and ip and _shim_started(pod):
        return StartedPod(name=view.name, ip=ip)
    return None


async def ensure_job_pod(
    *,
    kube: RunnerKube,
    template: Mapping[str, Any],
    pool: str,
    job: JobRef,
    runner: str,
    timeout_seconds: int,
    now: Callable[[], dt.datetime],
) -> AcquiredPod:
    """Claim a warm pod of ``pool`` for ``job``, or create one; raises KubeError if neither can be done."""
    for view in decide_claim_order(await kube.list_pods(label_selector=build_warm_selector(pool))):
        patch = build_claim_patch(
            pod=view, job_name=job.name, job_uid=job.uid, runner=runner, timeout_seconds=timeout_seconds, now=now()
        )
        try:
            await kube.merge_patch_pod(view.name, patch)
        except (Conflict, NotFound):  # claimed (or deleted) since the list: the next one
            continue
        return AcquiredPod(name=view.name, claimed=True)
    body = build_cold_job_pod(template, job=job, runner=runner, timeout_seconds=timeout_seconds)
    for attempt in range(_CREATE_TRIES):
        try:
            created = await kube.create_pod(body)
        except Conflict:  # a generated name that was taken: the API server draws another
            if attempt + 1 == _CREATE_TRIES:
                raise
            continue
        return AcquiredPod(name=str(created["metadata"]["name"]), claimed=False)
    raise AssertionError("unreachable")  # pragma: no cover


async def wait_job_pod(kube: RunnerKube, name: str, *, timeout_seconds: int) -> StartedPod | JobPodOutcome:
    """Wait until the pod can be reached or never will be, at most ``timeout_seconds`` (one timer per
    job that waits; the watch does the rest): then the pod's state now says why it has not started."""
    try:
        return await asyncio.wait_for(kube.wait_pod(name, decide_pod_start), timeout_seconds)
    except TimeoutError:
        pass
    try:
        pod: dict[str, Any] | None = await kube.get_pod(name)
    except NotFound:
        pod = None
    decided = decide_pod_start(pod)  # it may have started, failed or gone as the timer fired
    if decided is not None:
        return decided
    assert pod is not None  # a pod gone is an outcome
    return decide_start_timeout(pod=PodView.parse(pod), seconds=timeout_seconds)


async def read_job_pod_outcome(kube: RunnerKube, name: str) -> JobPodOutcome | None:
    """Why the pod failed the job, from its state now (None: it does not say; the runner's reason stands)."""
    try:
        pod: dict[str, Any] | None = await kube.get_pod(name)
    except NotFound:
        pod = None
    return decide_job_pod_outcome(pod=PodView.parse(pod) if pod is not None else None, job_finished=False)


def decide_pod_loss(pod: Mapping[str, Any] | None) -> JobPodOutcome | None:
    """While the job runs in the pod: the failure its state (None: gone) means, or None (none yet)."""
    return decide_job_pod_outcome(pod=PodView.parse(pod) if pod is not None else None, job_finished=False)


async def watch_job_pod_loss(kube: RunnerKube, name: str) -> JobPodOutcome:
    """Return once the pod's state means the job failed (a watch, no polling); the caller cancels it
    when the job ends first."""
    return await kube.wait_pod(name, decide_pod_loss)


SETTLE_S = 20.0
"""After a failed turn, how long the pod's status may take to show its agent container ended (the
kubelet reports a container's end, OOMKilled included, a moment after the runner saw the agent go)."""


@dataclass(frozen=True, slots=True)
class _Settled:
    outcome: JobPodOutcome | None


def decide_agent_settled(pod: Mapping[str, Any] | None) -> _Settled | None:
    """After the agent died: the pod's word once it says something or shows the agent container ended
    (None: not yet). A pod gone is an outcome (``JobPodLost``)."""
    outcome = decide_job_pod_outcome(pod=PodView.parse(pod) if pod is not None else None, job_finished=False)
    if outcome is not None or pod is None:
        return _Settled(outcome)
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    agent = next((c for c in statuses if isinstance(c, Mapping) and c.get("name") == AGENT_CONTAINER), None)
    ended = agent is not None and isinstance(agent.get("state"), Mapping) and "terminated" in agent["state"]
    return _Settled(None) if ended else None


async def settle_job_pod_outcome(kube: RunnerKube, name: str, *, seconds: float = SETTLE_S) -> JobPodOutcome | None:
    """Why the pod failed the job, waiting (a watch, at most ``seconds``) for its status to show the agent's end."""
    try:
        settled = await asyncio.wait_for(kube.wait_pod(name, decide_agent_settled), seconds)
    except TimeoutError:
        return await read_job_pod_outcome(kube, name)
    return settled.outcome


async def remove_job_pod(kube: RunnerKube, name: str) -> bool:
    """Delete the job's pod; False if it was gone already."""
    return await kube.delete_pod(name)


async def remove_job_pods(kube: RunnerKube, *, pool: str, job: JobRef, runner: str) -> list[str]:
    """Delete every pod ``runner`` had for ``job`` (an earlier process of it lost the job); the names deleted."""
    removed = []
    for pod in await kube.list_pods(label_selector=build_job_selector(pool=pool, job=job.name, runner=runner)):
        view = PodView.parse(pod)
        owner = view.controller
        if owner is None or owner.kind != "AgentJob" or owner.uid != job.uid:
            continue  # another job whose name starts alike
        if await kube.delete_pod(view.name):
            removed.append(view.name)
    return removed

"""What a job pod's state says about its job, for a job still running: the failure the operator records. Pure.

The runner reports a job's own ending (the agent's answer, its crash, a limit the launcher
enforced) through the link; :func:`decide_job_pod_outcome` covers what the runner cannot see or
cannot report, from the pod's status alone, in this order:

1. the agent's container killed at its memory limit (``OOMKilled``): ``ResourceLimitExceeded:memory``;
2. the pod's deadline passed (``DeadlineExceeded``): ``TimedOut``;
3. the pod taken away: evicted, preempted, shut down with its node, rejected by its node (any other
   reason of a failed pod), a ``DisruptionTarget`` condition, or the pod gone: ``JobPodLost`` (an
   infrastructure failure, retried like ``RunnerLost``), with the cause as detail;
4. a container that cannot start (its image cannot be pulled, its configuration refers to something
   missing, its runtime refused it): ``JobPodFailed`` with the container's reason.

:func:`decide_start_timeout` names why a pod that has not started within the pool's
``execution.startTimeoutSeconds`` (the caller's clock) has not: ``JobPodFailed:Unschedulable`` with
the scheduler's message when no node could take it, else ``JobPodFailed:StartTimeout`` with what it
still waits for.

Not decided here: a container that ended of its own accord (the runner reports that), and any job
already finished.
"""

from __future__ import annotations

from dataclasses import dataclass

from helmhive.api.jobpod import AGENT_CONTAINER
from helmhive.api.reasons import Reason, detailed
from helmhive.policy.jobpods.view import PodView

__all__ = [
    "CANNOT_RUN_REASONS",
    "CANNOT_START_REASONS",
    "JobPodOutcome",
    "decide_job_pod_outcome",
    "decide_start_timeout",
]

MESSAGE_LIMIT = 1024
CANNOT_START_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""A waiting container's reasons that mean it will not start. ``ErrImagePull`` is not one: the kubelet
tries again, and only a pull that keeps failing becomes ``ImagePullBackOff``."""
CANNOT_RUN_REASONS = frozenset({"StartError", "ContainerCannotRun"})
"""A terminated container's reasons that mean it never ran."""
_LOST_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "Shutdown", "Terminated", "NodeShutdown"})
"""A pod's own reasons for being taken away, whatever its phase says yet."""


@dataclass(frozen=True, kw_only=True)
class JobPodOutcome:
    """The failure to record: ``reason`` for the job's conditions (``base`` or ``base:detail``) and why."""

    reason: str
    base: Reason
    message: str


def _outcome(base: Reason, detail: str, message: str) -> JobPodOutcome:
    reason = detailed(base, detail) if detail else base.value
    return JobPodOutcome(reason=reason, base=base, message=message[:MESSAGE_LIMIT])


def _said(text: str) -> str:
    return f": {text}" if text else ""


def decide_job_pod_outcome(*, pod: PodView | None, job_finished: bool) -> JobPodOutcome | None:
    """The failure ``pod`` means for its job, or None when it means none (yet).

    ``pod`` None means the job's pod was there and is gone. ``job_finished``: the job already has
    its outcome, which stands whatever became of the pod.
    """
    if job_finished:
        return None
    if pod is None:
        return _outcome(Reason.JOB_POD_LOST, "", "the job's pod was deleted while the job was running")
    agent = pod.container(AGENT_CONTAINER)
    ended = agent.state.terminated if agent is not None else None
    if ended is not None and ended.reason == "OOMKilled":
        return _outcome(
            Reason.RESOURCE_LIMIT_EXCEEDED,
            "memory",
            f"the agent's container in pod {pod.name} was killed at its memory limit (jobLimits.memoryBytes)",
        )
    status = pod.status
    if status.reason == "DeadlineExceeded":
        return _outcome(
            Reason.TIMED_OUT,
            "",
            f"pod {pod.name} reached its deadline (the job's timeout and the setup margin){_said(status.message)}",
        )
    disruption = pod.condition("DisruptionTarget")
    if disruption is not None and disruption.status == "True":
        cause = disruption.reason or "DisruptionTarget"
        return _outcome(
            Reason.JOB_POD_LOST, cause, f"pod {pod.name} is being taken away: {cause}{_said(disruption.message)}"
        )
    if pod.metadata.deletion_timestamp is not None:  # deleted (kubectl, a controller): gone within its grace
        return _outcome(Reason.JOB_POD_LOST, "Deleted", f"pod {pod.name} was deleted while the job was running")
    if status.reason in _LOST_REASONS or (status.phase == "Failed" and status.reason):
        return _outcome(
            Reason.JOB_POD_LOST, status.reason, f"pod {pod.name} failed: {status.reason}{_said(status.message)}"
        )
    for container in status.container_statuses:
        waiting, terminated = container.state.waiting, container.state.terminated
        if waiting is not None and waiting.reason in CANNOT_START_REASONS:
            why, said = waiting.reason, waiting.message
        elif terminated is not None and terminated.reason in CANNOT_RUN_REASONS:
            why, said = terminated.reason, terminated.message
        else:
            continue
        return _outcome(
            Reason.JOB_POD_FAILED, why, f"container {container.name} of pod {pod.name} cannot start: {why}{_said(said)}"
        )
    return None


def decide_start_timeout(*, pod: PodView, seconds: int) -> JobPodOutcome:
    """Why ``pod``, not started ``seconds`` after it was made the job's, has not: the job's failure."""
    scheduled = pod.condition("PodScheduled")
    if scheduled is not None and scheduled.status == "False":
        cause = scheduled.reason or "Unschedulable"
        why = f"pod {pod.name} was not scheduled within {seconds} s (execution.startTimeoutSeconds)"
        return _outcome(Reason.JOB_POD_FAILED, cause, why + _said(scheduled.message))
    waiting = [
        f"container {c.name} {c.state.waiting.reason}"
        for c in pod.status.container_statuses
        if c.state.waiting is not None
    ]
    now = ", ".join(waiting) if waiting else f"phase {pod.status.phase or 'Pending'}"
    return _outcome(
        Reason.JOB_POD_FAILED,
        "StartTimeout",
        f"pod {pod.name} did not start within {seconds} s (execution.startTimeoutSeconds): {now}",
    )

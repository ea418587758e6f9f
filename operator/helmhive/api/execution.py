"""Where a RunnerPool's jobs run: ``spec.execution``. Pure.

Owns :class:`ExecutionSpec` (``mode``, ``warmPods``, ``runtimeClassName``, ``startTimeoutSeconds``) and
its rules across the pool's other fields (:data:`EXECUTION_RULES` in CEL, :func:`decide_execution_problems`
in Python, with the same messages, each starting with the field it is about):

- ``mode: JobPod`` needs ``credentialIsolation`` Proxy, as the pool runs with it (set, or the default
  for an API key with a known upstream, :func:`helmhive.api.egress.decide_isolation`): the provider
  credential stays in the runner and never enters the job pod.
- ``warmPods`` above 0, ``runtimeClassName`` and ``startTimeoutSeconds`` need ``mode: JobPod`` (a runner
  pod takes none of them).

The job pod's contract (containers, ports, paths, labels) is :mod:`helmhive.api.jobpod`; the objects
the operator writes for it are :mod:`helmhive.policy.jobpods`.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from helmhive.api.common import ApiModel, Name
from helmhive.api.egress import PROVIDER_EGRESS, CredentialIsolation

__all__ = [
    "DEFAULT_START_TIMEOUT_SECONDS",
    "EXECUTION_RULES",
    "MAX_WARM_PODS",
    "ExecutionMode",
    "ExecutionSpec",
    "decide_execution_problems",
]

MAX_WARM_PODS = 20
DEFAULT_START_TIMEOUT_SECONDS = 300
"""How long a job's pod may take to be scheduled and started, unless the pool says: long enough for a
cluster autoscaler to add a node and for a large image to be pulled."""


class ExecutionMode(enum.StrEnum):
    """Where each job's agent runs."""

    IN_RUNNER = "InRunner"
    """A sandboxed process inside the long-lived runner pod (the launcher's limits, docs/security.md)."""
    JOB_POD = "JobPod"
    """A Pod of its own per job, written by the operator (:mod:`helmhive.api.jobpod`)."""


class ExecutionSpec(ApiModel):
    """Where the pool's jobs run: in the runner pod, or each in a Pod of its own."""

    mode: Annotated[
        ExecutionMode,
        Field(
            description=(
                "InRunner (default): each job's agent runs as a sandboxed process inside the runner pod. JobPod: "
                "each job runs in a Pod of its own, which the job's runner drives: it claims one of the pool's warm "
                "pods or creates one, and sends the job over an authenticated link to the pod's shim (port 7470). "
                "The pod has two containers (the shim and the agent), restricted Pod Security, no ServiceAccount "
                "token and no provider credential: memory and CPU requests equal to their limits from "
                "jobLimits.memoryBytes and jobLimits.cpuMillicores, and its workspace, home and tmp on one emptyDir "
                "of jobLimits.diskBytes. The operator keeps the pool's link-key Secret (<pool>-jobpod-link, made "
                "once, never rotated by it) and the job pods' NetworkPolicy (helmhive-job-<pool>): it admits only "
                "the pool's runner pods (to the link) and lets the pods reach only them (their proxy, port 7471; no "
                "DNS). A job's pod is owned by its AgentJob and ends at the latest 120 s after the job's "
                "timeoutSeconds (activeDeadlineSeconds). Needs credentialIsolation Proxy: the credential stays in "
                "the runner."
            )
        ),
    ] = ExecutionMode.IN_RUNNER
    warm_pods: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_WARM_PODS,
            description=(
                "With mode JobPod: how many started, unclaimed job pods the operator keeps for the pool (owned by "
                "the pool, labelled helmhive.dev/warm), so that a job claims one instead of waiting for a pod to "
                "start; a claimed pod becomes the job's and the operator starts another. Warm pods that ended and "
                "those beyond the count (also every one, when the pool goes back to InRunner) are deleted, a claimed "
                "one never. 0 (default): each job's pod is created when the job starts."
            ),
        ),
    ] = 0
    runtime_class_name: Annotated[
        Name | None,
        Field(
            description=(
                "With mode JobPod: the RuntimeClass set on every job pod, warm or not (for example gVisor or Kata "
                "Containers, for a stronger boundary around the agent); it must exist when the pods are created. "
                "The runner pods keep the cluster's default runtime. Unset (default): the job pods use it too."
            )
        ),
    ] = None
    start_timeout_seconds: Annotated[
        int | None,
        Field(
            ge=10,
            le=3600,
            description=(
                "With mode JobPod: how long a job's pod may take, from its creation by the job's runner, to be "
                "scheduled and to start its shim. Past it the job fails: JobPodFailed:Unschedulable (with the "
                "scheduler's message) when no node could take the pod, else JobPodFailed:StartTimeout (with what "
                "the pod still waits for); the pod is deleted. A claimed warm pod runs already. A container that "
                "cannot start at all (its image cannot be pulled, ...) fails the job at once, whatever this says. "
                f"Unset (default): {DEFAULT_START_TIMEOUT_SECONDS} s."
            ),
        ),
    ] = None

    @property
    def start_timeout(self) -> int:
        """``startTimeoutSeconds``, or its default."""
        return self.start_timeout_seconds or DEFAULT_START_TIMEOUT_SECONDS


_JOB_POD = "has(self.spec.execution) && has(self.spec.execution.mode) && self.spec.execution.mode == 'JobPod'"
_KNOWN = ", ".join(f"'{name}'" for name in PROVIDER_EGRESS)
_PROXY = (
    "(has(self.spec.credentialIsolation) ? self.spec.credentialIsolation == 'Proxy' : "
    "(!has(self.spec.credential.volume) && ((has(self.spec.egress) && has(self.spec.egress.upstream)) "
    f"|| self.spec.provider in [{_KNOWN}])))"
)
"""The pool runs with Proxy: it says so, or it says nothing and :func:`~helmhive.api.egress.decide_isolation`
picks Proxy (an API key, and an upstream set or the provider's own)."""

EXECUTION_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": f"!({_JOB_POD}) || {_PROXY}",
        "message": (
            "spec.execution.mode: JobPod needs credentialIsolation Proxy (set, or the default for an API key whose "
            "upstream is known): the provider credential stays in the runner and never enters the job pod"
        ),
        "fieldPath": ".spec.execution.mode",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": (
            f"({_JOB_POD}) || !has(self.spec.execution) || !has(self.spec.execution.warmPods) "
            "|| self.spec.execution.warmPods == 0"
        ),
        "message": "spec.execution.warmPods: warm pods need mode JobPod (a runner pod runs its jobs itself)",
        "fieldPath": ".spec.execution.warmPods",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": f"({_JOB_POD}) || !has(self.spec.execution) || !has(self.spec.execution.runtimeClassName)",
        "message": "spec.execution.runtimeClassName: a RuntimeClass needs mode JobPod (it applies to job pods only)",
        "fieldPath": ".spec.execution.runtimeClassName",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": f"({_JOB_POD}) || !has(self.spec.execution) || !has(self.spec.execution.startTimeoutSeconds)",
        "message": (
            "spec.execution.startTimeoutSeconds: a job pod's start timeout needs mode JobPod (a runner pod starts "
            "no pod per job)"
        ),
        "fieldPath": ".spec.execution.startTimeoutSeconds",
        "reason": "FieldValueInvalid",
    },
)
"""The RunnerPool's CEL rules for ``spec.execution`` (the object's root rules, like
:data:`helmhive.api.egress.POOL_RULES`): the same checks as :func:`decide_execution_problems`."""


def decide_execution_problems(*, execution: ExecutionSpec, isolation: CredentialIsolation) -> list[str]:
    """Every :data:`EXECUTION_RULES` message ``execution`` breaks, given the isolation the pool runs with."""
    problems = []
    job_pod = execution.mode is ExecutionMode.JOB_POD
    if job_pod and isolation is not CredentialIsolation.PROXY:
        problems.append(EXECUTION_RULES[0]["message"])
    if not job_pod and execution.warm_pods > 0:
        problems.append(EXECUTION_RULES[1]["message"])
    if not job_pod and execution.runtime_class_name is not None:
        problems.append(EXECUTION_RULES[2]["message"])
    if not job_pod and execution.start_timeout_seconds is not None:
        problems.append(EXECUTION_RULES[3]["message"])
    return problems

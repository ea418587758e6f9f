"""Jobs whose runner died: end them with ``RunnerLost``, then re-queue only what is safe to re-run.

A runner that dies mid-job cannot say so. Every few seconds the operator looks at each job
that is assigned and not finished; when its runner is ``Offline`` (its Lease expired) or gone,
the job ends ``Succeeded=False`` / ``RunnerLost``. :func:`helmhive.policy.retry.decide_job_retry`
then decides: a job that may have had side effects is never re-run (and says so); any other job
is re-queued once, by dropping its assignment so the router places it again. Both writes are
conditional on the job's ``resourceVersion``, so a retried handler never ends or re-queues twice.
"""

from __future__ import annotations

from typing import Any

import kopf

from helmhive.api.kinds import kind_by_name
from helmhive.api.reasons import ConditionType, Reason
from helmhive.controller.kube import Conflict, NotFound
from helmhive.controller.runtime import Runtime
from helmhive.policy.conditions import find_condition, set_condition
from helmhive.policy.retry import decide_job_retry

__all__ = ["decide_runner_lost", "register"]

AGENT_JOB = kind_by_name("AgentJob")
RUNNER = kind_by_name("Runner")


def _unfinished_assignment(status: dict[str, Any]) -> bool:
    succeeded = find_condition(status.get("conditions"), ConditionType.SUCCEEDED)
    return bool(status.get("assignment")) and (succeeded is None or succeeded.get("status") == "Unknown")


def decide_runner_lost(runner: dict[str, Any] | None) -> str | None:
    """Why the job's runner counts as lost (a message), or None while it is not. Pure."""
    if runner is None:
        return "its runner no longer exists"
    reported = (runner.get("status") or {}).get("reportedStatus")
    if reported == "Offline":
        return f"runner {runner['metadata']['name']} went Offline (its Lease expired) while the job was assigned to it"
    return None


def _with_conditions(
    status: dict[str, Any], updates: list[tuple[str, bool | None, str, str]], job: dict[str, Any], runtime: Runtime
) -> None:
    conditions = status.get("conditions")
    for ctype, value, reason, message in updates:
        conditions = set_condition(
            conditions,
            type=ctype,
            status=value,
            reason=reason,
            message=message,
            generation=job["metadata"].get("generation"),
            now=runtime.clock(),
        ).conditions
    status["conditions"] = conditions


async def end_lost_job(runtime: Runtime, job: dict[str, Any], message: str, logger: kopf.Logger) -> None:
    meta = job["metadata"]
    status = dict(job.get("status") or {})
    now = runtime.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
    updates: list[tuple[str, bool | None, str, str]] = [
        (ConditionType.SUCCEEDED, False, Reason.RUNNER_LOST, message),
        (ConditionType.READY, False, Reason.RUNNER_LOST, message),
    ]
    if find_condition(status.get("conditions"), ConditionType.RUNNING) is not None:
        updates.append((ConditionType.RUNNING, False, Reason.RUNNER_LOST, message))
    _with_conditions(status, updates, job, runtime)
    result = dict(status.get("result") or {})
    result.update({"outcome": Reason.RUNNER_LOST.value, "completedAt": now})
    result.setdefault("summary", "")
    status["result"] = result
    ended = {**job, "status": status}
    decision = decide_job_retry(job=ended)
    if decision is not None and decision.retry:
        requeued = {k: v for k, v in status.items() if k in ("profile", "observedGeneration")}
        requeued["attempts"] = int(status.get("attempts") or 0) + 1
        requeued["conditions"] = []
        _with_conditions(
            requeued,
            [(ConditionType.ROUTED, None, Reason.RUNNER_LOST, f"{message}; re-queued: {decision.message}")],
            job,
            runtime,
        )
        body = {**job, "status": requeued}
        verdict = "re-queued"
    else:
        why = decision.message if decision is not None else "not re-run"
        body = ended
        for cond in body["status"]["conditions"]:
            if cond["type"] in (ConditionType.SUCCEEDED, ConditionType.READY):
                cond["message"] = f"{message}; not re-run: {why}"[:1024]
        verdict = "ended"
    try:
        await runtime.kube.replace_status(AGENT_JOB, meta["name"], body, meta["namespace"])
    except (Conflict, NotFound):
        return  # someone else wrote first; the next tick sees the new state
    logger.warning("job %s/%s %s: %s", meta["namespace"], meta["name"], verdict, message)
    await runtime.kube.post_event(
        involved=job,
        reason=Reason.RUNNER_LOST,
        message=f"{message} ({verdict})",
        event_type="Warning",
        now=runtime.clock(),
    )


def register(runtime: Runtime) -> None:
    def assigned_unfinished(status: kopf.Status, **_: Any) -> bool:
        return _unfinished_assignment(dict(status))

    @kopf.timer("helmhive.dev", "v1alpha1", "agentjobs", interval=3.0, idle=0.0, when=assigned_unfinished)
    async def watch_runner_alive(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        job = dict(body)
        status = dict(job.get("status") or {})
        assignment = status["assignment"]
        namespace = assignment.get("runnerNamespace") or job["metadata"]["namespace"]
        try:
            runner: dict[str, Any] | None = await runtime.kube.get(RUNNER, assignment["runner"], namespace=namespace)
        except NotFound:
            runner = None
        message = decide_runner_lost(runner)
        if message is None:
            return
        fresh = await runtime.kube.get(AGENT_JOB, job["metadata"]["name"], namespace=job["metadata"]["namespace"])
        if _unfinished_assignment(dict(fresh.get("status") or {})):
            await end_lost_job(runtime, fresh, message, logger)

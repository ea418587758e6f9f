"""A finished job's result: bounded status fields, and the owned artifacts ConfigMap they point to.

:func:`ensure_job_result` splits the accepted answer with
:func:`helmhive.policy.agentjob.results.build_bounded_result` (an implementation's patch is stored
whole, never cut), creates ``<job>-artifacts`` (``-<attempt>`` on a re-run) and returns the
verdict and ``status.result`` to write -- ``ArtifactStoreFailed`` if the ConfigMap could not be
created. For an implementation it adds ``result.patch``, ``result.checks`` and the checks'
reason (``ChecksPassed``, ``ChecksFailed``, ``NoChecks``) for an Event: a failing check does not
fail the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.reasons import Reason
from helmhive.policy.agentjob.results import build_bounded_result
from helmhive.runner.jobs.governed import ImplementationSteps, build_implementation_result
from helmhive.runner.jobs.status import JobEnding
from helmhive.runner.kube import KubeError, RunnerKube
from helmhive.runner.source.checks import build_checks_message, decide_checks_reason
from helmhive.runner.source.patches import PATCH_KEY

__all__ = ["StoredResult", "ensure_job_result"]


@dataclass(frozen=True, kw_only=True)
class StoredResult:
    verdict: JobEnding
    result: dict[str, Any]
    checks_event: tuple[Reason, str] | None = None
    """An implementation's checks: the Event's reason and message."""


async def ensure_job_result(
    *,
    kube: RunnerKube,
    job: Mapping[str, Any],
    text: str,
    document: dict[str, Any] | None,
    turns: int,
    steps: ImplementationSteps | None,
) -> StoredResult:
    """Store the answer (and an implementation's whole patch); the verdict and result to write."""
    attempt = int((job.get("status") or {}).get("attempts") or 0)
    whole = {PATCH_KEY: steps.patch.text} if steps is not None else None
    bounded = build_bounded_result(job=job, text=text, output=document, whole=whole)
    config_map = bounded.config_map
    artifacts = [a.to_wire() for a in bounded.artifacts]
    if config_map is not None:
        if attempt > 0:  # a re-run keeps its own artifacts beside the earlier attempt's
            config_map["metadata"]["name"] = f"{config_map['metadata']['name']}-{attempt}"
            artifacts = [{**a, "name": config_map["metadata"]["name"]} for a in artifacts]
        try:
            await kube.create_config_map(config_map)
        except KubeError as exc:
            why = f"the artifacts ConfigMap {config_map['metadata']['name']} was not created: {exc.message}"
            verdict = JobEnding(succeeded=False, reason=Reason.ARTIFACT_STORE_FAILED, message=why[:1000])
            return StoredResult(verdict=verdict, result={"summary": bounded.summary})
    result: dict[str, Any] = {"summary": bounded.summary, "output": bounded.output, "artifacts": artifacts}
    message = f"the agent answered in {turns} turn(s)" + (" (one repair turn)" if turns > 1 else "")
    event: tuple[Reason, str] | None = None
    if steps is not None and config_map is not None:
        patch_fields, note = build_implementation_result(steps=steps, config_map=config_map["metadata"]["name"])
        result.update(patch_fields)
        message += f"; {note}"
        evidence = steps.checks.evidence
        event = (decide_checks_reason(evidence), build_checks_message(evidence))
    verdict = JobEnding(succeeded=True, reason=Reason.COMPLETED, message=message[:1000])
    return StoredResult(verdict=verdict, result=result, checks_event=event)

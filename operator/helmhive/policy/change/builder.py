"""What one Change decision is built from: the builder, and the ways a decision ends. Pure.

:class:`ChangeBuilder` accumulates one decision of :func:`helmhive.policy.change.decision.decide_change`:
the conditions, the operator's status fields, the audit records of steps that finished, and at
most one AgentJob to create. A decision ends as a stage that failed (:func:`fail_stage`), a stage
under way (:func:`stage_running`) or as it stands (:func:`finish_decision`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from helmhive.api.audit import AuditAction, AuditActor
from helmhive.api.change import ChangeJob, ChangeSpec, ChangeStatus
from helmhive.api.governed import ChangeStage
from helmhive.api.kinds import API_VERSION
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.audit.records import build_audit_record
from helmhive.policy.audit.routing import audit_name
from helmhive.policy.change.jobs import (
    LABEL_CHANGE,
    LABEL_STAGE,
    STAGE_KINDS,
    JobState,
    StageJob,
    build_job_name,
    build_label_value,
)
from helmhive.policy.change.prompts import build_stage_prompt
from helmhive.policy.conditions import set_condition

__all__ = [
    "ChangeBuilder",
    "ChangeDecision",
    "fail_stage",
    "finish_decision",
    "job_status",
    "stage_recorded",
    "stage_running",
]


@dataclass(kw_only=True)
class ChangeDecision:
    """The status to write (operator-owned fields, wire form), the job to create, the audits to record."""

    status: dict[str, Any]
    create: dict[str, Any] | None = None
    audits: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False


@dataclass(kw_only=True)
class ChangeBuilder:
    """Accumulates one decision: conditions, status fields, audits."""

    change: Mapping[str, Any]
    spec: ChangeSpec
    previous: ChangeStatus
    now: dt.datetime
    conditions: list[dict[str, Any]]
    status: ChangeStatus = field(default_factory=ChangeStatus)
    audits: list[dict[str, Any]] = field(default_factory=list)
    create: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return str(self.change["metadata"]["name"])

    def cond(self, ctype: ConditionType, value: bool | None, reason: Reason | str, message: str) -> None:
        self.conditions = set_condition(
            self.conditions,
            type=ctype,
            status=value,
            reason=str(reason),
            message=message,
            generation=self.change["metadata"].get("generation"),
            now=self.now,
        ).conditions

    def audit(self, action: AuditAction, key: str, message: str, details: Mapping[str, str], actor: str = "") -> None:
        """Record a finished step once: only if the previous status did not show it (:func:`stage_recorded`)."""
        meta = self.change["metadata"]
        record = build_audit_record(
            action=action,
            obj={"apiVersion": API_VERSION, "kind": "Change", "metadata": meta},
            actor=AuditActor(username=actor) if actor else AuditActor(username="helmhive-operator"),
            message=message,
            details={k: v[:512] for k, v in details.items() if v},
            now=self.now,
        )
        record["metadata"].pop("generateName", None)
        record["metadata"]["name"] = audit_name(self.name, str(meta.get("uid") or ""), key).replace(
            "agentjob-", "change-", 1
        )
        self.audits.append(record)

    def new_job(self, stage: ChangeStage, iteration: int, **extra: Any) -> None:
        meta = self.change["metadata"]
        name = build_job_name(self.name, stage, iteration)
        prompt = build_stage_prompt(change=self.name, spec=self.spec, stage=stage, iteration=iteration, **extra)
        spec: dict[str, Any] = {
            "workspace": self.spec.workspace,
            "jobKind": STAGE_KINDS[stage].value,
            "request": {"title": f"{self.spec.request.title[:230]} ({stage.value})", "prompt": prompt},
            "source": self.spec.source.to_wire(),
            "change": {"name": self.name, "stage": stage.value, "iteration": iteration},
        }
        if self.spec.service:
            spec["service"] = self.spec.service
        if stage is ChangeStage.IMPLEMENTATION and self.spec.checks:
            spec["checks"] = [c.to_wire() for c in self.spec.checks]
        if stage is ChangeStage.REVIEW and self.status.patch is not None:
            spec["patch"] = self.status.patch.to_wire()
        self.create = {
            "apiVersion": API_VERSION,
            "kind": "AgentJob",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {
                    LABEL_CHANGE: build_label_value(self.name),
                    LABEL_STAGE: stage.value,
                    "app.kubernetes.io/managed-by": "helmhive-operator",
                },
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": "Change",
                        "name": self.name,
                        "uid": meta.get("uid"),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }


def stage_recorded(previous: ChangeStatus, job: StageJob) -> bool:
    """The previous status already shows this job's outcome (so its audit was already recorded)."""
    return any(j.name == job.name and j.outcome for j in previous.jobs)


def job_status(job: StageJob) -> ChangeJob:
    done = job.state is not JobState.RUNNING
    return ChangeJob(
        stage=job.stage,
        iteration=job.iteration,
        name=job.name,
        provider=job.provider,
        model=job.model,
        outcome=job.reason[:160] if done and job.reason else None,
        pod=job.pod,
    )


def fail_stage(b: ChangeBuilder, job: StageJob, ctype: ConditionType, ready_reason: Reason) -> ChangeDecision:
    why = f"{job.stage.value} job {job.name} ended {job.reason}: {job.message}"[:1024]
    b.cond(ctype, False, job.reason.split(":", 1)[0] or Reason.STAGE_FAILED, why)
    b.cond(ConditionType.READY, False, ready_reason, why)
    if not stage_recorded(b.previous, job):
        b.audit(
            AuditAction.CHANGE_STAGE_FAILED,
            f"{job.stage.value}-{job.iteration}-failed",
            why,
            {"stage": job.stage.value, "iteration": str(job.iteration), "job": job.name, "reason": job.reason},
        )
    return finish_decision(b, finished=True)


def finish_decision(b: ChangeBuilder, *, finished: bool = False) -> ChangeDecision:
    status = b.status.to_wire()
    status["conditions"] = b.conditions
    status["observedGeneration"] = b.change["metadata"].get("generation")
    return ChangeDecision(status=status, create=b.create, audits=b.audits, finished=finished)


def stage_running(
    b: ChangeBuilder, ctype: ConditionType, stage: ChangeStage, name: str, created: bool
) -> ChangeDecision:
    what = f"{stage.value} job {name} " + ("created" if created else "is queued or running")
    b.cond(ctype, None, Reason.STAGE_RUNNING, what)
    b.cond(ConditionType.READY, False, Reason.STAGE_RUNNING, what)
    return finish_decision(b)

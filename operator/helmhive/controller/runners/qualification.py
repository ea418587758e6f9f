"""Runs a pool's qualification probes: decides each runner's round, creates its probe jobs, audits the end.

The pool's loop applies the pool's qualification Workspace and Profiles
(:func:`ensure_qualification_objects`), and for each runner it derives
(:mod:`helmhive.controller.runners.derived`) calls :func:`decide_runner_qualification` with what
the operator holds in memory: the runner's probe jobs and how many jobs hold its slots (the AgentJob store,
:meth:`~helmhive.policy.routing.job_store.JobStore.probes_of`), and whether a job waits for one of
those slots (the router, :attr:`~helmhive.controller.runtime.Runtime.slot_waited_for`). No API
read. It creates a due probe job that its store does not show (:func:`ensure_probe_job`, apart from
the status write, so a refused create never holds the status back), audits a round that ended
before the status that shows it (:func:`ensure_round_audit`), and after the write deletes the jobs
an older round left (:func:`patch_old_probes`). The decisions are :mod:`helmhive.policy.runners.qualification`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kopf

from helmhive.api.audit import AuditAction, AuditState
from helmhive.api.kinds import kind_by_name
from helmhive.api.qualification import ProbeOutcome
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.door import Kube, KubeError
from helmhive.controller.runners.parsed import ParsedRunner
from helmhive.controller.runtime import Runtime
from helmhive.policy.audit.records import build_audit_record
from helmhive.policy.runners.pool import PoolRef
from helmhive.policy.runners.probes import build_probe_job, build_qualification_objects, qualification_object_names
from helmhive.policy.runners.qualification import (
    ProbeJobView,
    QualificationDecision,
    QualificationFacts,
    decide_qualification,
)
from helmhive.policy.runners.state import PoolFacts, RunnerDerived
from helmhive.policy.runners.status import decide_registration

__all__ = [
    "QUALIFICATION_NONE",
    "decide_runner_qualification",
    "ensure_probe_job",
    "ensure_qualification_objects",
    "ensure_round_audit",
    "patch_old_probes",
]

AGENT_JOB = kind_by_name("AgentJob")


def _digest(objects: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()


QUALIFICATION_NONE = _digest([])
"""The digest of "no qualification objects": where a pool's loop starts."""


async def ensure_qualification_objects(
    kube: Kube, pool: PoolRef, spec: RunnerPoolSpec, *, applied: str | None, logger: kopf.Logger
) -> str | None:
    """Apply the pool's qualification Workspace and Profiles when they changed, delete those no longer wanted.

    Returns the digest applied (None: a request failed, try again next pass). Kept apart from the
    pool's own objects: a failure here (say, a Profile refused by admission) leaves the runner pods
    alone, and only the qualification jobs wait for them. A loop starts from :data:`QUALIFICATION_NONE`,
    so a pool without probes costs no request; qualification removed while the operator was down
    leaves its objects until the pool is deleted (they are owned by it).
    """
    qualification = spec.qualification
    objects = build_qualification_objects(pool, qualification, provider=spec.provider) if qualification else []
    digest = _digest(objects)
    if digest == applied:
        return digest
    try:
        for obj in objects:
            await kube.apply_custom(kind_by_name(obj["kind"]), obj, pool.namespace)
        wanted = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
        for kind, name in qualification_object_names(pool.name):
            if (kind, name) not in wanted:
                await kube.delete(kind_by_name(kind), name, namespace=pool.namespace)
    except KubeError as err:
        logger.warning("pool %s: qualification objects not applied (will retry): %s", pool.name, err.message)
        return None
    return digest


def decide_runner_qualification(
    runtime: Runtime, view: ParsedRunner, derived: RunnerDerived, facts: PoolFacts, now: dt.datetime
) -> QualificationDecision | None:
    """The runner's qualification, when its pool names probes or its status still holds a record."""
    if facts.qualification is None and view.status.qualification is None:
        return None
    key = (view.namespace, view.name)
    report = view.status.report
    store = runtime.job_store.store
    qualification = QualificationFacts(
        runner=view.name,
        registered_at=decide_registration(view.status, report) if report is not None else None,
        credential_generation=facts.credential_generation,
        stored=view.status.qualification,
        jobs=store.probes_of(key),
        may_start=False,
    )
    decision = decide_qualification(spec=facts.qualification, facts=qualification, now=now)
    if not decision.wants_slot or not derived.is_schedulable:
        return decision
    # A probe is due: it may start on a free slot no user job waits for (asked only now: the
    # router's waiting jobs are scanned for this runner alone).
    concurrency = report.concurrency if report is not None else 0
    held = runtime.slots_held(key) if runtime.slots_held is not None else store.counts_by_runner.get(key, 0)
    if held >= concurrency or runtime.slot_waited_for(key):
        return decision
    return decide_qualification(
        spec=facts.qualification, facts=dataclasses.replace(qualification, may_start=True), now=now
    )


def _round_record(view: ParsedRunner, decision: QualificationDecision, pool: str, now: dt.datetime) -> dict[str, Any]:
    """The audit record of a round that just ended (``RunnerQualified`` or ``RunnerQualificationFailed``)."""
    record = decision.record
    assert record is not None and decision.ended is not None
    details = {"pool": pool, "round": str(record.round), "credentialGeneration": str(record.credential_generation)}
    for probe in record.probes:
        if probe.job:
            outcome = f"{probe.job}: {probe.outcome.value}" + (f" ({probe.reason})" if probe.reason else "")
            details[probe.kind.value] = outcome[:256]
    return build_audit_record(
        action=decision.ended,
        obj=view.ref,
        after=AuditState(value=record.state.value),
        message=f"runner {view.name}: {decision.message}"[:1024],
        details=details,
        now=now,
    )


async def ensure_probe_job(
    kube: Kube, view: ParsedRunner, *, pool: PoolRef, decision: QualificationDecision, facts: PoolFacts
) -> None:
    """Create the probe job the decision starts; one that exists already (an earlier pass's) is left as it is."""
    start, record, spec = decision.start, decision.record, facts.qualification
    if start is None or start.job is None or record is None or spec is None:
        return
    body = build_probe_job(
        pool=pool,
        runner=view.name,
        runner_uid=view.uid,
        kind=start.kind,
        name=start.job,
        round_=record.round,
        timeout_seconds=spec.timeout_seconds,
    )
    try:
        await kube.create(AGENT_JOB, body, namespace=view.namespace)
    except KubeError as err:
        if err.status != 409:
            raise


async def ensure_round_audit(
    kube: Kube, view: ParsedRunner, *, pool: PoolRef, decision: QualificationDecision, now: dt.datetime
) -> None:
    """Audit a round that just ended (before the status that shows it is written)."""
    if decision.ended is None or decision.record is None:
        return
    failed = decision.ended is AuditAction.RUNNER_QUALIFICATION_FAILED
    await ensure_audit_unless_terminating(
        kube,
        _round_record(view, decision, pool.name, now),
        involved=view.ref,
        event_reason=decision.ended.value,
        event_type="Warning" if failed else "Normal",
        now=now,
    )


async def patch_old_probes(
    kube: Kube, view: ParsedRunner, decision: QualificationDecision, jobs: Mapping[str, ProbeJobView]
) -> None:
    """Delete the runner's probe jobs of rounds before the previous one, and the unfinished ones of any earlier round.

    A new round (a new registration or credential) supersedes what an earlier one still runs; the
    audit trail keeps every round's outcome.
    """
    record = decision.record
    if record is None:
        return
    for name, job in list(jobs.items()):
        unfinished = job.outcome in (ProbeOutcome.PENDING, ProbeOutcome.RUNNING)
        if job.round < record.round - 1 or (job.round < record.round and unfinished):
            await kube.delete(AGENT_JOB, name, namespace=view.namespace)

"""The audit trail of routing decisions: one entry per decision, many entries per record. Pure.

One decision about one run of a job gives at most two *entries* (:class:`~helmhive.api.audit.AuditDecision`),
built from what the job's status says was written:

- ``JobRouted``: runner, pool, provider, model and its source, effort, mapping, credential
  generation, profile revision, memory count, avoided provider;
- ``MemoryInjected``, *selected at queue time*: the MemoryRecord names routing chose, when there
  are any (``after`` and the message say "selected at queue time");
- ``JobRoutingFailed``: the reason, for a job that failed closed.

A job still waiting for capacity has none yet. Entries are written in batches: one
``RoutingDecisions`` AuditRecord per namespace holds up to :data:`MAX_DECISIONS` of them (and at
most :data:`MAX_BATCH_BYTES` of JSON), so a routed job costs a fraction of a write. The record:

- is named from a hash of its entries' keys (``routing-<hash>``), so a create retried with the
  same batch is a harmless 409;
- carries one label per job, ``job.audit.helmhive.dev/<job uid>`` (a label key's name part is at
  most 63 characters: a uid fits, a job name may not), so ``kubectl get auditrecords -l
  job.audit.helmhive.dev/<uid>`` finds every record holding one of that job's decisions;
- carries the UTC hour it was built in, ``helmhive.dev/audit-hour: YYYYMMDDHH``
  (:func:`routing_hour`), so a restarted operator lists only the batches of the last hours
  (:func:`decide_recovery_selector`) and diffs them against its recently decided jobs in memory
  (:func:`held_decision_keys`, :func:`decide_missing_entries`): one LIST per namespace, not one
  per job.

:func:`iter_routing_decisions` flattens records back to one spec per decision, for readers (the
CLI, the benchmarks, the tests). What the runner then injected at run time is a per-job
``MemoryInjected`` record (:mod:`helmhive.policy.memory.injected`), named by :func:`audit_name`. Names
and hashes only: nothing here copies instructions, memory text or any credential.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from typing import Any

from helmhive.api.audit import MAX_DECISIONS, AuditAction, AuditDecision, AuditObject, AuditState
from helmhive.api.kinds import API_VERSION
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.agentjob.state import AgentJob, parse_agent_job
from helmhive.policy.audit.records import LABEL_ACTION, build_audit_record, check_audit_details

__all__ = [
    "HOUR_LABEL",
    "JOB_LABEL_PREFIX",
    "MAX_BATCH_BYTES",
    "MAX_DECISIONS",
    "DecisionKey",
    "audit_name",
    "build_routing_batch",
    "build_routing_decisions",
    "decide_batches",
    "decide_missing_entries",
    "decide_recovery_selector",
    "decision_key",
    "held_decision_keys",
    "iter_routing_decisions",
    "job_audit_label",
    "routing_hour",
]

JOB_LABEL_PREFIX = "job.audit.helmhive.dev/"
HOUR_LABEL = "helmhive.dev/audit-hour"
MAX_RECOVERY_HOURS = 48  # past this many hour values, the selector lists every batch of the namespace
MAX_BATCH_BYTES = 256 * 1024  # well under the API server's 1.5 MB object limit
DecisionKey = tuple[str, int, str]  # (job uid, attempt, action)


def audit_name(job_name: str, uid: str, suffix: str, attempt: int = 0) -> str:
    """The AuditRecord name for one kind of per-job record about one run of one job.

    Routing decisions are batched (:func:`build_routing_batch`); the run-time ``MemoryInjected``
    record still has one record per run under this name. A job re-queued after its runner was lost
    (``status.attempts`` > 0) gets ``-<attempt>`` appended from the first re-run on.
    """
    base = f"agentjob-{job_name[:200]}-{uid[:8]}-{suffix}"
    return base if attempt <= 0 else f"{base}-{attempt}"


def job_audit_label(uid: str) -> str:
    """The label key on every ``RoutingDecisions`` record that holds a decision about the job ``uid``."""
    return f"{JOB_LABEL_PREFIX}{uid[:63]}"


def _decided_at(routing: Mapping[str, Any], now: dt.datetime) -> dt.datetime:
    raw = routing.get("decidedAt")
    if raw:
        try:
            return dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        except ValueError:
            pass
    return now


def _entry(
    *,
    action: AuditAction,
    ref: AuditObject,
    attempt: int,
    when: dt.datetime,
    after: str,
    message: str,
    details: dict[str, str],
) -> dict[str, Any]:
    check_audit_details(details)
    return AuditDecision(
        action=action,
        object=ref,
        attempt=attempt,
        time=when,
        after=AuditState(value=after[:256]),
        message=message[:1024],
        details=details,
    ).to_wire()


def build_routing_decisions(*, job: Mapping[str, Any] | AgentJob, now: dt.datetime) -> list[dict[str, Any]]:
    """The decision entries for ``job`` (an object, or one read by ``parse_agent_job``) as its status
    now stands (none while it waits)."""
    state = job if isinstance(job, AgentJob) else parse_agent_job(job)
    status = state.raw_status
    name, uid = state.name, state.uid
    ref = AuditObject(api_version=API_VERSION, kind="AgentJob", namespace=state.namespace or None, name=name, uid=uid)
    routed = state.condition(ConditionType.ROUTED) or {}
    message = str(routed.get("message") or "")
    routing = status.get("routing") or {}
    when = _decided_at(routing, now)
    assignment = status.get("assignment")
    attempt = state.attempts
    if assignment:
        memory_ids = [str(m) for m in assignment.get("memoryIds") or []]
        details = {
            "runner": str(assignment.get("runner", "")),
            "runnerNamespace": str(assignment.get("runnerNamespace") or state.namespace),
            "pool": str(assignment.get("pool", "")),
            "provider": str(assignment.get("provider", "")),
            "model": str(assignment.get("model", "")),
            "modelSource": str(assignment.get("modelSource", "")),
            "mappingIndex": str(assignment.get("mappingIndex", "")),
            "credentialGeneration": str(assignment.get("credentialGeneration", 0)),
            "profileRevision": str((status.get("profile") or {}).get("revision", ""))[:512],
            "memoryCount": str(len(memory_ids)),
        }
        if assignment.get("reasoningEffort"):
            details["reasoningEffort"] = str(assignment["reasoningEffort"])
        if routing.get("avoidedProvider"):
            details["avoidedProvider"] = str(routing["avoidedProvider"])
        entries = [
            _entry(
                action=AuditAction.JOB_ROUTED,
                after=f"{details['provider']}/{details['model']}",
                message=message,
                details=details,
                ref=ref,
                attempt=attempt,
                when=when,
            )
        ]
        if memory_ids:
            entries.append(
                _entry(
                    action=AuditAction.MEMORY_INJECTED,
                    after=f"{len(memory_ids)} records selected at queue time",
                    message=(
                        f"memory records selected at queue time: {', '.join(memory_ids)} "
                        "(the runner re-checks each when the job starts; its report is the "
                        f"{audit_name(name, uid, 'memory-run', attempt)} record)"
                    ),
                    details={
                        "memoryIds": ",".join(memory_ids)[:512],
                        "workspace": str(state.raw_spec.get("workspace", "")),
                    },
                    ref=ref,
                    attempt=attempt,
                    when=when,
                )
            )
        return entries
    reason = str(routed.get("reason") or "")
    if routed.get("status") == "False" and reason != Reason.WAITING_FOR_CAPACITY.value and routing:
        return [
            _entry(
                action=AuditAction.JOB_ROUTING_FAILED,
                after=reason,
                message=message,
                details={"reason": reason[:512], "consideredRunners": str(routing.get("consideredRunners", 0))},
                ref=ref,
                attempt=attempt,
                when=when,
            )
        ]
    return []


def decision_key(entry: Mapping[str, Any]) -> DecisionKey:
    """What makes an entry unique: the job's uid, the attempt and the action."""
    return (str((entry.get("object") or {}).get("uid") or ""), int(entry.get("attempt") or 0), str(entry["action"]))


def decide_batches(
    entries: Sequence[Mapping[str, Any]], *, max_count: int = MAX_DECISIONS, max_bytes: int = MAX_BATCH_BYTES
) -> list[list[Mapping[str, Any]]]:
    """Split ``entries`` (in order) into batches of at most ``max_count`` entries and ``max_bytes`` of JSON.

    A job's entries of one decision stay in one batch when they fit, so a job's label points
    at every record its decision needs.
    """
    batches: list[list[Mapping[str, Any]]] = []
    current: list[Mapping[str, Any]] = []
    size = 0
    for entry in entries:
        cost = len(json.dumps(entry, separators=(",", ":"))) + 64  # plus its label
        if current and (len(current) >= max(1, max_count) or size + cost > max_bytes):
            batches.append(current)
            current, size = [], 0
        current.append(entry)
        size += cost
    if current:
        batches.append(current)
    return batches


def build_routing_batch(*, namespace: str, entries: Sequence[Mapping[str, Any]], now: dt.datetime) -> dict[str, Any]:
    """One ``RoutingDecisions`` AuditRecord in ``namespace`` holding ``entries`` (see the module docstring)."""
    keys = sorted({decision_key(e) for e in entries})
    digest = hashlib.sha256("\n".join(f"{u}/{a}/{act}" for u, a, act in keys).encode()).hexdigest()[:20]
    jobs = {str((e.get("object") or {}).get("uid") or ""): e for e in entries}
    record = build_audit_record(
        action=AuditAction.ROUTING_DECISIONS,
        obj={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        after=AuditState(value=f"{len(entries)} decisions about {len(jobs)} jobs"),
        message=f"{len(entries)} routing decisions about {len(jobs)} jobs",
        details={"decisions": str(len(entries)), "jobs": str(len(jobs))},
        now=now,
        namespace=namespace,
    )
    record["spec"]["decisions"] = [dict(e) for e in entries]
    meta = record["metadata"]
    meta.pop("generateName", None)
    meta["name"] = f"routing-{digest}"
    meta["labels"][HOUR_LABEL] = routing_hour(now)
    for uid, entry in jobs.items():
        if uid:
            outcome = str(entry["action"]) if entry["action"] != AuditAction.MEMORY_INJECTED else "JobRouted"
            meta["labels"][job_audit_label(uid)] = outcome
    return record


def iter_routing_decisions(records: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every routing decision in ``records``, one ``{"metadata", "spec"}`` each, shaped as a per-decision record.

    A ``RoutingDecisions`` record gives one item per entry (its ``actor`` and the record's
    metadata added); any other record is passed through as it is.
    """
    for record in records:
        spec = record.get("spec") or {}
        if spec.get("action") != AuditAction.ROUTING_DECISIONS.value:
            yield dict(record)
            continue
        for entry in spec.get("decisions") or []:
            yield {"metadata": dict(record.get("metadata") or {}), "spec": {**entry, "actor": spec.get("actor")}}


# Recovery after a restart ---------------------------------------------------------------------------


def routing_hour(when: dt.datetime) -> str:
    """The ``helmhive.dev/audit-hour`` label value of a batch built at ``when``: its UTC hour, ``YYYYMMDDHH``."""
    return when.astimezone(dt.UTC).strftime("%Y%m%d%H")


def decide_recovery_selector(*, since: dt.datetime, until: dt.datetime) -> str:
    """The label selector of the ``RoutingDecisions`` batches built between ``since`` and ``until``.

    By the hour they were built in (:data:`HOUR_LABEL`), both ends included; a span of more than
    :data:`MAX_RECOVERY_HOURS` hours selects every batch (a longer recovery window is listed whole).
    Batches written before the label existed are not selected: their decisions are recorded again
    (twice, never zero times).
    """
    first = since.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    last = until.astimezone(dt.UTC)
    hours: list[str] = []
    while first <= last and len(hours) <= MAX_RECOVERY_HOURS:
        hours.append(routing_hour(first))
        first += dt.timedelta(hours=1)
    selector = f"{LABEL_ACTION}={AuditAction.ROUTING_DECISIONS.value}"
    if not hours or len(hours) > MAX_RECOVERY_HOURS:
        return selector
    return f"{selector},{HOUR_LABEL} in ({','.join(hours)})"


def held_decision_keys(records: Iterable[Mapping[str, Any]]) -> set[DecisionKey]:
    """The decisions ``records`` hold (``RoutingDecisions`` batches; other records hold none)."""
    held: set[DecisionKey] = set()
    for record in records:
        spec = record.get("spec") or {}
        if spec.get("action") == AuditAction.ROUTING_DECISIONS.value:
            held.update(decision_key(entry) for entry in spec.get("decisions") or [])
    return held


def decide_missing_entries(
    entries: Iterable[Mapping[str, Any]], held: Container[DecisionKey]
) -> list[Mapping[str, Any]]:
    """The entries whose decision ``held`` does not have: the ones a crash cut off, to record again."""
    return [entry for entry in entries if decision_key(entry) not in held]

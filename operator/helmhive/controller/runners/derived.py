"""Keeps each Runner's derived status current: the operator's share of ``status``, never ``report``.

Two Kopf indexes hold what the derivation needs without any API reads: every Runner by
``(namespace, pool)``, parsed once per watch event, and every runner Lease (label
``helmhive.dev/runner``, filtered on the server) by ``(namespace, name)``.

Event-driven, not polled: :class:`RunnerWakes` marks a runner for re-derivation when its
Runner changes or is deleted, and when its Lease is deleted or changes anything but
``renewTime`` (holder, duration, report digest) -- a plain renewal wakes nothing. The pool's
loop (:mod:`helmhive.controller.runners.pools`) derives the marked runners, plus those whose
``review_at`` (Lease expiry, ``verifiedAt`` passing the bound, a digest disagreement outlasting
the grace) has come: one scheduled wake per runner at a known instant.

A Runner is written only when the derived status differs from the stored one. Every
transition is audited before the status that shows it is written (at least once). Writes
are server-side apply of the status subresource with field manager ``helmhive-operator``;
the runner owns ``status.report`` under ``helmhive-runner``, so neither overwrites the other.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from helmhive.api.audit import AuditAction, AuditActor, AuditState
from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.runner import REPORT_DIGEST_ANNOTATION, ReportedStatus
from helmhive.controller.audit import ensure_audit_unless_terminating
from helmhive.controller.kube.contact import run_contact_probe
from helmhive.controller.kube.door import Kube, KubeError
from helmhive.controller.runners.parsed import ParsedRunner, parse_runner_body
from helmhive.controller.runners.qualification import (
    decide_runner_qualification,
    ensure_probe_job,
    ensure_round_audit,
    patch_old_probes,
)
from helmhive.controller.runners.wakes import RunnerWakes
from helmhive.controller.runtime import Runtime
from helmhive.policy.audit.records import build_audit_record
from helmhive.policy.runners.pool import PoolRef, build_owner_reference, runner_resource_name
from helmhive.policy.runners.qualification import QualificationDecision, apply_qualification
from helmhive.policy.runners.state import HeartbeatHold, LeaseView, PoolFacts, RunnerDerived, decide_runner_status
from helmhive.policy.runners.status import RunnerTransition, build_runner_status, decide_runner_transitions

__all__ = [
    "RUNNER",
    "RUNNER_LABEL",
    "ParsedRunner",
    "RunnerPatchResult",
    "RunnerWakes",
    "WriteMemo",
    "build_lease_view",
    "parse_runner_body",
    "register",
]

RUNNER = kind_by_name("Runner")
RUNNER_LABEL = "helmhive.dev/runner"
_WRITERS = 4  # concurrent runner writes per pool tick
_WARNING_ACTIONS = {AuditAction.RUNNER_REVOKED}


def _parse_time(raw: Any) -> dt.datetime | None:
    if not raw:
        return None
    try:
        return dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None


def build_lease_view(
    spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None, *, digest_since: dt.datetime | None = None
) -> LeaseView:
    """The Lease's holder, renew time (or acquire time), duration and report digest (first seen at ``digest_since``)."""
    return LeaseView(
        holder=spec.get("holderIdentity"),
        renew_time=_parse_time(spec.get("renewTime") or spec.get("acquireTime")),
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        digest=(annotations or {}).get(REPORT_DIGEST_ANNOTATION),
        digest_since=digest_since,
    )


@dataclass
class WriteMemo:
    """What this process last wrote per object, so a watch that lags behind does not cause a rewrite.

    An entry says: "when the stored object had resourceVersion R, we wrote W". While the
    index still shows R, the write is in flight through the watch and is not repeated.
    Entries expire, so a write that changed nothing cannot block the next one for long.
    """

    ttl: float = 10.0
    entries: dict[str, tuple[str, float]] = field(default_factory=dict)

    def pending(self, key: str, resource_version: str, *, now: float) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry[0] == resource_version and now - entry[1] < self.ttl

    def record(self, key: str, resource_version: str, *, now: float) -> None:
        self.entries[key] = (resource_version, now)

    def forget_except(self, keys: Iterable[str]) -> None:
        keep = set(keys)
        for key in [k for k in self.entries if k not in keep]:
            del self.entries[key]


def _audit_record(view: ParsedRunner, transition: RunnerTransition, pool: str, now: dt.datetime) -> dict[str, Any]:
    details: dict[str, str] = {"pool": pool}
    actor = None
    report = view.status.report
    if transition.action is AuditAction.RUNNER_REGISTERED and report is not None:
        actor = AuditActor(username=f"system:serviceaccount:{view.namespace}:{runner_resource_name(pool)}")
        details |= {
            "pod": report.pod_name,
            "provider": report.provider,
            "adapterVersion": report.adapter.version[:64],
            "credentialGeneration": str(report.credential_generation),
        }
    elif view.control_state_set_by and transition.action is not AuditAction.RUNNER_STATUS_CHANGED:
        details["setBy"] = view.control_state_set_by[:128]
    kwargs: dict[str, Any] = {"actor": actor} if actor is not None else {}
    return build_audit_record(
        action=transition.action,
        obj=view.ref,
        before=AuditState(value=transition.before) if transition.before else None,
        after=AuditState(value=transition.after) if transition.after else None,
        message=transition.message,
        details=details,
        now=now,
        **kwargs,
    )


async def _write_runner(
    kube: Kube,
    view: ParsedRunner,
    *,
    pool: PoolRef,
    derived: RunnerDerived,
    status: dict[str, Any],
    now: dt.datetime,
    logger: kopf.Logger,
    qualification: QualificationDecision | None = None,
) -> None:
    """Audit the transitions (a qualification round's end too), then apply the operator's status fields
    (and adopt the Runner)."""
    if qualification is not None:
        await ensure_round_audit(kube, view, pool=pool, decision=qualification, now=now)
        if qualification.ended is not None:
            logger.info("runner %s: %s", view.name, qualification.message)
    for transition in decide_runner_transitions(name=view.name, observed=view.status, derived=derived):
        record = _audit_record(view, transition, pool.name, now)
        event_type = "Warning" if transition.action in _WARNING_ACTIONS else "Normal"
        await ensure_audit_unless_terminating(
            kube, record, involved=view.ref, event_reason=transition.action.value, event_type=event_type, now=now
        )
        logger.info("%s", transition.message)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Runner", "metadata": {"name": view.name}, "status": status}
    await kube.apply_custom(RUNNER, body, view.namespace, status=True)
    if pool.uid not in view.owner_uids:
        adopt = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Runner",
            "metadata": {"name": view.name, "ownerReferences": [build_owner_reference(pool)]},
        }
        await kube.apply_custom(RUNNER, adopt, view.namespace)


def _heartbeat_hold(
    runtime: Runtime, lease: LeaseView | None, stored: ReportedStatus | None, *, now: dt.datetime
) -> HeartbeatHold | None:
    """The hold on Offline verdicts from heartbeat age while contact with the API server is lost or new."""
    if lease is None:
        return None
    left = runtime.contact.hold_left(
        lease_duration_s=lease.duration_seconds, grace_s=runtime.config.runner_grace_seconds
    )
    if left is None:
        return None
    return HeartbeatHold(until=None if math.isinf(left) else now + dt.timedelta(seconds=left), stored=stored)


@dataclass(frozen=True, kw_only=True)
class RunnerPatchResult:
    """What :func:`patch_runners` derived, and which runners need another look soon (a write to retry)."""

    derived: dict[str, RunnerDerived]
    retry: set[str]
    wants_slot: set[str] = field(default_factory=set)
    """Runners whose due probe waits for a free slot (look again when one frees)."""


async def _start_probes(
    kube: Kube,
    *,
    pool: PoolRef,
    facts: PoolFacts,
    starts: list[tuple[ParsedRunner, QualificationDecision]],
    gate: asyncio.Semaphore,
    logger: kopf.Logger,
) -> set[str]:
    """Create the due probe jobs the store does not show, whether or not the status changed (a deleted
    one is made again); returns the runners whose create failed (their status is still written)."""
    failed: set[str] = set()

    async def start(view: ParsedRunner, decision: QualificationDecision) -> None:
        async with gate:
            try:
                await ensure_probe_job(kube, view, pool=pool, decision=decision, facts=facts)
            except KubeError as err:
                logger.warning("runner %s/%s: probe job not created (will retry): %s", view.namespace, view.name, err)
                failed.add(view.name)

    await asyncio.gather(*(start(*item) for item in starts))
    return failed


async def patch_runners(
    *,
    runtime: Runtime,
    pool: PoolRef,
    facts: PoolFacts,
    runners: Iterable[ParsedRunner],
    leases: Mapping[tuple[str, str], Iterable[LeaseView]],
    memo: WriteMemo,
    logger: kopf.Logger,
    only: Collection[str] | None = None,
) -> RunnerPatchResult:
    """Derive the runners of ``pool`` named in ``only`` (None: all); write those whose derived status changed."""
    now = runtime.clock()
    grace = dt.timedelta(seconds=runtime.config.runner_grace_seconds)
    clock = time.monotonic()
    results: dict[str, RunnerDerived] = {}
    retry: set[str] = set()
    writes: list[tuple[ParsedRunner, RunnerDerived, dict[str, Any], QualificationDecision | None]] = []
    wants_slot: set[str] = set()
    starts: list[tuple[ParsedRunner, QualificationDecision]] = []
    store = runtime.job_store.store
    seen: list[str] = []
    for view in runners:
        seen.append(view.name)
        if only is not None and view.name not in only:
            continue
        lease = next(iter(leases.get((view.namespace, view.name), ())), None)
        derived = decide_runner_status(
            name=view.name,
            spec=view.spec,
            report=view.status.report,
            pool=facts,
            lease=lease,
            now=now,
            grace=grace,
            hold=_heartbeat_hold(runtime, lease, view.status.reported_status, now=now),
        )
        qualification = decide_runner_qualification(runtime, view, derived, facts, now)
        if qualification is not None:
            derived = apply_qualification(derived, qualification)
            if qualification.wants_slot:
                wants_slot.add(view.name)
            start = qualification.start
            if start is not None and start.job not in store.probes_of((view.namespace, view.name)):
                starts.append((view, qualification))
        results[view.name] = derived
        update = build_runner_status(
            observed=view.status, derived=derived, generation=view.generation, now=now, qualification=qualification
        )
        adopted = pool.uid in view.owner_uids
        if update.changed or not adopted:
            if memo.pending(view.name, view.resource_version, now=clock):
                retry.add(view.name)  # our write is still on its way through the watch; look again
            else:
                writes.append((view, derived, update.status, qualification))
    memo.forget_except(seen)
    gate = asyncio.Semaphore(_WRITERS)

    async def write(
        view: ParsedRunner, derived: RunnerDerived, status: dict[str, Any], qualification: QualificationDecision | None
    ) -> None:
        async with gate:
            try:
                await _write_runner(
                    runtime.kube,
                    view,
                    pool=pool,
                    derived=derived,
                    status=status,
                    now=now,
                    logger=logger,
                    qualification=qualification,
                )
                if qualification is not None:
                    await patch_old_probes(
                        runtime.kube, view, qualification, store.probes_of((view.namespace, view.name))
                    )
            except KubeError as err:
                logger.warning("runner %s/%s: status not written (will retry): %s", view.namespace, view.name, err)
                retry.add(view.name)
                return
            memo.record(view.name, view.resource_version, now=clock)

    retry |= await _start_probes(runtime.kube, pool=pool, facts=facts, starts=starts, gate=gate, logger=logger)
    await asyncio.gather(*(write(*item) for item in writes))
    return RunnerPatchResult(derived=results, retry=retry, wants_slot=wants_slot)


def register(runtime: Runtime, wakes: RunnerWakes) -> None:
    """Register the runner and runner-Lease indexes, and the events that wake pool loops (they write)."""

    probes: list[asyncio.Task[None]] = []

    @kopf.on.startup()
    async def watch_only_runner_leases(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Filter on the server: the operator never receives node or leader-election Leases.
        settings.watching.label_selectors["coordination.k8s.io", "leases"] = RUNNER_LABEL
        # Contact with the API server clocks the heartbeat hold; its return re-derives every runner.
        runtime.contact.on_return(wakes.mark_all)
        probes.append(asyncio.create_task(run_contact_probe(runtime.contact, runtime.kube), name="api-contact"))

    @kopf.on.cleanup()
    async def stop_contact_probe(**_: Any) -> None:
        for task in probes:
            task.cancel()

    # Kopf hands each index to handlers as a keyword argument named by its id. These handlers are
    # async although they never wait: Kopf runs a plain function in a thread, a hop per event.
    @kopf.index(GROUP, VERSION, "runners", id="runners_by_pool")
    async def runners_by_pool(*, body: kopf.Body, **_: Any) -> dict[tuple[str, str], ParsedRunner]:
        view = parse_runner_body(body)
        if view is None:
            # An empty dict drops the object from the index; None would keep its previous value.
            return {}
        return {(view.namespace, view.spec.pool_ref.name): view}

    # When each Lease's current digest was first seen: a disagreement is timed from then (in memory;
    # after a restart it restarts, which only delays a ReportStale by the grace).
    digest_seen: dict[tuple[str, str], tuple[str | None, dt.datetime]] = {}

    @kopf.index("coordination.k8s.io", "v1", "leases", id="runner_leases", labels={RUNNER_LABEL: kopf.PRESENT})
    async def runner_leases(
        *, name: str, namespace: str | None, spec: kopf.Spec, annotations: kopf.Annotations, **_: Any
    ) -> dict[tuple[str, str], LeaseView]:
        key = (namespace or "", name)
        digest = annotations.get(REPORT_DIGEST_ANNOTATION)
        seen = digest_seen.get(key)
        if seen is None or seen[0] != digest:
            seen = digest_seen[key] = (digest, runtime.clock())
        return {key: build_lease_view(spec, annotations, digest_since=seen[1])}

    # Events run after the indexes have taken the same event in, so a woken loop reads the new state.
    @kopf.on.event(GROUP, VERSION, "runners")
    async def runner_event(
        *, event: kopf.RawEvent, body: kopf.Body, name: str, namespace: str | None, **_: Any
    ) -> None:
        pool = ((body.get("spec") or {}).get("poolRef") or {}).get("name")
        deleted = event.get("type") == "DELETED"
        wakes.runner_changed(namespace=namespace or "", name=name, pool=None if deleted or not pool else str(pool))

    @kopf.on.event("coordination.k8s.io", "v1", "leases", labels={RUNNER_LABEL: kopf.PRESENT})
    async def lease_event(
        *,
        event: kopf.RawEvent,
        name: str,
        namespace: str | None,
        spec: kopf.Spec,
        annotations: kopf.Annotations,
        **_: Any,
    ) -> None:
        deleted = event.get("type") == "DELETED"
        runtime.contact.watched()  # the Lease watch is live: the heartbeat hold may start counting
        if deleted:
            digest_seen.pop((namespace or "", name), None)
        wakes.lease_changed(
            namespace=namespace or "", name=name, view=None if deleted else build_lease_view(spec, annotations)
        )

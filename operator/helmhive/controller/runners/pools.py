"""Reconciles each RunnerPool: its owned objects, its credential generation, its runners and its status.

One Kopf daemon per pool runs a loop that wakes on an event (one of its Runners or their
Leases changed, see :class:`~helmhive.controller.runners.derived.RunnerWakes`; the pool changed), at a
runner's ``review_at`` (one scheduled instant per runner: Lease expiry, auth age, a digest
disagreement), or when the credential check or object resync is due -- never on a fixed tick:

1. parse the spec (an unusable one sets ``Ready=False, InvalidSpec`` and goes no further);
2. every ``credential_check_seconds``, hash the credential Secret; a new hash bumps
   ``status.credentialGeneration``, is audited, and is stamped into the pod template so the
   StatefulSet rolls (the hash is stored, the Secret's content never is);
3. server-side apply the owned objects when the desired set changed, and every
   ``objects_resync_seconds`` to undo drift; delete the PodDisruptionBudget below two replicas
   (in mode JobPod, the link-key Secret is made first, once, and the warm pods kept after:
   :mod:`helmhive.controller.runners.jobpods`, woken by their pods' events);
4. derive the runners that changed or are due from the Kopf indexes (all of them when the
   pool's facts changed) and keep each one's result, for the counts and its next review;
5. patch the pool's status when it changed.

The loop is the only writer of the pool's status, so its merge patches never race. The
garbage collector removes the owned objects when the pool is deleted (ownerReferences);
Kopf's finalizer only lets the loop stop first.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.api.reasons import ConditionType, Reason
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.controller.kube.door import KubeError
from helmhive.controller.runners import jobpods
from helmhive.controller.runners.credentials import check_credential
from helmhive.controller.runners.derived import ParsedRunner, RunnerWakes, WriteMemo, patch_runners
from helmhive.controller.runners.qualification import QUALIFICATION_NONE, ensure_qualification_objects
from helmhive.controller.runtime import Runtime
from helmhive.policy.conditions import find_condition, set_condition
from helmhive.policy.jobpods.view import PodView
from helmhive.policy.jobpods.warmset import WarmVerdict
from helmhive.policy.kstatus import with_kstatus
from helmhive.policy.runners.capabilities import decide_pool_capabilities_condition
from helmhive.policy.runners.credentials import CredentialDecision, build_credential_verdict
from helmhive.policy.runners.pool import PoolRef, build_pool_objects, decide_pool_name_problem, decide_pruned_objects
from helmhive.policy.runners.state import (
    ConditionVerdict,
    LeaseView,
    PoolCounts,
    PoolFacts,
    RunnerDerived,
    decide_pool_counts,
)
from helmhive.policy.waiting import DeadlineHeap

__all__ = ["POOL", "PoolLoop", "register"]

POOL = kind_by_name("RunnerPool")
RETRY_SECONDS = 5.0
"""A runner whose status write failed (or is still in flight) is looked at again after this."""


@dataclass
class PoolLoop:
    """The state one pool's loop keeps between ticks. Everything in it can be rebuilt after a restart."""

    runtime: Runtime
    ref: PoolRef
    credential: CredentialDecision
    ready: ConditionVerdict = field(default_factory=lambda: ConditionVerdict(status=None, reason=Reason.PENDING))
    applied_digest: str | None = None
    next_apply: float = 0.0
    next_credential_check: float = 0.0
    runner_memo: WriteMemo = field(default_factory=WriteMemo)
    status_memo: WriteMemo = field(default_factory=WriteMemo)
    wakes: RunnerWakes = field(default_factory=RunnerWakes)
    derived: dict[str, RunnerDerived] = field(default_factory=dict)
    reviews: DeadlineHeap[str] = field(default_factory=DeadlineHeap)
    facts: PoolFacts | None = None
    job_pods: jobpods.JobPodKeeper = field(default_factory=jobpods.JobPodKeeper)
    spec: RunnerPoolSpec | None = None
    qualification_digest: str | None = QUALIFICATION_NONE
    next_qualification_apply: float = 0.0
    """What the qualification objects were last applied from (:func:`ensure_qualification_objects`)."""

    @classmethod
    def resume(cls, *, runtime: Runtime, ref: PoolRef, status: dict[str, Any], wakes: RunnerWakes) -> PoolLoop:
        """Start from what the pool's status already says (after a restart, nothing is lost)."""
        available = find_condition(status.get("conditions"), ConditionType.CREDENTIAL_AVAILABLE)
        credential = CredentialDecision(
            hash=status.get("credentialHash"),
            generation=int(status.get("credentialGeneration") or 0),
            available=(available or {}).get("status") != "False",
            changed=False,
            previous_hash=None,
        )
        return cls(runtime=runtime, ref=ref, credential=credential, wakes=wakes)

    def next_wake(self, clock: float) -> float:
        """Seconds until the loop has something to do without an event."""
        due = min(self.next_credential_check, self.next_apply) - clock
        job_pods = self.job_pods.next_due(mode=self.spec.execution.mode if self.spec else None)
        if job_pods is not None:
            due = min(due, job_pods - clock)
        review = self.reviews.next_at()
        if review is not None:
            due = min(due, (review - self.runtime.clock()).total_seconds())
        return max(0.0, due)

    async def tick(
        self,
        *,
        body: kopf.Body,
        runners: kopf.Index[tuple[str, str], ParsedRunner],
        leases: kopf.Index[tuple[str, str], LeaseView],
        job_pods: kopf.Index[tuple[str, str], PodView],
        logger: kopf.Logger,
    ) -> None:
        status = dict(body.get("status") or {})
        meta = body.get("metadata") or {}
        clock = time.monotonic()
        counts: PoolCounts | None = None
        warm: WarmVerdict | None = None
        spec = self.spec = self._parse(dict(body.get("spec") or {}))
        if spec is not None:
            if clock >= self.next_credential_check:
                await self._check_credential(spec, logger=logger)
                self.next_credential_check = clock + self.runtime.config.credential_check_seconds
            kube, ref, resync = self.runtime.kube, self.ref, self.runtime.config.objects_resync_seconds
            await self.job_pods.ensure_link(kube, pool=ref, spec=spec, clock=clock, resync=resync, logger=logger)
            await self._apply_objects(spec, clock=clock, logger=logger)
            await self._apply_qualification(spec, clock=clock, logger=logger)
            pods = job_pods.get((ref.namespace, ref.name), ())
            if self.ready.reason is Reason.RECONCILED:  # warm pods only behind their NetworkPolicy
                await self.job_pods.keep_warm(kube, pool=ref, spec=spec, pods=pods, clock=clock, logger=logger)
            warm = self.job_pods.warm_verdict(pool=ref, spec=spec, pods=pods)
            facts = PoolFacts(
                control_state=spec.control_state,
                credential_generation=self.credential.generation,
                credential_available=self.credential.available,
                auth_max_age=dt.timedelta(seconds=spec.heartbeat.auth_max_age_seconds),
                qualification=spec.qualification,
            )
            counts = decide_pool_counts(
                replicas=spec.replicas, runners=await self._derive_runners(facts, runners, leases, logger=logger)
            )
        capabilities = None
        if spec is not None:
            reports = [view.status.report for view in runners.get((self.ref.namespace, self.ref.name), ())]
            capabilities = decide_pool_capabilities_condition(declared=spec.capabilities, reports=reports)
        await self._patch_status(
            status,
            spec=spec,
            counts=counts,
            warm=warm,
            capabilities=capabilities,
            generation=meta.get("generation"),
            resource_version=str(meta.get("resourceVersion", "")),
            clock=clock,
        )

    async def _derive_runners(
        self,
        facts: PoolFacts,
        runners: kopf.Index[tuple[str, str], ParsedRunner],
        leases: kopf.Index[tuple[str, str], LeaseView],
        *,
        logger: kopf.Logger,
    ) -> list[RunnerDerived]:
        """Derive the runners marked by events or due for review (all, when the pool's facts changed)."""
        key = (self.ref.namespace, self.ref.name)
        marked = self.wakes.take(key) | set(self.reviews.pop_due(self.runtime.clock()))
        everyone = facts != self.facts
        self.facts = facts
        views = list(runners.get(key, ()))
        names = {view.name for view in views}
        for gone in [name for name in self.derived if name not in names]:
            del self.derived[gone]
            self.reviews.discard(gone)
        if everyone or marked:
            result = await patch_runners(
                runtime=self.runtime,
                pool=self.ref,
                facts=facts,
                runners=views,
                leases=leases,
                memo=self.runner_memo,
                logger=logger,
                only=None if everyone else marked,
            )
            now = self.runtime.clock()
            for name, derived in result.derived.items():
                self.derived[name] = derived
                if derived.review_at is not None:
                    self.reviews.set(name, derived.review_at)
                else:
                    self.reviews.discard(name)
                if derived.online.status is not True:
                    self._await_renewal(name, derived, leases)
            for name in result.derived:
                self.wakes.wake_on_free_slot(namespace=self.ref.namespace, name=name, wanted=name in result.wants_slot)
            for name in result.retry:
                current = self.reviews.when(name)
                retry_at = now + dt.timedelta(seconds=RETRY_SECONDS)
                self.reviews.set(name, retry_at if current is None else min(current, retry_at))
        return list(self.derived.values())

    def _await_renewal(self, name: str, derived: RunnerDerived, leases: kopf.Index[tuple[str, str], LeaseView]) -> None:
        """A runner derived Offline comes back with a plain renewal: ask to be woken by it.

        If the index already holds a newer renewal than the derivation used (it arrived while
        this pass awaited its writes), derive the runner again at once instead.
        """
        key = (self.ref.namespace, name)
        lease = next(iter(leases.get(key, ())), None)
        if lease is not None and lease.renew_time != derived.heartbeat_time:
            self.wakes.mark((self.ref.namespace, self.ref.name), name)
        else:
            self.wakes.wake_on_renewal(namespace=self.ref.namespace, name=name)

    def _parse(self, raw: dict[str, Any]) -> RunnerPoolSpec | None:
        problem = decide_pool_name_problem(self.ref.name)
        if problem is None:
            try:
                return RunnerPoolSpec.model_validate(raw)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                problem = f"spec.{where}: {first['msg']} ({err.error_count()} problem(s))"
        self.ready = ConditionVerdict(status=False, reason=Reason.INVALID_SPEC, message=problem)
        return None

    async def _check_credential(self, spec: RunnerPoolSpec, *, logger: kopf.Logger) -> None:
        """Hash the credential Secret; on a new hash, audit it and store the new generation."""
        decision = await check_credential(self.runtime, pool=self.ref, spec=spec, known=self.credential, logger=logger)
        if decision is not None:
            self.credential = decision

    async def _apply_objects(self, spec: RunnerPoolSpec, *, clock: float, logger: kopf.Logger) -> None:
        objects = build_pool_objects(
            self.ref,
            spec,
            credential_generation=self.credential.generation,
            cluster_cidrs=self.runtime.config.runner_cluster_cidrs,
        )
        digest = hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()
        if digest == self.applied_digest and clock < self.next_apply:
            return
        current = ""
        try:
            for obj in objects:
                current = f"{obj['kind']} {obj['metadata']['name']}"
                await self.runtime.kube.apply(obj)
            for api_version, kind, name in decide_pruned_objects(self.ref, spec):
                current = f"{kind} {name}"
                await self.runtime.kube.delete_object(api_version, kind, name, self.ref.namespace)
        except KubeError as err:
            self.ready = ConditionVerdict(status=False, reason=Reason.APPLY_FAILED, message=f"{current}: {err.message}")
            logger.warning("pool %s: %s not applied: %s", self.ref.name, current, err.message)
            return
        if digest != self.applied_digest:
            logger.info(
                "pool %s: applied %d objects (credential generation %d)",
                self.ref.name,
                len(objects),
                self.credential.generation,
            )
        self.applied_digest = digest
        self.next_apply = clock + self.runtime.config.objects_resync_seconds
        self.ready = ConditionVerdict(status=True, reason=Reason.RECONCILED, message=f"{len(objects)} objects applied")

    async def _apply_qualification(self, spec: RunnerPoolSpec, *, clock: float, logger: kopf.Logger) -> None:
        """The pool's qualification objects: applied when they change, and (if any) every resync to undo drift."""
        due = spec.qualification is not None and clock >= self.next_qualification_apply
        applied = None if due else self.qualification_digest
        digest = await ensure_qualification_objects(self.runtime.kube, self.ref, spec, applied=applied, logger=logger)
        if digest is not None:
            self.qualification_digest = digest
            if due:
                self.next_qualification_apply = clock + self.runtime.config.objects_resync_seconds

    async def _patch_status(
        self,
        status: dict[str, Any],
        *,
        spec: RunnerPoolSpec | None,
        counts: PoolCounts | None,
        warm: WarmVerdict | None,
        capabilities: ConditionVerdict | None,
        generation: int | None,
        resource_version: str,
        clock: float,
    ) -> None:
        now = self.runtime.clock()
        verdicts = [(ConditionType.READY, self.ready.status, self.ready.reason, self.ready.message)]
        if capabilities is not None:
            verdicts.append(
                (ConditionType.CAPABILITIES_ADVERTISED, capabilities.status, capabilities.reason, capabilities.message)
            )
        desired: dict[str, Any] = {"observedGeneration": generation}
        if spec is not None:
            verdict = build_credential_verdict(spec.credential, self.credential)
            verdicts.append((ConditionType.CREDENTIAL_AVAILABLE, verdict.status, verdict.reason, verdict.message))
            desired |= {"credentialHash": self.credential.hash, "credentialGeneration": self.credential.generation}
        if counts is not None:
            desired |= counts.to_wire()
        if warm is not None:
            verdicts.append((ConditionType.WARM_PODS_READY, warm.status, warm.reason, warm.message))
            desired["warmPodsReady"] = warm.ready
        conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
        changed = False
        for ctype, ok, reason, message in verdicts:
            update = set_condition(
                conditions, type=ctype, status=ok, reason=reason, message=message, generation=generation, now=now
            )
            conditions, changed = update.conditions, changed or update.changed
        if warm is None and spec is not None and find_condition(conditions, ConditionType.WARM_PODS_READY) is not None:
            # Back to InRunner: the pool has no warm set to report.
            conditions = [c for c in conditions if c.get("type") != ConditionType.WARM_PODS_READY]
            desired["warmPodsReady"] = None
            changed = True
        # kstatus's Reconciling/Stalled, from the status about to be written (helmhive.policy.kstatus)
        merged = {**status, **desired, "conditions": conditions}
        conditions = with_kstatus("RunnerPool", merged, generation=generation, now=now).get("conditions", conditions)
        changed = changed or conditions != list(status.get("conditions") or [])
        changed = changed or any(status.get(key) != value for key, value in desired.items())
        if not changed or self.status_memo.pending("status", resource_version, now=clock):
            return
        patch = {"status": {**desired, "conditions": conditions}}
        await self.runtime.kube.patch_status(POOL, self.ref.name, patch, namespace=self.ref.namespace)
        self.status_memo.record("status", resource_version, now=clock)


def register(runtime: Runtime, wakes: RunnerWakes) -> None:
    """Register one long-running loop per RunnerPool, woken by ``wakes`` and by changes to the pool."""
    pool_wakes: dict[tuple[str, str], asyncio.Event] = {}
    jobpods.register(wakes)  # the loop reads the job-pod index

    @kopf.on.event(GROUP, VERSION, "runnerpools")
    async def pool_event(*, name: str, namespace: str | None, **_: Any) -> None:  # async: no thread hop
        wake = pool_wakes.get((namespace or "", name))
        if wake is not None:
            wake.set()

    @kopf.daemon(GROUP, VERSION, "runnerpools", cancellation_timeout=10.0)
    async def run_pool(
        *,
        stopped: kopf.DaemonStopped,
        name: str,
        namespace: str | None,
        uid: str,
        body: kopf.Body,
        logger: kopf.Logger,
        **kwargs: Any,
    ) -> None:
        # Kopf passes each index by its handler's name; they are live views of the watch streams.
        runners_by_pool: kopf.Index[tuple[str, str], ParsedRunner] = kwargs["runners_by_pool"]
        runner_leases: kopf.Index[tuple[str, str], LeaseView] = kwargs["runner_leases"]
        job_pods: kopf.Index[tuple[str, str], PodView] = kwargs[jobpods.JOB_POD_INDEX]
        key = (namespace or "", name)
        wake = pool_wakes[key] = asyncio.Event()
        wakes.attach(key, wake.set)
        loop = PoolLoop.resume(
            runtime=runtime,
            ref=PoolRef(name=name, namespace=namespace or "", uid=uid),
            status=dict(body.get("status") or {}),
            wakes=wakes,
        )
        logger.info("runner pool %s/%s: loop started", namespace, name)
        try:
            while not stopped:
                wake.clear()
                started = time.monotonic()
                try:
                    await loop.tick(
                        body=body, runners=runners_by_pool, leases=runner_leases, job_pods=job_pods, logger=logger
                    )
                except KubeError as err:
                    logger.warning("runner pool %s/%s: tick failed (will retry): %s", namespace, name, err)
                except Exception:
                    # The loop must outlive any one bad tick; Kopf's own retry would wait a minute.
                    logger.exception("runner pool %s/%s: tick failed (will retry)", namespace, name)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_first(wake, stopped), loop.next_wake(time.monotonic()))
                # Passes start at least runner_tick_seconds apart: a burst of events costs one pass.
                gap = started + runtime.config.runner_tick_seconds - time.monotonic()
                if gap > 0 and not stopped:
                    await stopped.wait(gap)
        finally:
            wakes.detach(key)
            pool_wakes.pop(key, None)


async def _first(wake: asyncio.Event, stopped: kopf.DaemonStopped) -> None:
    """Return when ``wake`` is set or the daemon is stopped."""
    tasks = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()

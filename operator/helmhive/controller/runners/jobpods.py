"""A RunnerPool's job pods on the operator's side (``execution.mode: JobPod``): its link key and its warm pods.

Owns: the Kopf index of every job pod by ``(namespace, pool)`` (filtered by label on the server),
the pod events that wake a pool's loop when its warm set changes, and :class:`JobPodKeeper`, the
part of the pool's loop (:mod:`helmhive.controller.runners.pools`) that

- creates the pool's link-key Secret once, with fresh random bytes, and never overwrites one that
  exists (a create answered 409 keeps it: a new key would break every link in flight);
- keeps ``execution.warmPods`` warm pods (:func:`~helmhive.policy.jobpods.warmset.decide_warm_pods`,
  ``0`` for a pool in InRunner): it creates the shortfall and deletes the warm pods that ended or
  are surplus, each delete conditional on the uid and resourceVersion it read (a pod claimed since
  is refused, 409, and stays).

Event-driven, not polled: a pod event wakes the pool's loop only when the pod is, or just was, in
the warm set (a claim takes it out: the loop creates a replacement). Creates and deletes the watch
has not shown yet are remembered for :data:`EXPECT_SECONDS`, so a loop woken before the index
caught up neither creates twice nor counts a deleted pod.

Must not: log, store or post the link key (only the Secret's name); touch a claimed pod (the
runner's, gone with its AgentJob by ownerReference); or apply the job pods' NetworkPolicy (one of
the pool's applied objects, :func:`helmhive.policy.runners.pool.build_pool_objects`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from helmhive.api.execution import ExecutionMode
from helmhive.api.jobpod import LABEL_POOL, link_secret_name
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.controller.kube.door import Conflict, Kube, KubeError
from helmhive.controller.runners.wakes import RunnerWakes
from helmhive.policy.jobpods.identity import JOB_POD_NAME
from helmhive.policy.jobpods.link import LINK_KEY_BYTES, build_link_secret
from helmhive.policy.jobpods.pod import build_job_pod
from helmhive.policy.jobpods.view import PodView
from helmhive.policy.jobpods.warmset import WarmVerdict, decide_warm_condition, decide_warm_pods
from helmhive.policy.runners.pool import PoolRef

__all__ = ["EXPECT_SECONDS", "JOB_POD_INDEX", "JobPodKeeper", "WarmMemo", "parse_job_pod", "register"]

JOB_POD_INDEX = "job_pods_by_pool"
"""The Kopf index (and the keyword the pool daemon receives it by): ``(namespace, pool)`` -> PodView."""
JOB_POD_LABELS: dict[str, Any] = {"app.kubernetes.io/name": JOB_POD_NAME, LABEL_POOL: kopf.PRESENT}
JOB_POD_SELECTOR = f"app.kubernetes.io/name={JOB_POD_NAME},{LABEL_POOL}"
EXPECT_SECONDS = 60.0
"""How long a create or delete the index has not shown yet is believed (a watch that lost it)."""
RETRY_SECONDS = 10.0
"""A failed create or delete of a warm pod, or of the link key, is tried again after this."""

PoolKey = tuple[str, str]


def parse_job_pod(body: Mapping[str, Any]) -> PodView | None:
    """The view of a job pod's body; None for one that does not parse (it is left alone)."""
    try:
        return PodView.parse(dict(body))
    except ValidationError:
        return None


@dataclass
class WarmMemo:
    """The pool's warm-pod writes the index has not shown yet, by pod name, with when they were made."""

    created: dict[str, float] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)

    def settle(self, seen: Mapping[str, PodView], *, now: float) -> None:
        """Forget what the index now shows: a created pod it holds, a deleted one it lost or sees deleting."""
        for name, at in list(self.created.items()):
            if name in seen or now - at > EXPECT_SECONDS:
                del self.created[name]
        for name, at in list(self.deleted.items()):
            pod = seen.get(name)
            if pod is None or pod.deleting or now - at > EXPECT_SECONDS:
                del self.deleted[name]

    def next_due(self) -> float | None:
        """When the oldest expectation lapses (the loop must look again then), or None."""
        times = [*self.created.values(), *self.deleted.values()]
        return min(times) + EXPECT_SECONDS if times else None


@dataclass
class JobPodKeeper:
    """One pool's link key and warm set, kept between its loop's ticks (rebuilt from the index after a restart)."""

    memo: WarmMemo = field(default_factory=WarmMemo)
    next_link_check: float = 0.0
    retry_at: float | None = None
    last_error: str = ""

    def next_due(self, *, mode: ExecutionMode | None) -> float | None:
        """The monotonic time the loop has something to do here without an event, or None."""
        times = [t for t in (self.memo.next_due(), self.retry_at) if t is not None]
        if mode is ExecutionMode.JOB_POD:
            times.append(self.next_link_check)
        return min(times) if times else None

    async def ensure_link(
        self, kube: Kube, *, pool: PoolRef, spec: RunnerPoolSpec, clock: float, resync: float, logger: kopf.Logger
    ) -> None:
        """Create the pool's link-key Secret unless it exists (mode JobPod; looked at again every ``resync``)."""
        if spec.execution.mode is not ExecutionMode.JOB_POD or clock < self.next_link_check:
            return
        name = link_secret_name(pool.name)
        body = build_link_secret(pool=pool, namespace=pool.namespace, key=secrets.token_bytes(LINK_KEY_BYTES))
        try:
            await kube.create_object(body)
            logger.info("pool %s: link key Secret %s created", pool.name, name)
        except Conflict:
            pass  # it exists: keep it
        except KubeError as err:
            # The status only: the API server's answer about a Secret's body is not for the log.
            logger.warning("pool %s: link key Secret %s not created (will retry): HTTP %s", pool.name, name, err.status)
            self.next_link_check = clock + RETRY_SECONDS
            return
        self.next_link_check = clock + resync

    def warm_verdict(self, *, pool: PoolRef, spec: RunnerPoolSpec, pods: Iterable[PodView]) -> WarmVerdict | None:
        """The pool's ``WarmPodsReady`` condition (None in mode InRunner: the pool has no such condition)."""
        if spec.execution.mode is not ExecutionMode.JOB_POD:
            return None
        mine = [p for p in pods if p.controller is not None and p.controller.uid == pool.uid]
        return decide_warm_condition(want=spec.execution.warm_pods, pods=mine, keep_error=self.last_error)

    async def keep_warm(
        self,
        kube: Kube,
        *,
        pool: PoolRef,
        spec: RunnerPoolSpec,
        pods: Iterable[PodView],
        clock: float,
        logger: kopf.Logger,
    ) -> None:
        """Create and delete warm pods until the pool has ``warmPods`` of them (none in mode InRunner)."""
        job_pod = spec.execution.mode is ExecutionMode.JOB_POD
        want = spec.execution.warm_pods if job_pod else 0
        seen = {p.name: p for p in pods}
        self.memo.settle(seen, now=clock)
        # Only this pool object's own warm pods: a namesake pool's are the garbage collector's.
        mine = [p for p in seen.values() if p.controller is not None and p.controller.uid == pool.uid]
        counted = [p for p in mine if p.name not in self.memo.deleted]
        plan = decide_warm_pods(want=max(0, want - len(self.memo.created)), pods=counted)
        self.retry_at = None
        created = deleted = 0
        try:
            for pod in plan.delete:
                try:
                    await kube.delete_pod(
                        pod.name, pool.namespace, uid=pod.metadata.uid, resource_version=pod.metadata.resource_version
                    )
                except Conflict:
                    continue  # claimed or changed since it was read: its event brings it back here
                self.memo.deleted[pod.name] = clock
                deleted += 1
            for _ in range(plan.create if job_pod else 0):
                body = build_job_pod(
                    pool=pool, pool_spec=spec, namespace=pool.namespace, job=None, runner=None, timeout_seconds=None
                )
                made = await kube.create_object(body)
                self.memo.created[str(made["metadata"]["name"])] = clock
                created += 1
        except KubeError as err:
            self.retry_at = clock + RETRY_SECONDS
            if err.message != self.last_error:
                logger.warning("pool %s: warm job pods not kept (will retry): %s", pool.name, err.message)
            self.last_error = err.message
        else:
            self.last_error = ""
        if created or deleted:
            logger.info("pool %s: %d warm job pod(s) created, %d deleted (want %d)", pool.name, created, deleted, want)


def register(wakes: RunnerWakes) -> None:
    """Register the job-pod index, and the pod events that wake a pool's loop when its warm set changes."""
    warm: dict[tuple[str, str], str] = {}  # (namespace, pod) -> pool, for the pods last seen warm

    @kopf.on.startup()
    async def watch_only_job_pods(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Filter on the server: the operator never receives any other pod.
        settings.watching.label_selectors["", "v1", "pods"] = JOB_POD_SELECTOR

    # Async although they never wait: Kopf runs a plain function in a thread, a hop per event.
    @kopf.index("", "v1", "pods", id=JOB_POD_INDEX, labels=JOB_POD_LABELS)
    async def job_pods_by_pool(*, body: kopf.Body, namespace: str | None, **_: Any) -> dict[PoolKey, PodView]:
        view = parse_job_pod(body)
        if view is None or view.pool is None:
            return {}  # an empty dict drops the pod from the index
        return {(namespace or "", view.pool): view}

    # Runs after the index took the same event in, so a woken loop reads the new state.
    @kopf.on.event("", "v1", "pods", labels=JOB_POD_LABELS)
    async def job_pod_event(
        *, event: kopf.RawEvent, body: kopf.Body, name: str, namespace: str | None, **_: Any
    ) -> None:
        key = (namespace or "", name)
        view = parse_job_pod(body)
        now_warm = event.get("type") != "DELETED" and view is not None and view.warm and not view.deleting
        pool = view.pool if view is not None and now_warm else warm.pop(key, None)
        if now_warm and pool is not None:
            warm[key] = pool
        if pool is not None:
            wakes.wake((namespace or "", pool))

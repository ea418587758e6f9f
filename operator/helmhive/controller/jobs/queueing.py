"""AgentJobs at queue time: bind the exact profile revision, wait for a reference, or fail closed.

When a job is first seen, the operator resolves its profile (``spec.profile``, else the
Workspace's active profile for the job kind), requires it to be Valid at its current
revision, and writes ``status.profile``: name, revision, hash and the full effective
snapshot. Routing (a later step) reads only that binding, so editing the profile later
changes nothing about this job.

A reference that does not exist **yet** is waited for (``kubectl apply -f dir/`` and GitOps
tools create objects in any order): ``Routed=False`` and ``Ready=False`` with
``WaitingForWorkspace`` or ``WaitingForProfile`` and a message naming what is missing and
until when. The job is queued again **at once** when that Workspace or Profile appears or
changes, and at its deadline (creation plus ``--reference-wait-seconds``) it fails closed with
``WorkspaceNotFound`` or ``ProfileNotFound``; see :mod:`helmhive.policy.waiting`. An invalid
profile (``ProfileNotValid``) or spec (``InvalidSpec``) fails closed at once, and failing
closed is final.

How a waiting job is found again without polling: before each lookup the queue step records
in its :class:`~helmhive.policy.waiting.WaitingRoom` that the job waits for that Workspace or
Profile, and only then reads it. Event handlers on Workspaces and Profiles wake the jobs
recorded for the object. Recording *before* reading means an object created between the
read and the job's status write is still seen: its watch event comes after its creation,
which comes after the record. The deadlines are entries in the operator's one
:class:`~helmhive.controller.deadlines.DeadlineScheduler`; after a restart the operator's AgentJob
watch delivers every listed job to this step again, which queues every unbound job, which rebuilds both.

Every status write is conditional on the ``resourceVersion`` the decision was made from; a
409 re-reads the job and decides again, so a stale decision is never written.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from helmhive.api.kinds import GROUP, VERSION, kind_by_name
from helmhive.controller import metrics
from helmhive.controller.deadlines import KeyedLocks
from helmhive.controller.jobs.binding import FailClosed, ProfileRevisionPending, bind_profile
from helmhive.controller.kube.door import Conflict, KubeError, NotFound
from helmhive.controller.runtime import Runtime
from helmhive.policy.agentjob import life as agentjob
from helmhive.policy.agentjob.life import decide_needs_binding
from helmhive.policy.waiting import (
    MissingReference,
    Reference,
    ReferenceKind,
    WaitingRoom,
    decide_reference_wait,
    parse_timestamp,
)

__all__ = ["FailClosed", "JobQueue", "ProfileRevisionPending", "bind_profile", "register"]

AGENT_JOB = kind_by_name("AgentJob")
PROFILE = kind_by_name("Profile")
WORKSPACE = kind_by_name("Workspace")
_CONFLICT_RETRIES = 5
_RETRY_SECONDS = 5.0
log = logging.getLogger("helmhive.controller.jobs.queueing")

JobKey = tuple[str, str]
Handoff = Callable[[Mapping[str, Any], dict[str, Any], list[dict[str, Any]] | None], None]
"""``(job, binding, conditions)``: the job, its ``status.profile``, its cleared conditions (None: unchanged)."""


def _ref(key: JobKey) -> dict[str, Any]:
    return {"k8s_ref": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "namespace": key[0], "name": key[1]}}


class JobQueue:
    """The queue step: binds each new job, keeps the waiting ones findable, ends them at their deadline."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.room: WaitingRoom[JobKey] = WaitingRoom()
        self.locks = KeyedLocks()
        self.handoff: Handoff | None = None
        """Takes a bound job to routing, which writes binding and decision in one status write."""

    @staticmethod
    def _entry(key: JobKey) -> tuple[str, str, str]:
        return ("AgentJob", *key)

    def wake(self, reference: Reference) -> int:
        """``reference`` appeared or changed: queue the jobs waiting for it again, now. Returns how many."""
        waiters = self.room.waiters(reference)
        for key in waiters:
            self.runtime.deadlines.soon(self._entry(key), functools.partial(self.requeue, key))
        return len(waiters)

    def forget(self, key: JobKey) -> None:
        """The job waits for nothing any more (bound, failed closed, or gone)."""
        self.room.forget(key)
        self.runtime.deadlines.cancel(self._entry(key))

    async def requeue(self, key: JobKey) -> None:
        """Read the job and queue it again (a reference changed, or its deadline came)."""
        try:
            body = await self.runtime.kube.get(AGENT_JOB, key[1], namespace=key[0])
        except NotFound:
            self.forget(key)
            return
        await self.queue(body)

    async def queue(self, body: Mapping[str, Any]) -> None:
        """Bind the job's profile, or make it wait, or fail it closed; one decision per job at a time."""
        meta = body["metadata"]
        key: JobKey = (str(meta["namespace"]), str(meta["name"]))
        async with self.locks.hold(key):
            for _ in range(_CONFLICT_RETRIES):
                if await self._once(key, body):
                    return
                try:
                    body = await self.runtime.kube.get(AGENT_JOB, key[1], namespace=key[0])
                except NotFound:
                    self.forget(key)
                    return
        raise Conflict(409, f"agentjob {key[0]}/{key[1]} kept changing while it was queued")

    async def queue_or_retry(self, body: Mapping[str, Any]) -> None:
        """:meth:`queue`, and on an API error queue it again later (Kopf does not retry event handlers)."""
        meta = body["metadata"]
        key: JobKey = (str(meta["namespace"]), str(meta["name"]))
        try:
            await self.queue(body)
        except KubeError as err:
            log.warning("job %s/%s: queue step failed (%s); retrying", *key, err, extra=_ref(key))
            retry = self.runtime.clock() + dt.timedelta(seconds=_RETRY_SECONDS)
            self.runtime.deadlines.at(self._entry(key), retry, functools.partial(self.requeue, key))

    async def _once(self, key: JobKey, body: Mapping[str, Any]) -> bool:
        """Decide and write once; False when the write lost a race (the caller re-reads)."""
        job = agentjob.parse_agent_job(body)
        if not job.needs_binding:
            self.forget(key)
            return True
        meta = body["metadata"]
        self.room.forget(key)  # what it waits for is recorded afresh below, before each read
        missing: MissingReference | None = None
        try:
            binding = await bind_profile(
                self.runtime, body, expect=functools.partial(self.room.expect, key), spec=job.spec
            )
        except FailClosed as closed:
            reason, message, missing = closed.reason, closed.message, closed.missing
        except ProfileRevisionPending as pending:
            missing = pending.missing
            reason, message = missing.final_reason, missing.message
        else:
            self.forget(key)
            bound = agentjob.bind(job, binding=binding, now=self.runtime.clock())
            if self.handoff is not None:
                # Routing writes the binding with its decision: one conditional status write per job.
                self.handoff(body, binding, bound.status.get("conditions"))
                # Routing writes and audits the binding with its decision; one log line per job is enough.
                log.debug("job %s/%s bound to profile revision %s", *key, binding["revision"], extra=_ref(key))
                return True
            if not await self._write(key, meta, bound.status):
                return False
            log.info("job %s/%s bound to profile revision %s", *key, binding["revision"], extra=_ref(key))
            return True

        now = self.runtime.clock()
        waiting = False
        if missing is not None:
            wait = decide_reference_wait(
                missing=missing,
                created_at=parse_timestamp(meta.get("creationTimestamp")),
                now=now,
                limit=self.runtime.config.reference_wait,
            )
            reason, message, waiting = wait.reason, wait.message, wait.waiting
            if waiting:
                self.runtime.deadlines.at(self._entry(key), wait.deadline, functools.partial(self.requeue, key))
        if not waiting:
            self.forget(key)
        step = agentjob.wait if waiting else agentjob.fail
        update = step(job, reason=reason, message=message, now=now)
        if update is None:
            return True  # already says so
        if not await self._write(key, meta, update.status):
            return False
        metrics.record_queue_decision(reason=reason, waiting=waiting)
        if waiting:
            log.info("job %s/%s waits: %s: %s", *key, reason, message, extra=_ref(key))
        else:
            log.warning("job %s/%s failed closed: %s: %s", *key, reason, message, extra=_ref(key))
        return True

    async def _write(self, key: JobKey, meta: Mapping[str, Any], status: dict[str, Any]) -> bool:
        """Merge-patch the status, conditional on the job's resourceVersion; False on a 409."""
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": status}
        try:
            await self.runtime.kube.patch_status(AGENT_JOB, key[1], patch, namespace=key[0])
        except Conflict:
            return False
        except NotFound:
            self.forget(key)
        return True


def register(runtime: Runtime) -> JobQueue:
    """Register the queue step's handlers; return the queue (tests read its waiting room)."""
    jobs = JobQueue(runtime)

    async def job_queued(event_type: str | None, body: Mapping[str, Any]) -> None:
        if event_type == "DELETED":
            meta = body["metadata"]
            jobs.forget((str(meta["namespace"]), str(meta["name"])))
        elif decide_needs_binding(body):
            await jobs.queue_or_retry(body)

    # A step of the operator's AgentJob watch (helmhive.controller.jobs.watch), not a Kopf handler:
    # Kopf's create/resume handlers patched bookkeeping annotations onto every job. Listed jobs
    # (after a restart) come too, and binding is idempotent (a bound job is skipped).
    runtime.job_events.subscribe("queue", job_queued)

    @kopf.on.event(GROUP, VERSION, "workspaces")
    async def wake_jobs_on_workspace(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        if event.get("type") != "DELETED":
            meta = body["metadata"]
            jobs.wake(Reference(kind=ReferenceKind.WORKSPACE, namespace=meta["namespace"], name=meta["name"]))

    @kopf.on.event(GROUP, VERSION, "profiles")
    async def wake_jobs_on_profile(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        if event.get("type") != "DELETED":
            meta = body["metadata"]
            jobs.wake(Reference(kind=ReferenceKind.PROFILE, namespace=meta["namespace"], name=meta["name"]))

    @kopf.on.cleanup()
    async def stop_job_deadlines(**_: Any) -> None:
        await runtime.deadlines.stop()
        await runtime.reads.close()

    return jobs

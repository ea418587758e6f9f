"""What routing knows about runners, pools, namespaces and jobs, built from Kubernetes objects. Pure.

The operator's router (from Kopf indexes) and ``helmhive explain-routing`` (from lists) both
build :func:`helmhive.policy.routing.route.decide_route`'s inputs with these functions, so a dry
run and the real decision see the same facts:

- :func:`parse_runner`, :func:`parse_pool`, :func:`match_label_selector`, :func:`decide_pool_serves`,
  :func:`build_runner_view`, :func:`build_runner_views`: the fleet as a job's namespace sees it
  (they live in :mod:`helmhive.policy.routing.fleet` and are re-exported here);
- :func:`decide_active_jobs`: active jobs per runner, counted from the jobs themselves (the runner
  each holds is :attr:`helmhive.policy.agentjob.life.AgentJob.held_runner`);
- :func:`parse_queued_job`: a job that awaits a decision (whether it does:
  :attr:`helmhive.policy.agentjob.life.AgentJob.needs_routing`);
- :func:`parse_session_binding`: a SessionBinding with a stored session, for the session tie-break;
- :func:`parse_memory_record`: a MemoryRecord that may be injected (its ``Active`` is not False);
- :func:`build_route_inputs`, :func:`decide_job_route`: the one way both callers turn those facts
  into a decision for one job (its session bindings, the provider a review avoids).

Nothing here does I/O or reads the clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from helmhive.api.job import AgentJobSpec, ChangeStage, ProfileBinding
from helmhive.api.memory import MemoryRecordSpec
from helmhive.api.profile import SessionScope
from helmhive.api.reasons import ConditionType, Reason
from helmhive.api.session import SessionBindingSpec
from helmhive.policy.agentjob.life import AgentJob, decide_held_runner, parse_agent_job
from helmhive.policy.conditions import find_condition
from helmhive.policy.memory.selection import NamedMemoryRecord
from helmhive.policy.routing.fleet import (
    PoolServing,
    RunnerFacts,
    build_runner_view,
    build_runner_views,
    decide_pool_serves,
    match_label_selector,
    parse_pool,
    parse_runner,
)
from helmhive.policy.routing.route import (
    RoutingDecision,
    RoutingJob,
    RoutingPolicy,
    RunnerKey,
    RunnerView,
    SessionBindingView,
    decide_route,
)
from helmhive.policy.runners.qualification import BLOCKING_REASONS

__all__ = [
    "PoolServing",
    "QueuedJob",
    "RouteInputs",
    "RunnerFacts",
    "build_route_inputs",
    "build_runner_view",
    "build_runner_views",
    "decide_active_jobs",
    "decide_implementation_provider",
    "decide_job_route",
    "decide_pinned_runners",
    "decide_pool_serves",
    "match_label_selector",
    "parse_memory_record",
    "parse_pool",
    "parse_queued_job",
    "parse_runner",
    "parse_session_binding",
]


@dataclass(frozen=True, kw_only=True)
class QueuedJob:
    """An AgentJob with its profile bound, as the router reads it."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    generation: int | None
    spec: AgentJobSpec
    binding: ProfileBinding
    conditions: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 0
    state: AgentJob
    """The job as read (its state and the steps' patches are built from it)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def decide_active_jobs(
    jobs: Iterable[Mapping[str, Any]], *, exclude: Iterable[tuple[str, str]] = ()
) -> dict[RunnerKey, int]:
    """Active jobs per runner, counted from the jobs (assigned and not finished), minus ``exclude``."""
    skip = set(exclude)
    counts: dict[RunnerKey, int] = {}
    for body in jobs:
        meta = body.get("metadata") or {}
        if (meta.get("namespace"), meta.get("name")) in skip:
            continue
        runner = decide_held_runner(body)
        if runner is not None:
            counts[runner] = counts.get(runner, 0) + 1
    return counts


def decide_implementation_provider(body: Mapping[str, Any]) -> tuple[tuple[str, str, int], str] | None:
    """For a change's implementation job with an assignment: ((namespace, change, iteration), provider).

    The iteration is part of the key: each iteration's review avoids its own implementation's provider.
    """
    spec = body.get("spec") or {}
    change = spec.get("change") or {}
    if change.get("stage") != ChangeStage.IMPLEMENTATION.value or not change.get("name"):
        return None
    provider = ((body.get("status") or {}).get("assignment") or {}).get("provider")
    if not provider:
        return None
    namespace = (body.get("metadata") or {}).get("namespace") or ""
    try:
        iteration = int(change.get("iteration") or 1)
    except (TypeError, ValueError):
        return None
    return (str(namespace), str(change["name"]), iteration), str(provider)


def parse_queued_job(body: Mapping[str, Any] | AgentJob) -> QueuedJob | None:
    """Parse a job awaiting routing; None when its spec or profile binding is unusable.

    ``body`` may be the job already read (:func:`~helmhive.policy.agentjob.life.parse_agent_job`), so
    a caller that checked its state first does not read it twice.
    """
    job = body if isinstance(body, AgentJob) else parse_agent_job(body)
    spec, binding = job.spec, job.binding
    if spec is None or binding is None:
        return None
    return QueuedJob(
        namespace=job.namespace,
        name=job.name,
        uid=job.uid,
        resource_version=job.resource_version,
        generation=job.generation,
        spec=spec,
        binding=binding,
        conditions=[dict(c) for c in job.conditions],
        attempts=job.routing_attempts,
        state=job,
    )


def parse_session_binding(body: Mapping[str, Any]) -> SessionBindingView | None:
    """A SessionBinding that holds a stored session (``status.stored``); None otherwise.

    Only a binding with a session to continue makes its runner preferable; an empty one
    (never used, or reset by an administrator) starts a new chain wherever the job runs.
    """
    if not (body.get("status") or {}).get("stored"):
        return None
    try:
        spec = SessionBindingSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None
    scope = f"service:{spec.service}" if spec.scope is SessionScope.SERVICE and spec.service else "workspace"
    return SessionBindingView(
        workspace=spec.workspace,
        profile=spec.profile,
        provider=spec.provider,
        runner_namespace=str((body.get("metadata") or {}).get("namespace", "")),
        runner=spec.runner,
        credential_generation=spec.credential_generation,
        scope=scope,
    )


def parse_memory_record(body: Mapping[str, Any]) -> NamedMemoryRecord | None:
    """A MemoryRecord routing may inject; None when its spec is unusable or its ``Active`` is False.

    ``Active=False`` covers what selection cannot see from the record alone (its service is not
    in the Workspace, or the Workspace is gone). Expiry is checked again at selection time,
    so a record that expired since its condition was written is still left out.
    """
    try:
        spec = MemoryRecordSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None
    active = find_condition((body.get("status") or {}).get("conditions"), ConditionType.ACTIVE)
    if active is not None and active.get("status") == "False":
        return None
    return NamedMemoryRecord(name=str((body.get("metadata") or {}).get("name", "")), spec=spec)


ChangeKey = tuple[str, str, int]
"""(namespace, change, iteration): whose implementation a review must not share a provider with."""


@dataclass(frozen=True, kw_only=True)
class RouteInputs:
    """Everything :func:`decide_route` needs about one job, besides the clock and the policy."""

    job: QueuedJob
    runners: Sequence[RunnerView]
    active_jobs: Mapping[RunnerKey, int]
    bindings: list[SessionBindingView]
    avoid_provider: str | None


def build_route_inputs(
    *,
    job: QueuedJob,
    runners: Sequence[RunnerView],
    active_jobs: Mapping[RunnerKey, int],
    sessions: Iterable[SessionBindingView],
    implementation_provider: Callable[[ChangeKey], str | None],
) -> RouteInputs:
    """The inputs of ``job``'s decision: the router builds them from its indexes, explain-routing from lists.

    ``sessions`` may hold every stored binding: only those of the job's workspace and profile
    are kept (decide_route matches the rest of the key). For a change's review,
    ``implementation_provider`` names the provider of the same iteration's implementation,
    which the review avoids. A qualification probe (:attr:`AgentJob.qualifies`) sees only its runner
    (:func:`decide_pinned_runners`).
    """
    workspace, profile = job.spec.workspace, job.binding.name
    change = job.spec.change
    avoid = None
    if change is not None and change.stage is ChangeStage.REVIEW:
        avoid = implementation_provider((job.namespace, change.name, change.iteration))
    pinned = job.state.qualifies
    return RouteInputs(
        job=job,
        runners=runners if pinned is None else decide_pinned_runners(runners, namespace=job.namespace, name=pinned),
        active_jobs=active_jobs,
        bindings=[v for v in sessions if v.workspace == workspace and v.profile == profile],
        avoid_provider=avoid,
    )


def decide_pinned_runners(runners: Iterable[RunnerView], *, namespace: str, name: str) -> list[RunnerView]:
    """The one runner a qualification probe qualifies, as the probe sees it.

    Qualification's own Schedulable reasons (pending, failed, stale) do not stop its probes, and the
    probe lives in the runner's pool's namespace whether or not the pool serves it. Every other
    reason (offline, draining, unauthenticated…) still does. Any other runner is not considered.
    """
    pinned: list[RunnerView] = []
    for runner in runners:
        if runner.namespace != namespace or runner.name != name:
            continue
        unblock = not runner.schedulable and runner.schedulable_reason in BLOCKING_REASONS
        changes: dict[str, object] = {"serves_namespace": True}
        if unblock:
            changes |= {"schedulable": True, "schedulable_reason": Reason.SCHEDULABLE.value}
        pinned.append(dataclasses.replace(runner, **changes))  # type: ignore[arg-type]
    return pinned


def decide_job_route(inputs: RouteInputs, *, now: dt.datetime, policy: RoutingPolicy | None = None) -> RoutingDecision:
    """:func:`decide_route` for the job of ``inputs``."""
    job = inputs.job
    return decide_route(
        job=RoutingJob(namespace=job.namespace, name=job.name, spec=job.spec),
        binding=job.binding,
        runners=inputs.runners,
        active_jobs=inputs.active_jobs,
        bindings=inputs.bindings,
        now=now,
        avoid_provider=inputs.avoid_provider,
        attempts=job.attempts,
        policy=policy or RoutingPolicy(),
    )

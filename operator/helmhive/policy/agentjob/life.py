"""An AgentJob's life: its state, read once from the object, and one status patch per step. Pure.

The operator, the runner and the CLI fetch a job, call this module and write what it returns;
none of them decides on its own whether a job is bound, assigned, running or finished, or
builds a status field by hand. :func:`parse_agent_job` reads the object once into an
:class:`AgentJob`: the handful of fields every decision needs (metadata, the condition each
type has, the assignment's runner) are read eagerly and cheaply, because the operator asks on
every watch event; the typed models (:class:`~helmhive.api.job.AgentJobSpec`,
:class:`~helmhive.api.job.AgentJobStatus`) are validated on first use, once per object.

A job's life, and the step that writes each move (each returns a :class:`StatusPatch`):

- **bind** (queue step): the profile revision and snapshot, chosen at queue time; a job waiting
  for a reference sheds its waiting ``Routed``/``Ready``. The router writes it together with
  **route**, in one conditional write.
- **wait** (queue step): a reference does not exist yet: ``Routed=False``/``Ready=False`` with
  ``WaitingForWorkspace`` or ``WaitingForProfile``, until a deadline.
- **fail** (queue step): failed closed at queue time (deadline passed, invalid profile…).
- **route** (router): assigned, waiting for capacity, or failed closed
  (:func:`helmhive.policy.routing.step.route`, which builds on
  :func:`helmhive.policy.routing.route.build_status_patch`).
- **start** (runner): ``Running=True``, ``result.startedAt``, the session and memory report.
- **finish** (runner): ``Running=False``, ``Succeeded`` and ``Ready`` with the ending's reason,
  ``result``.
- **lost** (operator, for a runner that cannot): the runner went Offline or was deleted while
  it held the job: ended ``RunnerLost``.
- **requeue** (operator): a job lost, or ended by its runner with an infrastructure reason, that
  :func:`helmhive.policy.agentjob.retry.decide_job_retry` lets run again: only the binding is kept,
  ``attempts`` grows by one, ``Routed=Unknown`` with the failure's reason
  (:mod:`helmhive.policy.agentjob.failed` decides it for a job the runner ended).
- **close** (operator): a job its runner ended with an infrastructure reason that is not run
  again: the verdict (``not re-run: <why>``) is added to its ``Succeeded`` and ``Ready`` messages.

Every step returns a JSON merge patch of only the fields its step owns (``None`` deletes a
field), made conditional by the caller on the resourceVersion the decision was made from (a 409
means re-read and decide again): sent as a merge patch (:meth:`StatusPatch.conditional`), or, by
the router, as a PUT of the whole status it makes (:meth:`StatusPatch.replacement`), which
costs the API server less for the routed job's large status.

Status fields and their writers (one writer per step; a field with two writers has them in
turn: the operator until the runner starts the job, the runner until it ends it, the operator
again only when the runner is lost or the job is re-queued or closed). :data:`DERIVED_FIELDS`
(``observedGeneration`` and kstatus's ``Reconciling`` and ``Stalled`` conditions, derived from the
status a step makes by :func:`~helmhive.policy.agentjob.patch.build_step_patch`) are in no row:
every step writes them, in its own write, when its result changes them; re-queue keeps
``observedGeneration``. :data:`STATUS_WRITERS` is this table as data (a unit test keeps them equal)::

    field                  writer    steps
    profile                operator  bind, route
    routing                operator  route, requeue
    assignment             operator  route, requeue
    attempts               operator  requeue
    session                runner    start
    session                operator  requeue
    result                 runner    start, finish
    result                 operator  lost, requeue
    conditions[Routed]     operator  bind, wait, fail, route, requeue
    conditions[Ready]      operator  bind, wait, fail, route, lost, requeue, close
    conditions[Ready]      runner    start, finish
    conditions[Running]    runner    start, finish
    conditions[Running]    operator  lost, requeue
    conditions[Succeeded]  runner    finish
    conditions[Succeeded]  operator  lost, requeue, close

(``requeue`` writes a field by deleting it: the job starts over as a bound job.)

This module is the one place of this overview and table, and the import path for all of it; the
parts live in :mod:`helmhive.policy.agentjob.state` (the job read once, its state),
:mod:`helmhive.policy.agentjob.patch` (steps, writers, :class:`StatusPatch`) and
:mod:`helmhive.policy.agentjob.steps` (one function per step).
"""

from __future__ import annotations

from helmhive.policy.agentjob.patch import (
    DERIVED_FIELDS,
    STATUS_WRITERS,
    STEP_WRITERS,
    StatusPatch,
    Step,
    Writer,
    apply_merge_patch,
    build_step_patch,
    written_fields,
)
from helmhive.policy.agentjob.state import (
    AgentJob,
    RunnerKey,
    decide_finished,
    decide_held_runner,
    decide_needs_binding,
    decide_needs_routing,
    parse_agent_job,
)
from helmhive.policy.agentjob.steps import (
    NOT_RERUN,
    LostOutcome,
    bind,
    close,
    decide_lost,
    fail,
    finish,
    lost,
    requeue,
    start,
    wait,
)

__all__ = [
    "DERIVED_FIELDS",
    "NOT_RERUN",
    "STATUS_WRITERS",
    "STEP_WRITERS",
    "AgentJob",
    "LostOutcome",
    "RunnerKey",
    "StatusPatch",
    "Step",
    "Writer",
    "apply_merge_patch",
    "bind",
    "build_step_patch",
    "close",
    "decide_finished",
    "decide_held_runner",
    "decide_lost",
    "decide_needs_binding",
    "decide_needs_routing",
    "fail",
    "finish",
    "lost",
    "parse_agent_job",
    "requeue",
    "start",
    "wait",
    "written_fields",
]

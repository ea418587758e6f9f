"""``explain-routing``'s questions to the cluster: read what the router sees, bind, decide; all bounded.

Owns the read-only API calls (GET and LIST, through the operator's door ``helmhive.controller.kube.door``
on a client loaded by :func:`helmhive.cli.kubeapi.load_api_client`): the job (or the manifest's
body), Runners and RunnerPools (all namespaces, else the job's when that is all the caller may
list), the job namespace's labels, every AgentJob, SessionBindings and MemoryRecords. It binds the
profile in memory with the queue step's own :func:`~helmhive.controller.jobs.binding.bind_profile` and
decides with the router's :func:`~helmhive.policy.routing.inputs.decide_job_route`; it never writes.

Timeouts (:func:`ask`): ``seconds`` (``$HELMHIVE_CLI_TIMEOUT_SECONDS``, as for every command) bounds
each call's connect and each read, and all of the command's calls together too, since it makes
several and the client retries an answer that asks for it. An API server that cannot be reached,
does not answer in time or answers that it is unavailable (429 or 5xx, after the client's bounded
retries) is a :class:`NoAnswer`, worded as for the other commands
(:func:`~helmhive.cli.kubeapi.describe_no_answer`, :func:`~helmhive.cli.kubeapi.describe_unavailable`).
No Kopf.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from pydantic import ValidationError

from helmhive.api.job import AgentJobSpec
from helmhive.api.kinds import kind_by_name
from helmhive.api.reasons import Reason
from helmhive.cli.explain_manifest import UsageError, check_shape, describe_spec_problems
from helmhive.cli.explain_output import Explanation, QueueStop
from helmhive.cli.kubeapi import describe_no_answer, describe_unavailable, server_address
from helmhive.controller.jobs.binding import FailClosed, ProfileRevisionPending, bind_profile
from helmhive.controller.kube.door import Forbidden, Kube, KubeError, NotFound, Unavailable
from helmhive.controller.runtime import Runtime, utc_now
from helmhive.policy.memory.selection import select_memory
from helmhive.policy.routing.inputs import (
    QueuedJob,
    RouteInputs,
    build_route_inputs,
    build_runner_views,
    decide_active_jobs,
    decide_implementation_provider,
    decide_job_route,
    parse_memory_record,
    parse_pool,
    parse_queued_job,
    parse_runner,
    parse_session_binding,
)

__all__ = ["NoAnswer", "ask", "explain"]

AGENT_JOB = kind_by_name("AgentJob")
RUNNER = kind_by_name("Runner")
POOL = kind_by_name("RunnerPool")
MEMORY = kind_by_name("MemoryRecord")
SESSION = kind_by_name("SessionBinding")

P = ParamSpec("P")
T = TypeVar("T")


class NoAnswer(Exception):
    """The API server could not be reached, did not answer in time or answered that it is unavailable: exit 4."""


class _DaemonThreads(Executor):
    """Runs each API call on a thread of its own that never holds the process open.

    Once the deadline gives up on a call, the command reports and exits; a thread still
    blocked on a silent socket must not keep it alive (the per-request timeouts end it later).
    """

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=work, name="explain-routing-api", daemon=True).start()
        return future


async def _list(kube: Kube, kind: Any, namespace: str, notes: list[str]) -> list[dict[str, Any]]:
    """List ``kind`` in every namespace, or only in ``namespace`` when that is all the caller may read."""
    try:
        return await kube.list(kind, None)
    except Forbidden:
        notes.append(f"{kind.plural}: listed in {namespace} only (no permission to list all namespaces)")
        return await kube.list(kind, namespace)


async def explain(
    *, kube: Kube, job_name: str | None, manifest: dict[str, Any] | None, namespace: str
) -> Explanation | QueueStop:
    """Gather what the router sees and decide, without writing anything."""
    notes: list[str] = []
    stored: dict[str, Any] = {}
    if manifest is not None:
        check_shape(manifest, "")
        body = dict(manifest)
        meta = dict(body.get("metadata") or {})
        meta["namespace"] = namespace
        meta["name"] = meta.get("name") or "dry-run"
        body["metadata"] = meta
        source = "manifest"
    else:
        assert job_name is not None
        try:
            body = await kube.get(AGENT_JOB, job_name, namespace=namespace)
        except NotFound:
            raise UsageError(f"agentjob {namespace}/{job_name} not found") from None
        check_shape(body, f"agentjob {namespace}/{job_name}: ")
        source = "cluster"
        status = body.get("status") or {}
        stored = {k: status[k] for k in ("assignment", "routing", "conditions") if k in status}

    def stop(reason: Reason, message: str, *, deadline: Reason | None = None, hint: str = "") -> QueueStop:
        name = str(body["metadata"].get("name") or job_name or "")
        return QueueStop(
            namespace=namespace,
            name=name,
            source=source,
            reason=reason,
            message=message,
            deadline_reason=deadline,
            hint=hint,
            stored=stored,
            notes=notes,
        )

    try:
        spec = AgentJobSpec.model_validate(dict(body.get("spec") or {}))
    except ValidationError as err:
        return stop(Reason.INVALID_SPEC, describe_spec_problems(err))
    status = dict(body.get("status") or {})
    if not status.get("profile"):
        try:
            status["profile"] = await bind_profile(Runtime(kube=kube), body, spec=spec)
        except FailClosed as closed:
            if closed.missing is not None:
                # GitOps order: a reference that does not exist yet is waited for, not a failure.
                return stop(
                    closed.missing.waiting_reason,
                    closed.message,
                    deadline=closed.reason,
                    hint=(
                        " (it is bound and routed as soon as that exists; at its deadline, "
                        f"--reference-wait-seconds after creation, it fails closed {closed.reason.value})"
                    ),
                )
            return stop(closed.reason, closed.message)
        except ProfileRevisionPending as pending:
            missing = pending.missing
            return stop(missing.waiting_reason, missing.message, deadline=missing.final_reason)
        notes.append("profile bound in memory, as the queue step would bind it")
    body["status"] = status
    job = parse_queued_job(body)
    if job is None:
        raise UsageError("status.profile: not a valid profile binding")

    inputs = await _gather(kube, job, namespace, notes)
    now = utc_now()
    decision = decide_job_route(inputs, now=now)
    memory_ids: list[str] = []
    if decision.choice is not None:
        records = [r for r in (parse_memory_record(b) for b in await kube.list(MEMORY, namespace)) if r]
        memory_ids = select_memory(
            records=sorted(records, key=lambda r: r.name),
            workspace=job.spec.workspace,
            service=job.spec.service,
            policy=job.binding.snapshot.memory,
            job_kind=job.spec.job_kind,
            now=now,
        ).ids
    return Explanation(
        namespace=job.namespace,
        name=job.name,
        source=source,
        binding=job.binding,
        decision=decision,
        memory_ids=memory_ids,
        stored=stored,
        notes=notes,
    )


async def _gather(kube: Kube, job: QueuedJob, namespace: str, notes: list[str]) -> RouteInputs:
    """What the router would see for ``job``, from lists, through the router's own input builder."""
    runners = [f for f in (parse_runner(r) for r in await _list(kube, RUNNER, namespace, notes)) if f]
    pools = {p.key: p for p in (parse_pool(b) for b in await _list(kube, POOL, namespace, notes)) if p}
    jobs = await _list(kube, AGENT_JOB, namespace, notes)
    try:
        labels: dict[str, str] | None = dict(
            ((await kube.read_namespace(namespace)).get("metadata") or {}).get("labels") or {}
        )
    except Unavailable:
        raise
    except KubeError:
        labels = None
        notes.append(f"namespace {namespace}: labels unreadable; only pools in it are counted as serving it")
    providers = dict(f for f in (decide_implementation_provider(j) for j in jobs) if f)
    sessions = [v for v in (parse_session_binding(b) for b in await _list(kube, SESSION, namespace, notes)) if v]
    return build_route_inputs(
        job=job,
        runners=build_runner_views(runners=runners, pools=pools, job_namespace=namespace, namespace_labels=labels),
        active_jobs=decide_active_jobs(jobs, exclude=[(job.namespace, job.name)]),
        sessions=sessions,
        implementation_provider=providers.get,
    )


def ask(
    *, api_client: Any, seconds: float, job_name: str | None, manifest: dict[str, Any] | None, namespace: str
) -> Explanation | QueueStop:
    """:func:`explain`, every API call bounded by ``seconds`` (connect and read), and all of them together too.

    Raises :class:`NoAnswer` for a server that cannot be reached, is silent or unavailable; a
    :class:`~helmhive.api.kubeerrors.KubeError` for a request it refused.
    """
    kube = Kube(api_client, executor=_DaemonThreads(), request_timeout=(seconds, seconds))
    server = server_address(str(api_client.configuration.host))

    async def bounded() -> Explanation | QueueStop:
        try:
            async with asyncio.timeout(seconds):
                return await explain(kube=kube, job_name=job_name, manifest=manifest, namespace=namespace)
        except TimeoutError as exc:
            raise NoAnswer(describe_no_answer(exc, server=server, timeout=seconds)) from None

    try:
        return asyncio.run(bounded())
    except Unavailable as err:
        if err.status == 0:  # no answer: the door chained what the client raised
            raise NoAnswer(describe_no_answer(err.__cause__ or err, server=server, timeout=seconds)) from None
        raise NoAnswer(describe_unavailable(err.status, err.message)) from None

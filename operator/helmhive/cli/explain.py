"""``helmhive explain-routing``: why a job was (or would be) routed where it was, from the live cluster.

    helmhive explain-routing JOB [-n NS]          an existing job
    helmhive explain-routing -f job.yaml [-n NS]  a dry run of a manifest
    ... [--output table|json] [--kubeconfig PATH]

Reads only (GET and LIST); it never writes anything. It gathers what the operator's router
sees — Runners and RunnerPools (all namespaces), the job's namespace labels, every AgentJob
(active jobs per runner are counted from them), MemoryRecords and SessionBindings — and calls
the same pure :func:`~helmhive.policy.routing.decide_route`. For an existing job it shows the
stored decision (``status.routing``, ``status.assignment``, conditions) next to a fresh one
for the runners as they are now, not counting the job against its own runner. For a manifest
it binds the profile in memory exactly as the queue step would.

Exit status: 0 when the (fresh) decision assigns a runner, 3 when the job would wait (for
capacity, or at queue time for a Workspace or Profile that does not exist yet), 1 when it fails
closed, 2 for a usage error or an unreadable job or manifest. No Kopf: the binding is the queue
step's own :func:`~helmhive.controller.binding.bind_profile`.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from helmhive.api.job import ProfileBinding
from helmhive.api.kinds import kind_by_name
from helmhive.api.manifest_yaml import ManifestLoader
from helmhive.controller.binding import FailClosed, ProfileRevisionPending, bind_profile
from helmhive.controller.kube import Forbidden, Kube, KubeError, NotFound, load_api_client
from helmhive.controller.runtime import Runtime, utc_now
from helmhive.policy.conditions import find_condition
from helmhive.policy.memory import select_memory
from helmhive.policy.routing import (
    RouteOutcome,
    RoutingDecision,
    build_assignment,
)
from helmhive.policy.routing_inputs import (
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

__all__ = ["ExplainFormat", "run"]

AGENT_JOB = kind_by_name("AgentJob")
RUNNER = kind_by_name("Runner")
POOL = kind_by_name("RunnerPool")
MEMORY = kind_by_name("MemoryRecord")
SESSION = kind_by_name("SessionBinding")
_EXIT = {RouteOutcome.ASSIGNED: 0, RouteOutcome.FAILED: 1, RouteOutcome.WAITING: 3}


class ExplainFormat(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


class _Usage(Exception):
    """A problem with what was asked: printed without a traceback, exit status 2."""


class _Waiting(Exception):
    """The job waits at queue time for a Workspace or Profile that does not exist yet: exit status 3."""


@dataclass(frozen=True, kw_only=True)
class Explanation:
    """Everything ``explain-routing`` prints."""

    namespace: str
    name: str
    source: str
    binding: ProfileBinding
    decision: RoutingDecision
    memory_ids: list[str]
    stored: dict[str, Any]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        decision = self.decision
        choice = decision.choice
        return {
            "job": {"namespace": self.namespace, "name": self.name, "source": self.source},
            "profile": {"name": self.binding.name, "revision": self.binding.revision},
            "decision": {
                "outcome": decision.outcome.value,
                "reason": decision.reason.value,
                "message": decision.message,
                "assignment": None
                if choice is None
                else {
                    **build_assignment(choice=choice, memory_ids=self.memory_ids, now=None),
                    "resumesSession": choice.resumes_session,
                },
                "consideredRunners": decision.considered_runners,
                "candidates": [c.to_wire() for c in decision.candidates],
                "retryAfterSeconds": decision.retry_after,
                "capacityDeadline": decision.capacity_deadline.isoformat() if decision.capacity_deadline else None,
                "avoidedProvider": decision.avoided_provider,
            },
            "stored": self.stored,
            "notes": self.notes,
        }


def _context_namespace(kubeconfig: Path | None) -> str:
    """The namespace of the current kubeconfig context, the pod's own in a cluster, else ``default``."""
    path = kubeconfig or (Path(os.environ["KUBECONFIG"].split(os.pathsep)[0]) if os.environ.get("KUBECONFIG") else None)
    if path is None:
        in_pod = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        if in_pod.exists():
            return in_pod.read_text(encoding="utf-8").strip() or "default"
        path = Path.home() / ".kube" / "config"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return "default"
    current = doc.get("current-context")
    for entry in doc.get("contexts") or []:
        if entry.get("name") == current:
            return str((entry.get("context") or {}).get("namespace") or "default")
    return "default"


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        docs = [d for d in yaml.load_all(path.read_text(encoding="utf-8"), Loader=ManifestLoader) if d]
    except (OSError, yaml.YAMLError) as err:
        raise _Usage(f"cannot read {path}: {err}") from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "AgentJob"]
    if len(jobs) != 1:
        raise _Usage(f"{path} must hold exactly one AgentJob (found {len(jobs)})")
    return jobs[0]


async def _list(kube: Kube, kind: Any, namespace: str, notes: list[str]) -> list[dict[str, Any]]:
    """List ``kind`` in every namespace, or only in ``namespace`` when that is all the caller may read."""
    try:
        return await kube.list(kind, None)
    except Forbidden:
        notes.append(f"{kind.plural}: listed in {namespace} only (no permission to list all namespaces)")
        return await kube.list(kind, namespace)


async def explain(*, kube: Kube, job_name: str | None, manifest: dict[str, Any] | None, namespace: str) -> Explanation:
    """Gather what the router sees and decide, without writing anything."""
    notes: list[str] = []
    stored: dict[str, Any] = {}
    if manifest is not None:
        body = dict(manifest)
        meta = dict(body.get("metadata") or {})
        meta["namespace"] = namespace
        meta.setdefault("name", "dry-run")
        body["metadata"] = meta
        source = "manifest"
    else:
        assert job_name is not None
        try:
            body = await kube.get(AGENT_JOB, job_name, namespace=namespace)
        except NotFound:
            raise _Usage(f"agentjob {namespace}/{job_name} not found") from None
        source = "cluster"
        status = body.get("status") or {}
        stored = {k: status[k] for k in ("assignment", "routing", "conditions") if k in status}
    status = dict(body.get("status") or {})
    if not status.get("profile"):
        try:
            status["profile"] = await bind_profile(Runtime(kube=kube), body)
        except FailClosed as closed:
            if closed.missing is not None:
                # GitOps order: a reference that does not exist yet is waited for, not a failure.
                raise _Waiting(
                    f"the job waits at queue time: {closed.missing.waiting_reason.value}: {closed.message} "
                    f"(it is bound and routed as soon as that exists; at its deadline, "
                    f"--reference-wait-seconds after creation, it fails closed {closed.reason.value})"
                ) from None
            raise _Usage(f"the job fails closed at queue time: {closed.reason.value}: {closed.message}") from None
        except ProfileRevisionPending as pending:
            raise _Waiting(
                f"the job waits at queue time: {pending.missing.waiting_reason.value}: {pending.missing.message}"
            ) from None
        notes.append("profile bound in memory, as the queue step would bind it")
    body["status"] = status
    job = parse_queued_job(body)
    if job is None:
        raise _Usage("the job's spec or profile binding is not valid")

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


def _render(explanation: Explanation, console: Console) -> None:
    decision = explanation.decision
    colour = {RouteOutcome.ASSIGNED: "green", RouteOutcome.WAITING: "yellow", RouteOutcome.FAILED: "red"}[
        decision.outcome
    ]
    console.print(
        f"AgentJob {explanation.namespace}/{explanation.name} ({explanation.source}), profile "
        f"{explanation.binding.name} revision {explanation.binding.revision}"
    )
    stored = explanation.stored
    if stored:
        routed = find_condition(stored.get("conditions"), "Routed")
        assignment = stored.get("assignment")
        if assignment:
            console.print(
                f"Stored: assigned to {assignment.get('runnerNamespace', explanation.namespace)}/"
                f"{assignment['runner']} with {assignment['provider']} {assignment['model']} "
                f"({assignment['modelSource']}), memory {assignment.get('memoryIds') or []}"
            )
        elif routed is not None:
            console.print(f"Stored: Routed={routed.get('status')} {routed.get('reason')}: {routed.get('message')}")
        console.print("Now (dry run, this job not counted against its runner):")
    headline = decision.outcome.value
    if decision.reason.value != headline:
        headline += f": {decision.reason.value}"
    console.print(f"[bold {colour}]{headline}[/]", highlight=False)
    console.print(decision.message, highlight=False, markup=False)
    choice = decision.choice
    if choice is not None:
        effort = choice.effort.value if choice.effort else "-"
        console.print(
            f"runner {choice.runner_namespace}/{choice.runner} (pool {choice.pool}), provider {choice.provider}, "
            f"model {choice.model} ({choice.model_source.value}), effort {effort}, mapping {choice.mapping_index}, "
            f"credential generation {choice.credential_generation}, memory {explanation.memory_ids}",
            highlight=False,
            markup=False,
        )
    if decision.retry_after is not None and decision.capacity_deadline is not None:
        console.print(f"retry in {decision.retry_after:g}s; deadline {decision.capacity_deadline.isoformat()}")
    table = Table(title=f"Candidates ({len(decision.candidates)} of {decision.considered_runners} runners)")
    for column in ("Runner", "Namespace", "Provider", "Mapping", "Model", "Reason"):
        table.add_column(column)
    for candidate in decision.candidates:
        table.add_row(
            candidate.runner,
            candidate.namespace or "",
            candidate.provider or "",
            "" if candidate.mapping_index is None else str(candidate.mapping_index),
            candidate.model or "",
            candidate.reason,
        )
    console.print(table)
    for note in explanation.notes:
        console.print(f"note: {note}", style="dim", markup=False)


def run(
    job: Annotated[str | None, typer.Argument(metavar="JOB", help="The AgentJob to explain.")] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", metavar="NS", help="Namespace (default: the context's).")
    ] = None,
    filename: Annotated[
        Path | None,
        typer.Option("--filename", "-f", metavar="FILE", help="Dry-run this AgentJob manifest instead."),
    ] = None,
    output: Annotated[ExplainFormat, typer.Option("--output", "-o", metavar="table|json")] = ExplainFormat.TABLE,
    kubeconfig: Annotated[Path | None, typer.Option("--kubeconfig", metavar="PATH", help="Kubeconfig file.")] = None,
) -> None:
    """Explain the routing decision for a job (or a manifest, as a dry run): the choice and every candidate."""
    if (job is None) == (filename is None):
        typer.echo("error: give a JOB name or -f FILE (one of them)", err=True)
        raise typer.Exit(2)
    try:
        manifest = _read_manifest(filename) if filename is not None else None
        ns = (
            namespace
            or str(((manifest or {}).get("metadata") or {}).get("namespace") or "")
            or _context_namespace(kubeconfig)
        )
        kube = Kube(load_api_client(str(kubeconfig) if kubeconfig else None))
        explanation = asyncio.run(explain(kube=kube, job_name=job, manifest=manifest, namespace=ns))
    except _Usage as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except _Waiting as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(3) from None
    except KubeError as err:
        typer.echo(f"error: the API server refused: {err}", err=True)
        raise typer.Exit(2) from None
    if output is ExplainFormat.JSON:
        typer.echo(json.dumps(explanation.to_json(), indent=2))
    else:
        _render(explanation, Console(width=160))
    raise typer.Exit(_EXIT[explanation.decision.outcome])

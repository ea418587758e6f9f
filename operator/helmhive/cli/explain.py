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
closed or when the API server could not be reached, did not answer within
``HELMHIVE_EXPLAIN_TIMEOUT_SECONDS`` (default 30, all calls together) or answered that it is
unavailable (nothing is printed on stdout then), 2 for a usage error, a kubeconfig that cannot
be loaded, an unreadable or malformed job or manifest, a request the API server refused, or a
job that fails closed at queue time (an invalid spec, a profile that cannot be bound). With
``-o json`` every outcome (assigned, waiting, failing closed, at queue time too) is one JSON
object on stdout. No Kopf: the binding is the queue step's own
:func:`~helmhive.controller.binding.bind_profile`.

Bad input never prints a traceback: one line on stderr says what and, for a manifest, where
(``metadata: must be a mapping``, ``spec.jobKind: Input should be …``). Text that comes from
objects (names, messages, reasons) is printed as plain text: rich markup in it is escaped and
terminal control characters are dropped.
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from helmhive.api.job import AgentJobSpec, ProfileBinding
from helmhive.api.kinds import kind_by_name
from helmhive.api.manifest_yaml import ManifestLoader
from helmhive.api.reasons import Reason
from helmhive.controller.binding import FailClosed, ProfileRevisionPending, bind_profile
from helmhive.controller.kube import Forbidden, Kube, KubeError, NotFound, Unavailable, load_api_client
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
from helmhive.policy.violations import field_path

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "TIMEOUT_ENV", "ExplainFormat", "run"]

AGENT_JOB = kind_by_name("AgentJob")
RUNNER = kind_by_name("Runner")
POOL = kind_by_name("RunnerPool")
MEMORY = kind_by_name("MemoryRecord")
SESSION = kind_by_name("SessionBinding")
_EXIT = {RouteOutcome.ASSIGNED: 0, RouteOutcome.FAILED: 1, RouteOutcome.WAITING: 3}
_EXIT_UNREACHABLE = 1  # as the other cluster commands exit on a failed API call (helmhive.cli.kubeapi)

TIMEOUT_ENV = "HELMHIVE_EXPLAIN_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_SECONDS = 30.0
"""How long all of the command's API calls may take together (connect and read)."""

_SPEC_PROBLEMS_SHOWN = 5
_TOO_DEEP = "nested too deeply to read (collections inside collections, hundreds of levels)"
_IN_POD_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# ESC sequences (CSI, OSC/DCS/SOS/PM/APC strings, two-character ones), C1's CSI, then any other C0
# (but tab and newline), DEL and C1 character.
_CONTROL = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?|[ -/]*[0-~]?)"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)

P = ParamSpec("P")
T = TypeVar("T")


class ExplainFormat(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


class _Usage(Exception):
    """A problem with what was asked: printed without a traceback, exit status 2."""


class _BadKubeconfig(Exception):
    """No client could be loaded: printed as ``cannot load kubeconfig: …``, exit status 2 (as ``sessions``)."""


class _NoAnswer(Exception):
    """The API server could not be reached, did not answer in time, or is unavailable: exit status 1."""


def _plain(text: object) -> str:
    """``text`` without terminal control characters (C0 but tab and newline, DEL, C1, ESC sequences)."""
    return _CONTROL.sub("", str(text))


def _markup_safe(text: object) -> str:
    """``text`` for a rich string that holds markup: control characters dropped, markup escaped."""
    return escape(_plain(text))


def _a(value: object) -> str:
    """How a YAML value's type is named in a message."""
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line for a YAML error: the position and the problem, never the text around it (it may be a secret)."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    return f"{where}{problem}"


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


@dataclass(frozen=True, kw_only=True)
class QueueStop:
    """The job stops at queue time, before routing: it waits for a Workspace or Profile, or fails closed.

    ``deadline_reason`` is set while it waits: the reason it fails closed with at its deadline.
    """

    namespace: str
    name: str
    source: str
    reason: Reason
    message: str
    deadline_reason: Reason | None = None
    hint: str = ""
    stored: dict[str, Any]
    notes: list[str]

    @property
    def waiting(self) -> bool:
        return self.deadline_reason is not None

    @property
    def outcome(self) -> str:
        """``WaitingForWorkspace``/``WaitingForProfile`` while it waits, else ``Failed``."""
        return self.reason.value if self.waiting else RouteOutcome.FAILED.value

    @property
    def exit_code(self) -> int:
        return 3 if self.waiting else 2

    def line(self) -> str:
        if self.waiting:
            return f"the job waits at queue time: {self.reason.value}: {self.message}{self.hint}"
        return f"error: the job fails closed at queue time: {self.reason.value}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        """The routed case's shape: no profile bound, no candidates; ``stage`` and ``deadlineReason`` added."""
        return {
            "job": {"namespace": self.namespace, "name": self.name, "source": self.source},
            "profile": None,
            "decision": {
                "stage": "queue",
                "outcome": self.outcome,
                "reason": self.reason.value,
                "message": self.message,
                "deadlineReason": self.deadline_reason.value if self.deadline_reason else None,
                "assignment": None,
                "consideredRunners": 0,
                "candidates": [],
                "retryAfterSeconds": None,
                "capacityDeadline": None,
                "avoidedProvider": None,
            },
            "stored": self.stored,
            "notes": self.notes,
        }


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


# Reading what was asked ---------------------------------------------------------------


def _check_shape(body: dict[str, Any], where: str) -> None:
    """Refuse an AgentJob whose top-level fields have the wrong type, naming the field."""
    for key in ("metadata", "spec", "status"):
        value = body.get(key)
        if value is not None and not isinstance(value, dict):
            raise _Usage(f"{where}{key}: must be a mapping (found {_a(value)})")
    meta = body.get("metadata") or {}
    for key in ("name", "namespace"):
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            raise _Usage(f"{where}metadata.{key}: must be a string (found {_a(value)})")


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise _Usage(f"cannot read {path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    except OSError as err:
        raise _Usage(f"cannot read {path}: {err.strerror or err}") from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=ManifestLoader) if d]
    except yaml.YAMLError as err:
        raise _Usage(f"cannot read {path}: {_yaml_problem(err)}") from None
    except RecursionError:
        raise _Usage(f"cannot read {path}: {_TOO_DEEP}") from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "AgentJob"]
    if len(jobs) != 1:
        raise _Usage(f"{path} must hold exactly one AgentJob (found {len(jobs)})")
    _check_shape(jobs[0], f"{path}: ")
    return jobs[0]


def _manifest_namespace(manifest: dict[str, Any] | None, namespace: str | None) -> str | None:
    """The namespace asked for: ``-n``, else the manifest's; refused when the two differ (as kubectl does)."""
    ours = ((manifest or {}).get("metadata") or {}).get("namespace") or None
    if namespace and ours and namespace != ours:
        raise _Usage(
            f'the namespace from the provided object "{ours}" does not match the namespace "{namespace}". '
            f"You must pass '--namespace={ours}' to perform this operation."
        )
    return namespace or ours


def _timeout_seconds() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise _Usage(f"{TIMEOUT_ENV}={raw!r}: must be a positive number of seconds")
    return seconds


def _kubeconfig_path(kubeconfig: Path | None) -> str | None:
    """The kubeconfig to load, as kubectl finds it: ``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``.

    None: the pod's in-cluster identity.
    """
    if kubeconfig is not None:
        return str(kubeconfig)
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    try:
        default = Path.home() / ".kube" / "config"
    except (RuntimeError, KeyError):  # no home directory to look in
        return None
    return str(default) if default.is_file() else None


def _load_client(path: str | None) -> Any:
    if path is not None and not any(Path(one).exists() for one in path.split(os.pathsep) if one):
        raise _BadKubeconfig(f"{path}: no such file")
    try:
        return load_api_client(path)
    except Exception as err:  # the loader raises ConfigException, binascii.Error, TypeError, ...: all mean the same
        if isinstance(err, yaml.YAMLError):
            reason = _yaml_problem(err)
        elif isinstance(err, UnicodeDecodeError):
            reason = f"not UTF-8 text (byte {err.start}: {err.reason})"
        elif type(err).__name__ == "ConfigException":  # the loader's own words (no kubernetes import here)
            reason = str(err)
        else:  # a file of another shape: a list, a base64 field that is not base64, ...
            reason = f"not a valid kubeconfig: {err or type(err).__name__}"
        if path is None:
            raise _BadKubeconfig(
                f"no --kubeconfig, $KUBECONFIG or ~/.kube/config, and not in a cluster ({reason})"
            ) from None
        raise _BadKubeconfig(f"{path}: {reason}") from None


def _context_namespace(path: str | None) -> str:
    """The namespace of the current kubeconfig context, the pod's own in a cluster, else ``default``.

    ``path`` was loaded already; a part of it that is not what a kubeconfig holds is ignored here.
    """
    if path is None:
        try:
            return _IN_POD_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
        except (OSError, UnicodeDecodeError):
            return "default"
    configs: list[dict[str, Any]] = []
    for one in path.split(os.pathsep):
        try:
            doc = yaml.safe_load(Path(one).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
            continue
        if isinstance(doc, dict):
            configs.append(doc)
    # Merged as kubectl merges $KUBECONFIG: the first file to set a value wins.
    current = next((c.get("current-context") for c in configs if c.get("current-context")), None)
    for config in configs:
        contexts = config.get("contexts")
        for entry in contexts if isinstance(contexts, list) else []:
            if isinstance(entry, dict) and entry.get("name") == current:
                context = entry.get("context")
                found = context.get("namespace") if isinstance(context, dict) else None
                return found if isinstance(found, str) and found else "default"
    return "default"


def _spec_problems(err: ValidationError) -> str:
    """Every model error as ``spec.<field>: <message>`` (the wire's camelCase), the first few of them."""
    problems = []
    for error in err.errors():
        loc = [p for p in error["loc"] if isinstance(p, str | int)]
        message = error["msg"]
        if error["type"] == "value_error":
            message = str(error.get("ctx", {}).get("error", message))
        problems.append(f"{field_path('spec', *loc)}: {message}")
    text = "; ".join(problems[:_SPEC_PROBLEMS_SHOWN])
    if len(problems) > _SPEC_PROBLEMS_SHOWN:
        text += f" (and {len(problems) - _SPEC_PROBLEMS_SHOWN} more)"
    return text


# Asking the cluster -------------------------------------------------------------------


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
        _check_shape(manifest, "")
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
            raise _Usage(f"agentjob {namespace}/{job_name} not found") from None
        _check_shape(body, f"agentjob {namespace}/{job_name}: ")
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
        return stop(Reason.INVALID_SPEC, _spec_problems(err))
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
        raise _Usage("status.profile: not a valid profile binding")

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


def _ask(
    *, api_client: Any, seconds: float, job_name: str | None, manifest: dict[str, Any] | None, namespace: str
) -> Explanation | QueueStop:
    """:func:`explain`, every API call bounded: each by ``seconds`` (connect and read), all of them together too."""
    kube = Kube(api_client, executor=_DaemonThreads(), request_timeout=(seconds, seconds))

    async def bounded() -> Explanation | QueueStop:
        try:
            async with asyncio.timeout(seconds):
                return await explain(kube=kube, job_name=job_name, manifest=manifest, namespace=namespace)
        except TimeoutError:
            raise _NoAnswer(f"the API server did not answer within {seconds:g} s") from None

    try:
        return asyncio.run(bounded())
    except Unavailable as err:
        if err.status == 0:
            raise _NoAnswer(f"the API server could not be reached: {err.message}") from None
        raise _NoAnswer(f"the API server is unavailable: {err.status} {err.message}") from None


# Printing -----------------------------------------------------------------------------


def _render(explanation: Explanation, console: Console) -> None:
    """The explanation as text; every value from an object is shown as it is, never as markup."""
    decision = explanation.decision
    safe = _markup_safe
    colour = {RouteOutcome.ASSIGNED: "green", RouteOutcome.WAITING: "yellow", RouteOutcome.FAILED: "red"}[
        decision.outcome
    ]
    console.print(
        f"AgentJob {safe(explanation.namespace)}/{safe(explanation.name)} ({explanation.source}), profile "
        f"{safe(explanation.binding.name)} revision {safe(explanation.binding.revision)}",
        highlight=False,
    )
    stored = explanation.stored
    if stored:
        routed = find_condition(stored.get("conditions"), "Routed")
        assignment = stored.get("assignment")
        if isinstance(assignment, dict) and assignment:
            console.print(
                _plain(
                    f"Stored: assigned to {assignment.get('runnerNamespace', explanation.namespace)}/"
                    f"{assignment.get('runner')} with {assignment.get('provider')} {assignment.get('model')} "
                    f"({assignment.get('modelSource')}), memory {assignment.get('memoryIds') or []}"
                ),
                highlight=False,
                markup=False,
            )
        elif routed is not None:
            console.print(
                _plain(f"Stored: Routed={routed.get('status')} {routed.get('reason')}: {routed.get('message')}"),
                highlight=False,
                markup=False,
            )
        console.print("Now (dry run, this job not counted against its runner):")
    headline = decision.outcome.value
    if decision.reason.value != headline:
        headline += f": {decision.reason.value}"
    console.print(f"[bold {colour}]{safe(headline)}[/]", highlight=False)
    console.print(_plain(decision.message), highlight=False, markup=False)
    choice = decision.choice
    if choice is not None:
        effort = choice.effort.value if choice.effort else "-"
        console.print(
            _plain(
                f"runner {choice.runner_namespace}/{choice.runner} (pool {choice.pool}), provider {choice.provider}, "
                f"model {choice.model} ({choice.model_source.value}), effort {effort}, "
                f"mapping {choice.mapping_index}, credential generation {choice.credential_generation}, "
                f"memory {explanation.memory_ids}"
            ),
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
            safe(candidate.runner),
            safe(candidate.namespace or ""),
            safe(candidate.provider or ""),
            "" if candidate.mapping_index is None else str(candidate.mapping_index),
            safe(candidate.model or ""),
            safe(candidate.reason),
        )
    console.print(table)
    for note in explanation.notes:
        console.print(_plain(f"note: {note}"), style="dim", markup=False, highlight=False)


def _console() -> Console:
    """Where the table goes: no emoji codes either (``:smile:`` in a name stays as written)."""
    return Console(width=160, emoji=False)


def _fail(message: str, code: int, *, colour: str | None = None) -> typer.Exit:
    typer.secho(_plain(message), fg=colour, err=True)
    return typer.Exit(code)


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
        raise _fail("error: give a JOB name or -f FILE (one of them)", 2)
    try:
        manifest = _read_manifest(filename) if filename is not None else None
        asked = _manifest_namespace(manifest, namespace)
        seconds = _timeout_seconds()
        path = _kubeconfig_path(kubeconfig)
        api_client = _load_client(path)
        ns = asked or _context_namespace(path)
        result = _ask(api_client=api_client, seconds=seconds, job_name=job, manifest=manifest, namespace=ns)
    except _Usage as err:
        raise _fail(f"error: {err}", 2) from None
    except _BadKubeconfig as err:
        raise _fail(f"cannot load kubeconfig: {err}", 2, colour=typer.colors.RED) from None  # as helmhive.cli.kubeapi
    except _NoAnswer as err:
        raise _fail(f"error: {err}", _EXIT_UNREACHABLE) from None
    except KubeError as err:
        raise _fail(f"error: the API server refused: {err.status} {err.message}", 2) from None
    if isinstance(result, QueueStop):
        if output is ExplainFormat.JSON:
            typer.echo(json.dumps(result.to_json(), indent=2))
        else:
            typer.echo(_plain(result.line()), err=True)
        raise typer.Exit(result.exit_code)
    if output is ExplainFormat.JSON:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        _render(result, _console())
    raise typer.Exit(_EXIT[result.decision.outcome])

"""Everything a job needs before it runs: its parsed spec and binding, sandbox, session, memory and prompt.

:func:`prepare_job` gathers it, or returns the :class:`~helmhive.runner.jobs.status.JobEnding` that
fails the job closed (``InvalidSpec``, ``SandboxUnavailable``, ``SessionNotFound``):

* **Memory.** The operator chose the records at queue time (``status.assignment.memoryIds``).
  The runner reads each by name and applies :func:`helmhive.policy.memory.selection.select_memory`
  again at run time, so a record that was deleted, turned ``Active=False`` or expired since is
  dropped -- and noted -- instead of injected. A governed-change job gets none, whatever its
  assignment says. What was injected and what was dropped (and why) is reported in
  ``status.result.memory`` with ``Running=True``; the operator audits that (``MemoryInjected``).
* **Session** (:mod:`helmhive.runner.jobs.session`, re-exported here).
  :func:`helmhive.policy.sessions.continuity.decide_session` with this runner and its
  credential generation; the operator's ``status.session``, when it wrote one, wins on the
  mode (it must name the same binding). Resume and fork need the id stored in the runner's
  Secret; without one they fail closed (``SessionNotFound``), never silently fresh.
* **HOME.** A job with a session binding gets the binding's HOME, emptied first if the binding
  was reset or re-created since it was made (:func:`helmhive.runner.sessions.bindings.ensure_session_home`);
  a job without one gets a HOME of its own. The binding is known before the sandbox is planned:
  its name is a pure function of the job and this runner (:func:`decide_job_session`).
* **Limits.** The pool's ``jobLimits`` as this runner can enforce them
  (:func:`helmhive.runner.sandbox.limits.build_enforced_limits`) go into the plan, and the Running message
  says what they are.
* **Governed work** (:mod:`helmhive.runner.jobs.governed`). A governed job without ``spec.source``
  fails closed (``SourceRequired``). A review job's patch is read and its SHA-256 checked here,
  before the job is marked Running (``PatchUnavailable``, ``PatchDigestMismatch``); the prompt
  shows it in a ``## Patch`` section before the output contract.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from helmhive.api.common import JobKind, NetworkAccess
from helmhive.api.egress import CredentialIsolation, NetworkNamespace
from helmhive.api.job import AgentJobSpec, Assignment, DroppedMemory, MemoryReport, ProfileBinding
from helmhive.api.memory import MemoryRecordSpec
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.agentjob.prompts import build_agent_prompt
from helmhive.policy.conditions import find_condition
from helmhive.policy.memory.selection import MemorySelection, NamedMemoryRecord, select_memory
from helmhive.runner.config import RunnerConfig
from helmhive.runner.jobs.governed import (
    ReviewPatch,
    decide_governed_problem,
    display_repository,
    git_credential_dir,
    load_review_patch,
)
from helmhive.runner.jobs.session import JobSession, decide_job_session, resolve_session
from helmhive.runner.jobs.status import JobEnding
from helmhive.runner.kube import KubeError, NotFound, RunnerKube
from helmhive.runner.sandbox.cgroups import JobCgroup
from helmhive.runner.sandbox.limits import LimitSupport, build_enforced_limits
from helmhive.runner.sandbox.workdir import (
    SandboxPlan,
    build_sandbox_plan,
    job_dir_name,
    runtime_read_paths,
    sandbox_refusal,
)
from helmhive.runner.sessions.bindings import SessionStore, ensure_session_home

__all__ = [
    "MEMORY_RECORDS",
    "JobSession",
    "PreparedJob",
    "build_memory_report",
    "decide_job_session",
    "load_memory",
    "parse_assigned_job",
    "prepare_job",
    "resolve_session",
]

MEMORY_RECORDS = "memoryrecords"


async def load_memory(
    *, kube: RunnerKube, ids: list[str], spec: AgentJobSpec, binding: ProfileBinding, now: dt.datetime
) -> tuple[MemorySelection, list[DroppedMemory]]:
    """The records to inject (re-checked now) and each record dropped, with its reason."""
    records: list[NamedMemoryRecord] = []
    dropped: list[DroppedMemory] = []

    def drop(name: str, reason: str) -> None:
        dropped.append(DroppedMemory(name=name, reason=reason[:160]))

    for name in ids:
        try:
            obj = await kube.get_object(MEMORY_RECORDS, name)
        except NotFound:
            drop(name, "NotFound")
            continue
        except KubeError as exc:  # unreadable: not injected (fail closed), and said so
            drop(name, type(exc).__name__)
            continue
        active = find_condition((obj.get("status") or {}).get("conditions"), ConditionType.ACTIVE)
        if active is not None and active.get("status") == "False":
            drop(name, str(active.get("reason") or "NotActive"))
            continue
        try:
            records.append(NamedMemoryRecord(name=name, spec=MemoryRecordSpec.model_validate(obj.get("spec") or {})))
        except ValidationError:
            drop(name, Reason.INVALID_SPEC.value)
    selection = select_memory(
        records=records,
        workspace=spec.workspace,
        service=spec.service,
        policy=binding.snapshot.memory,
        job_kind=spec.job_kind,
        now=now,
    )
    for excluded in selection.excluded:
        drop(excluded.name, excluded.reason.value)
    return selection, dropped


def build_memory_report(*, selection: MemorySelection, dropped: list[DroppedMemory]) -> MemoryReport:
    """``status.result.memory``: the records injected, in order, and each one dropped with its reason."""
    return MemoryReport(injected=[r.name for r in selection.records], dropped=dropped)


@dataclass(frozen=True, kw_only=True)
class ParsedJob:
    spec: AgentJobSpec
    binding: ProfileBinding
    assignment: Assignment


def parse_assigned_job(job: Mapping[str, Any]) -> ParsedJob | JobEnding:
    """The spec, the bound profile and the assignment; ``InvalidSpec`` if any is unusable."""
    status = job.get("status") or {}
    try:
        parsed = ParsedJob(
            spec=AgentJobSpec.model_validate(job.get("spec") or {}),
            binding=ProfileBinding.model_validate(status.get("profile") or {}),
            assignment=Assignment.model_validate(status.get("assignment") or {}),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return JobEnding(succeeded=False, reason=Reason.INVALID_SPEC, message=f"{where}: {first['msg']}"[:1000])
    bound, kind = parsed.binding.snapshot.envelope, parsed.spec.job_kind
    if bound is not kind:
        message = f"the bound profile is for {bound.value}, not {kind.value}"
        return JobEnding(succeeded=False, reason=Reason.INVALID_SPEC, message=message)
    return parsed


@dataclass(frozen=True, kw_only=True)
class PreparedJob:
    """A job ready to run: what it runs with, and the one-line description of it for status."""

    spec: AgentJobSpec
    binding: ProfileBinding
    assignment: Assignment
    plan: SandboxPlan
    session: JobSession
    prompt: str
    injected: int
    dropped: list[str]
    """Each record dropped at run time, as ``name (Reason)``."""
    message: str
    memory: MemoryReport | None = None
    """``status.result.memory`` to write with ``Running``; None when the assignment named no records."""
    review_patch: ReviewPatch | None = None
    """A review job's verified patch, applied to its checkout before the agent starts."""


def _protected(config: RunnerConfig) -> list[Path]:
    """The runner's own secrets on disk, which no sandbox path may expose."""
    env = config.env
    files = (env.credential_file, env.kubeconfig, git_credential_dir(config))
    return [env.state_dir / "credential", *(p for p in files if p is not None)]


def _namespace_note(config: RunnerConfig, support: LimitSupport) -> str:
    """Why a job of this runner gets no network namespace (empty when it would get one)."""
    if config.isolation is not CredentialIsolation.PROXY:
        return "credentialIsolation is InSandbox: the agent connects to its provider itself"
    return "" if support.network_namespace else support.network_namespace_note


async def prepare_job(
    *,
    kube: RunnerKube,
    sessions: SessionStore,
    config: RunnerConfig,
    job: Mapping[str, Any],
    uid: str,
    landlock_abi: int,
    limit_support: LimitSupport,
    now: dt.datetime,
    egress_port: int | None = None,
    relay_socket: Path | None = None,
    cgroup: JobCgroup | None = None,
    job_pod: bool = False,
) -> PreparedJob | JobEnding:
    """Parse, plan the sandbox, resolve the session and memory, build the prompt; or fail closed.

    ``job_pod``: the agent runs in a pod of the job's own (``execution.mode: JobPod``), not under this
    runner's sandbox, so what the runner's kernel could enforce does not refuse the job."""
    parsed = parse_assigned_job(job)
    if isinstance(parsed, JobEnding):
        return parsed
    snapshot, settings = parsed.binding.snapshot, config.file.sandbox
    problem = decide_governed_problem(spec=parsed.spec, filesystem=snapshot.filesystem)
    if problem is not None:
        return problem
    name = str((job.get("metadata") or {}).get("name") or "")
    key = decide_job_session(
        runner=sessions.runner,
        spec=parsed.spec,
        binding=parsed.binding,
        assignment=parsed.assignment,
        credential_generation=config.env.credential_generation,
        existing={},
    )
    plan = build_sandbox_plan(
        state_dir=config.env.state_dir,
        job_dir=job_dir_name(namespace=config.env.namespace, name=name, uid=uid),
        filesystem=snapshot.filesystem,
        network=snapshot.network,
        tools=snapshot.tools,
        adapter_type=config.file.adapter.type,
        settings=settings,
        runtime_paths=runtime_read_paths(),
        credential_dir=config.env.credential_dir,
        landlock_abi=landlock_abi,
        protected=_protected(config),
        binding=key.binding_name,
        limits=build_enforced_limits(limits=config.file.job_limits, support=limit_support),
        egress_port=egress_port,
        relay_socket=relay_socket if limit_support.network_namespace else None,
        cgroup_procs=cgroup.procs_files if cgroup is not None else (),
    )
    refusal = sandbox_refusal(
        plan=plan,
        settings=settings,
        landlock_abi=landlock_abi,
        require_namespace=config.file.egress.network_namespace is NetworkNamespace.REQUIRED,
        namespace_note=_namespace_note(config, limit_support),
    )
    if refusal is not None and not job_pod:
        return JobEnding(succeeded=False, reason=Reason.SANDBOX_UNAVAILABLE, message=refusal)
    session = await resolve_session(
        sessions=sessions,
        job=job,
        spec=parsed.spec,
        binding=parsed.binding,
        assignment=parsed.assignment,
        credential_generation=config.env.credential_generation,
    )
    if isinstance(session, JobEnding):
        return session
    home = "own"
    if session.binding is not None and session.binding_identity is not None:
        emptied = await asyncio.to_thread(
            ensure_session_home,
            state_dir=config.env.state_dir,
            binding=session.binding,
            identity=session.binding_identity,
        )
        home = "binding's (emptied: reset or re-created)" if emptied else "binding's"
    review: ReviewPatch | None = None
    if parsed.spec.job_kind is JobKind.CHANGE_REVIEW and parsed.spec.patch is not None:
        loaded = await load_review_patch(kube=kube, ref=parsed.spec.patch)
        if isinstance(loaded, JobEnding):
            return loaded
        review = loaded
    ids = list(parsed.assignment.memory_ids)
    selection, dropped_records = await load_memory(
        kube=kube, ids=ids, spec=parsed.spec, binding=parsed.binding, now=now
    )
    dropped = [f"{d.name} ({d.reason})" for d in dropped_records]
    prompt = build_agent_prompt(
        instructions=snapshot.instructions,
        request=parsed.spec.request,
        memory_context=selection.context,
        contract=snapshot.output_contract,
        context_sections=[review.section] if review is not None else (),
    )
    memory = f"memory: {len(selection.records)} injected" + (f", dropped {', '.join(dropped)}" if dropped else "")
    sandbox = "landlock" if plan.landlock else "no landlock (permission bits and ACP checks only)"
    if plan.network is NetworkAccess.DISABLED and plan.landlock:
        sandbox += f", network {plan.network_isolation.value}"
    limits = plan.limits.describe() if plan.landlock and plan.limits is not None else "none (no launcher)"
    if plan.landlock and cgroup is not None:
        limits += f"; {cgroup.describe()}"
    if job_pod:
        sandbox, limits = "a job pod of its own", "the job pod's (jobLimits as its resources)"
    source = parsed.spec.source
    where = f"; source {display_repository(source.repository)} at {source.commit}" if source is not None else ""
    if review is not None:
        where += f", patch sha256 {review.ref.sha256[:16]}… ({review.ref.bytes} bytes)"
    message = (
        f"{parsed.spec.job_kind.value}, session {session.mode.value}, filesystem {plan.fs_access}, "
        f"network {plan.network.value}, sandbox {sandbox}; home {home}; limits: {limits}; {memory}{where}"
    )[:900]
    return PreparedJob(
        spec=parsed.spec,
        binding=parsed.binding,
        assignment=parsed.assignment,
        plan=plan,
        session=session,
        prompt=prompt,
        injected=len(selection.records),
        dropped=dropped,
        message=message,
        memory=build_memory_report(selection=selection, dropped=dropped_records) if ids else None,
        review_patch=review,
    )

"""What a job is told besides its request: the memory records named in its assignment, and its session.

* **Memory.** The operator chose the records at queue time (``status.assignment.memoryIds``).
  The runner reads each by name and applies :func:`helmhive.policy.memory.select_memory`
  again at run time, so a record that was deleted, turned ``Active=False`` or expired since is
  dropped -- and noted -- instead of injected. A governed-change job gets none, whatever its
  assignment says.
* **Session.** :func:`helmhive.policy.sessions.decide_session` with this runner and its
  credential generation; the operator's ``status.session``, when it wrote one, wins on the
  mode (it must name the same binding). Resume and fork need the id stored in the runner's
  Secret; without one they fail closed (``SessionNotFound``), never silently fresh.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr, ValidationError

from helmhive.api.job import AgentJobSpec, Assignment, ProfileBinding, SessionMode
from helmhive.api.memory import MemoryRecordSpec
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.conditions import find_condition
from helmhive.policy.envelopes import is_governed
from helmhive.policy.memory import MemorySelection, NamedMemoryRecord, select_memory
from helmhive.policy.sessions import SessionDecision, SessionIntent, decide_session
from helmhive.runner.jobstatus import Verdict
from helmhive.runner.kube import KubeError, NotFound, RunnerKube
from helmhive.runner.sessions import SessionStore

__all__ = ["MEMORY_RECORDS", "JobSession", "load_memory", "resolve_session"]

MEMORY_RECORDS = "memoryrecords"
_INTENT = {SessionMode.FRESH: SessionIntent.FRESH, SessionMode.RESUMED: SessionIntent.RESUME}


async def load_memory(
    *, kube: RunnerKube, ids: list[str], spec: AgentJobSpec, binding: ProfileBinding, now: dt.datetime
) -> tuple[MemorySelection, list[str]]:
    """The records to inject (re-checked now) and a note per record dropped: ``name (Reason)``."""
    records: list[NamedMemoryRecord] = []
    dropped: list[str] = []
    for name in ids:
        try:
            obj = await kube.get_object(MEMORY_RECORDS, name)
        except NotFound:
            dropped.append(f"{name} (NotFound)")
            continue
        except KubeError as exc:  # unreadable: not injected (fail closed), and said so
            dropped.append(f"{name} ({type(exc).__name__})")
            continue
        active = find_condition((obj.get("status") or {}).get("conditions"), ConditionType.ACTIVE)
        if active is not None and active.get("status") == "False":
            dropped.append(f"{name} ({active.get('reason') or 'NotActive'})")
            continue
        try:
            records.append(NamedMemoryRecord(name=name, spec=MemoryRecordSpec.model_validate(obj.get("spec") or {})))
        except ValidationError:
            dropped.append(f"{name} ({Reason.INVALID_SPEC.value})")
    selection = select_memory(
        records=records,
        workspace=spec.workspace,
        service=spec.service,
        policy=binding.snapshot.memory,
        job_kind=spec.job_kind,
        now=now,
    )
    dropped += [f"{e.name} ({e.reason.value})" for e in selection.excluded]
    return selection, dropped


@dataclass(frozen=True, kw_only=True)
class JobSession:
    """The session a job starts in; ``stored_id`` only for resume and fork."""

    intent: SessionIntent
    mode: SessionMode
    binding: str | None
    reason: str
    stored_id: SecretStr | None
    status: dict[str, Any] | None
    """``status.session`` to write (None when the operator already wrote it)."""


async def resolve_session(
    *,
    sessions: SessionStore,
    job: Mapping[str, Any],
    spec: AgentJobSpec,
    binding: ProfileBinding,
    assignment: Assignment,
    credential_generation: int,
) -> JobSession | Verdict:
    """The job's session, with its binding created if missing; or the verdict that fails it closed."""
    snapshot = binding.snapshot

    def decide(existing: Mapping[str, Mapping[str, Any]]) -> SessionDecision:
        return decide_session(
            policy=snapshot.session.policy,
            governed=is_governed(spec.job_kind),
            scope=snapshot.session.scope,
            workspace=spec.workspace,
            profile=binding.name,
            provider=assignment.provider,
            runner=sessions.runner,
            credential_generation=credential_generation,
            service=spec.service,
            existing=existing,
        )

    decision = decide({})
    if decision.binding_name is not None:
        found = await sessions.existing(decision.binding_name)
        if found is not None:
            decision = decide({decision.binding_name: found.get("status") or {}})
    intent, mode = decision.intent, decision.mode
    written = (job.get("status") or {}).get("session")
    if written:
        if written.get("binding") != decision.binding_name:
            return Verdict(
                succeeded=False,
                reason=Reason.INVALID_SPEC,
                message=(
                    f"status.session names binding {written.get('binding')!r}, but this runner's key gives "
                    f"{decision.binding_name!r}"
                ),
            )
        mode = SessionMode(written.get("mode", "fresh"))
        intent = _INTENT.get(mode, SessionIntent.FORK)
    if decision.binding is not None and decision.binding_name is not None:
        await sessions.ensure_binding(decision.binding_name, decision.binding)
    stored: SecretStr | None = None
    if intent is not SessionIntent.FRESH and decision.binding_name is not None:
        stored = await sessions.load(decision.binding_name)
        if stored is None:
            return Verdict(
                succeeded=False,
                reason=Reason.SESSION_NOT_FOUND,
                message=(
                    f"binding {decision.binding_name} should {intent.value} a stored session, but the runner's "
                    "Secret holds none; reset the binding to start a new chain"
                ),
            )
    status: dict[str, Any] | None = None
    if not written:
        status = {"mode": mode.value}
        if decision.binding_name is not None:
            status["binding"] = decision.binding_name
    return JobSession(
        intent=intent,
        mode=mode,
        binding=decision.binding_name,
        reason=decision.reason,
        stored_id=stored,
        status=status,
    )

"""The session a job starts in: :func:`resolve_session` (with its binding created if missing) and
the pure :func:`decide_job_session` it rests on.

:func:`helmhive.policy.sessions.continuity.decide_session` with this runner and its credential generation;
the operator's ``status.session``, when it wrote one, wins on the mode (it must name the same
binding). Resume and fork need the id stored in the runner's Secret; without one they fail closed
(``SessionNotFound``), never silently fresh. :mod:`helmhive.runner.jobs.context` re-exports it and
calls it from :func:`~helmhive.runner.jobs.context.prepare_job`.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from helmhive.api.job import AgentJobSpec, Assignment, ProfileBinding, SessionMode
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import is_governed
from helmhive.policy.sessions.continuity import SessionDecision, SessionIntent, decide_session
from helmhive.runner.jobs.status import JobEnding
from helmhive.runner.sessions.bindings import SessionStore, binding_identity

__all__ = ["JobSession", "decide_job_session", "resolve_session"]

_INTENT = {SessionMode.FRESH: SessionIntent.FRESH, SessionMode.RESUMED: SessionIntent.RESUME}


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
    binding_identity: dict[str, Any] | None = None
    """The binding object's uid and reset count (what its HOME is kept for); None without a binding."""


def decide_job_session(
    *,
    runner: str,
    spec: AgentJobSpec,
    binding: ProfileBinding,
    assignment: Assignment,
    credential_generation: int,
    existing: Mapping[str, Mapping[str, Any]],
) -> SessionDecision:
    """:func:`~helmhive.policy.sessions.continuity.decide_session` for this job on this runner (pure)."""
    snapshot = binding.snapshot
    return decide_session(
        policy=snapshot.session.policy,
        governed=is_governed(spec.job_kind),
        scope=snapshot.session.scope,
        workspace=spec.workspace,
        profile=binding.name,
        provider=assignment.provider,
        runner=runner,
        credential_generation=credential_generation,
        service=spec.service,
        existing=existing,
    )


async def resolve_session(
    *,
    sessions: SessionStore,
    job: Mapping[str, Any],
    spec: AgentJobSpec,
    binding: ProfileBinding,
    assignment: Assignment,
    credential_generation: int,
) -> JobSession | JobEnding:
    """The job's session, with its binding created if missing; or the verdict that fails it closed."""

    def decide(existing: Mapping[str, Mapping[str, Any]]) -> SessionDecision:
        return decide_job_session(
            runner=sessions.runner,
            spec=spec,
            binding=binding,
            assignment=assignment,
            credential_generation=credential_generation,
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
            return JobEnding(
                succeeded=False,
                reason=Reason.INVALID_SPEC,
                message=(
                    f"status.session names binding {written.get('binding')!r}, but this runner's key gives "
                    f"{decision.binding_name!r}"
                ),
            )
        mode = SessionMode(written.get("mode", "fresh"))
        intent = _INTENT.get(mode, SessionIntent.FORK)
    identity: dict[str, Any] | None = None
    if decision.binding is not None and decision.binding_name is not None:
        identity = binding_identity(await sessions.ensure_binding(decision.binding_name, decision.binding))
    stored: SecretStr | None = None
    if intent is not SessionIntent.FRESH and decision.binding_name is not None:
        stored = await sessions.load(decision.binding_name)
        if stored is None:
            return JobEnding(
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
        binding_identity=identity,
    )

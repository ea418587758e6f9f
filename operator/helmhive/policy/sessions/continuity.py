"""Session continuity: which binding a job uses, and whether it starts fresh, resumes or forks.

Continuity is keyed by workspace, profile, provider, runner (with its credential
generation) and workspace-or-service scope. A different runner, or a rotated credential,
therefore has a different key and starts its own chain. Governed-change jobs and the
``fresh`` policy always start fresh and bind nothing. Pure.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.common import SessionPolicy
from helmhive.api.job import SessionMode
from helmhive.api.profile import SessionScope
from helmhive.api.session import SessionBindingSpec

__all__ = [
    "SESSIONS_SECRET_PREFIX",
    "SessionDecision",
    "decide_session",
    "session_binding_name",
    "sessions_secret_name",
]

SESSIONS_SECRET_PREFIX = "helmhive-sessions-"


class SessionIntent(enum.StrEnum):
    """What the runner is asked to do with the bound session, if any."""

    FRESH = "fresh"
    RESUME = "resume"
    FORK = "fork"


def sessions_secret_name(runner: str) -> str:
    """The Secret in which runner ``runner`` keeps its native session ids."""
    return f"{SESSIONS_SECRET_PREFIX}{runner}"[:253]


def session_binding_name(spec: SessionBindingSpec) -> str:
    """A stable, opaque name for the binding of ``spec`` (``sb-`` and 20 hex characters)."""
    canonical = json.dumps(spec.to_wire(), sort_keys=True, separators=(",", ":"))
    return "sb-" + hashlib.sha256(canonical.encode()).hexdigest()[:20]


@dataclass(frozen=True, kw_only=True)
class SessionDecision:
    """The mode the job starts in, and the binding (name and spec) it continues, if any."""

    mode: SessionMode
    intent: SessionIntent
    binding_name: str | None
    binding: SessionBindingSpec | None
    reason: str


def decide_session(
    *,
    policy: SessionPolicy,
    governed: bool,
    scope: SessionScope,
    workspace: str,
    profile: str,
    provider: str,
    runner: str,
    credential_generation: int,
    service: str | None,
    existing: Mapping[str, Mapping[str, Any]],
) -> SessionDecision:
    """Decide the session of a job routed to ``runner``.

    ``existing`` maps binding names to their status (``stored`` says a native session is
    kept). A service-scoped profile used by a job without a service binds at workspace
    scope, and says so in ``reason``.
    """
    if governed or policy is SessionPolicy.FRESH:
        why = "governed change work always starts fresh" if governed else "the profile's session policy is fresh"
        return SessionDecision(
            mode=SessionMode.FRESH, intent=SessionIntent.FRESH, binding_name=None, binding=None, reason=why
        )
    effective_scope = scope if (scope is SessionScope.WORKSPACE or service) else SessionScope.WORKSPACE
    spec = SessionBindingSpec(
        workspace=workspace,
        profile=profile,
        provider=provider,
        runner=runner,
        credential_generation=credential_generation,
        scope=effective_scope,
        service=service if effective_scope is SessionScope.SERVICE else None,
    )
    name = session_binding_name(spec)
    stored = bool((existing.get(name) or {}).get("stored"))
    note = "" if effective_scope is scope else " (no service on the job: bound at workspace scope)"
    if not stored:
        return SessionDecision(
            mode=SessionMode.FRESH,
            intent=SessionIntent.FRESH,
            binding_name=name,
            binding=spec,
            reason=f"no session stored for this binding yet: a new chain starts{note}",
        )
    if policy is SessionPolicy.RESUME:
        return SessionDecision(
            mode=SessionMode.RESUMED,
            intent=SessionIntent.RESUME,
            binding_name=name,
            binding=spec,
            reason=f"resuming{note}",
        )
    return SessionDecision(
        mode=SessionMode.FORKED, intent=SessionIntent.FORK, binding_name=name, binding=spec, reason=f"forking{note}"
    )

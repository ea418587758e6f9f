"""The SessionBinding kind: one chain of provider-session continuity, without the session id.

A binding is keyed by workspace, profile, provider, runner (and its credential generation)
and workspace-or-service scope, so a different runner, or a rotated credential, starts its
own chain. The native provider session identifier is never in this object: the runner keeps
it in its own Secret ``helmhive-sessions-<runner>`` under the key ``status.secretKey``.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated

from pydantic import Field

from helmhive.api.common import ApiModel, Name, StatusBase
from helmhive.api.memory import ServiceName
from helmhive.api.profile import ProviderName, SessionScope

__all__ = ["CompactionMethod", "SessionBindingSpec", "SessionBindingStatus", "SessionCompaction"]


class SessionBindingSpec(ApiModel):
    """The continuity key. Set once by the operator; immutable."""

    workspace: Name
    profile: Name
    provider: ProviderName
    runner: Name
    credential_generation: Annotated[int, Field(ge=0)]
    scope: SessionScope
    service: ServiceName | None = None


class CompactionMethod(enum.StrEnum):
    """How a session chain was compacted."""

    COMPACT_COMMAND = "compact-command"
    """The agent's advertised compact command ran on the same session, and it reported a smaller context."""
    ARCHIVE = "archive"
    """The session was archived (its id dropped) and a fresh one, carrying the system prompt, took its place."""


class SessionCompaction(ApiModel):
    """The last compaction of a chain: how, when, by which job, and the context figures the agent reported."""

    method: CompactionMethod
    at: dt.datetime
    job: Name
    used_before: Annotated[int, Field(ge=0, description="Tokens in context after the job's turn, as reported.")]
    used_after: Annotated[
        int | None,
        Field(ge=0, description="Tokens in context after compaction, as reported; None if the agent reported none."),
    ] = None
    context_size: Annotated[int, Field(ge=0, description="The context window the agent reported, in tokens.")]
    reason: Annotated[
        str,
        Field(max_length=256, description="Why this method: e.g. no compact command advertised, or it failed."),
    ] = ""


class SessionBindingStatus(StatusBase):
    """``secretKey``, ``stored``, ``turns`` and ``lastUsedAt`` are the runner's; resets are the admin's."""

    secret_name: Annotated[str, Field(max_length=253)] | None = None
    secret_key: Annotated[str, Field(max_length=253)] | None = None
    stored: bool = False
    turns: Annotated[int, Field(ge=0)] = 0
    last_used_at: dt.datetime | None = None
    last_job: Name | None = None
    resets: Annotated[int, Field(ge=0)] = 0
    last_reset_at: dt.datetime | None = None
    compactions: Annotated[int, Field(ge=0, description="How often the runner compacted this chain.")] = 0
    last_compaction: SessionCompaction | None = None

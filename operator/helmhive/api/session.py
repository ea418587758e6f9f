"""The SessionBinding kind: one chain of provider-session continuity, without the session id.

A binding is keyed by workspace, profile, provider, runner (and its credential generation)
and workspace-or-service scope, so a different runner, or a rotated credential, starts its
own chain. The native provider session identifier is never in this object: the runner keeps
it in its own Secret ``helmhive-sessions-<runner>`` under the key ``status.secretKey``.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import Field

from helmhive.api.common import ApiModel, Name, StatusBase
from helmhive.api.memory import ServiceName
from helmhive.api.profile import ProviderName, SessionScope

__all__ = ["SessionBindingSpec", "SessionBindingStatus"]


class SessionBindingSpec(ApiModel):
    """The continuity key. Set once by the operator; immutable."""

    workspace: Name
    profile: Name
    provider: ProviderName
    runner: Name
    credential_generation: Annotated[int, Field(ge=0)]
    scope: SessionScope
    service: ServiceName | None = None


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

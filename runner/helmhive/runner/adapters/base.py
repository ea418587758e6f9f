"""The typed interface between the runner and an agent adapter.

An adapter knows how to talk to one kind of agent (an ACP agent over stdio, the Claude CLI).
The runner asks it two things: what the agent offers (:meth:`AgentAdapter.probe`, reported into
the Runner's status) and to drive one turn (:meth:`AgentAdapter.run_turn`). Every way a turn can
end has a fixed name in :class:`TurnOutcome`.

Native session IDs travel as :class:`pydantic.SecretStr`, so they print as ``**********`` in
reprs, logs and ``model_dump_json``; the runner reads them with ``get_secret_value()`` only to
store them in a Secret.
"""

from __future__ import annotations

import asyncio
import posixpath
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from helmhive.api.runner import AuthState as AuthState  # noqa: PLC0414 (re-exported: the adapters report the API's states)

MAX_NAME = 253
MAX_MESSAGE = 2_000
MAX_TEXT = 1_000_000
MAX_LIST = 64


class AuthReason(StrEnum):
    """Why the probe concluded what it did about authentication."""

    SESSION_CREATED = "SessionCreated"
    AUTH_REQUIRED = "AuthRequired"
    SPAWN_FAILED = "SpawnFailed"
    INITIALIZE_FAILED = "InitializeFailed"
    PROTOCOL_MISMATCH = "ProtocolMismatch"
    AGENT_CRASHED = "AgentCrashed"
    AGENT_UNRESPONSIVE = "AgentUnresponsive"
    SESSION_FAILED = "SessionFailed"
    NOT_PROBED = "NotProbed"
    LOGGED_IN = "LoggedIn"
    """The CLI says it has a login (``claude auth status``); no model call verified it."""
    NOT_LOGGED_IN = "NotLoggedIn"
    """The CLI says it has no login."""
    NO_AUTH_METHOD = "NoAuthMethod"
    """The agent requires ACP ``authenticate`` and no advertised method takes the runner's API key."""
    AUTHENTICATE_FAILED = "AuthenticateFailed"
    """The agent refused ACP ``authenticate`` with the method that takes the runner's API key."""


class TurnOutcome(StrEnum):
    """How a turn ended. Only ``Completed`` is a success."""

    COMPLETED = "Completed"
    """The agent answered the prompt with stop reason ``end_turn``."""
    AGENT_REFUSED = "AgentRefused"
    """The agent answered with stop reason ``refusal``."""
    TRUNCATED = "Truncated"
    """The agent stopped at ``max_tokens`` or ``max_turn_requests``."""
    IDLE_TIMEOUT = "IdleTimeout"
    """The idle watchdog sent session/cancel and the agent then stopped the turn."""
    CANCELLED = "Cancelled"
    """The caller (or the agent itself) cancelled the turn and the agent stopped it."""
    KILLED = "Killed"
    """After session/cancel the agent did not answer within the grace period (or did not answer a
    setup request in time), so its process was killed; the next turn respawns it."""
    AGENT_CRASHED = "AgentCrashed"
    """The agent process exited or closed its stdout while the turn was in flight."""
    AUTH_REQUIRED = "AuthRequired"
    """The agent answered with the ACP auth-required error."""
    CONFIG_REFUSED = "ConfigRefused"
    """The agent refused a session/set_config_option for an offered value."""
    MODEL_NOT_OFFERED = "ModelNotOffered"
    """The wanted model is not in the session's model option (or there is no model option)."""
    EFFORT_NOT_OFFERED = "EffortNotOffered"
    """The wanted reasoning effort is not offered (or there is no effort option)."""
    RESUME_UNSUPPORTED = "ResumeUnsupported"
    """A session ID was given but the agent does not advertise loadSession."""
    FORK_UNSUPPORTED = "ForkUnsupported"
    """A fork was asked for but the agent does not advertise session forking."""
    SESSION_NOT_FOUND = "SessionNotFound"
    """session/load was refused because the agent does not know the session."""
    SPAWN_FAILED = "SpawnFailed"
    """The agent command could not be started."""
    PROTOCOL_ERROR = "ProtocolError"
    """The agent answered with an unexpected error or an unsupported protocol version."""


class CancelOrigin(StrEnum):
    WATCHDOG = "Watchdog"
    CALLER = "Caller"


class AgentCapabilities(BaseModel):
    model_config = ConfigDict(frozen=True)

    load_session: bool = False
    resume_session: bool = False
    fork_session: bool = False
    mcp_http: bool = False
    mcp_sse: bool = False
    prompt_image: bool = False
    prompt_embedded_context: bool = False

    def names(self) -> list[str]:
        """The advertised ones, by Helmhive's names (``helmhive.policy.runners.capabilities.AGENT_CAPABILITIES``)."""
        return [name for field, name in _CAPABILITY_NAMES if getattr(self, field)]


_CAPABILITY_NAMES = (
    ("load_session", "session-load"),
    ("resume_session", "session-resume"),
    ("fork_session", "session-fork"),
    ("mcp_http", "mcp-http"),
    ("mcp_sse", "mcp-sse"),
    ("prompt_image", "prompt-image"),
    ("prompt_embedded_context", "prompt-embedded-context"),
)


class AdapterReport(BaseModel):
    """What an adapter found out about its agent; the runner copies it into its Runner status."""

    model_config = ConfigDict(frozen=True)

    adapter: str = Field(max_length=MAX_NAME)
    adapter_version: str = Field(max_length=MAX_NAME)
    agent_name: str | None = Field(default=None, max_length=MAX_NAME)
    agent_title: str | None = Field(default=None, max_length=MAX_NAME)
    agent_version: str | None = Field(default=None, max_length=MAX_NAME)
    protocol_version: int | None = None
    auth: AuthState = AuthState.UNKNOWN
    auth_reason: AuthReason = AuthReason.NOT_PROBED
    auth_message: str = Field(default="", max_length=MAX_MESSAGE)
    auth_methods: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    auth_method: str | None = Field(default=None, max_length=MAX_NAME)
    """The ACP ``authenticate`` method the adapter called (an id, never a value); None if it called none."""
    capabilities: AgentCapabilities = Field(default_factory=AgentCapabilities)
    capabilities_known: bool = False
    """The agent answered what it offers (ACP ``initialize``; the CLI's ``--help``): ``capabilities`` is its word."""
    models: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    default_model: str | None = Field(default=None, max_length=MAX_NAME)
    effort_levels: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    """The efforts on offer with the default model (or with every model, when the agent does not vary them)."""
    default_effort: str | None = Field(default=None, max_length=MAX_NAME)
    model_efforts: dict[str, list[str]] = Field(default_factory=dict, max_length=MAX_LIST)
    """The efforts on offer with each model, where the agent told them per model (an ACP agent's effort
    option once that model is set); a model absent here offers ``effort_levels``."""


class TurnRequest(BaseModel):
    """One prompt to run. ``session_id`` set means: resume that native session (or, with
    ``fork``, start a new session seeded from it)."""

    model_config = ConfigDict(frozen=True)

    prompt: str = Field(min_length=1, max_length=MAX_TEXT)
    cwd: str = Field(min_length=1, max_length=4096)
    session_id: SecretStr | None = None
    model: str | None = Field(default=None, max_length=MAX_NAME)
    effort: str | None = Field(default=None, max_length=MAX_NAME)
    allowed_tools: frozenset[str] = frozenset()
    """Tool names (or ``kind:<acp tool kind>``) the agent may be granted; anything else is denied."""
    fork: bool = False
    """Start a new session seeded from ``session_id`` instead of continuing it; never a silent fresh start."""
    idle_timeout_s: float | None = Field(default=None, gt=0, le=3600)
    """A shorter idle window for this prompt (a compact command's); the adapter's own applies when longer."""

    @field_validator("cwd")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not posixpath.isabs(value):
            raise ValueError("cwd must be an absolute path (ACP requires it)")
        return value

    @model_validator(mode="after")
    def _fork_needs_a_session(self) -> TurnRequest:
        if self.fork and self.session_id is None:
            raise ValueError("fork needs the session_id of the session to fork")
        return self


class ConfigChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    config_id: str = Field(max_length=MAX_NAME)
    value: str = Field(max_length=MAX_NAME)


class ToolPermissionRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    tool: str = Field(max_length=MAX_NAME)
    kind: str | None = Field(default=None, max_length=MAX_NAME)
    allowed: bool


class TurnResult(BaseModel):
    """How one turn went. ``native_session_id`` is the only place the session ID appears."""

    model_config = ConfigDict(frozen=True)

    outcome: TurnOutcome
    message: str = Field(default="", max_length=MAX_MESSAGE)
    native_session_id: SecretStr | None = None
    session_resumed: bool = False
    session_forked: bool = False
    stop_reason: str | None = None
    text: str = Field(default="", max_length=MAX_TEXT)
    text_truncated: bool = False
    model: str | None = Field(default=None, max_length=MAX_NAME)
    effort: str | None = Field(default=None, max_length=MAX_NAME)
    config_changes: list[ConfigChange] = Field(default_factory=list, max_length=MAX_LIST)
    tool_requests: list[ToolPermissionRecord] = Field(default_factory=list, max_length=MAX_LIST)
    cancel_origin: CancelOrigin | None = None
    agent_exit_code: int | None = None
    diagnostics: str = Field(default="", max_length=MAX_MESSAGE * 4)
    """The tail of the agent's stderr on failure, with every secret value redacted."""
    session_updates: int = 0
    duration_s: float = 0.0
    context_used: int | None = Field(default=None, ge=0)
    """Tokens in the session's context as the agent last reported during this turn (ACP ``usage_update``;
    the Claude CLI: the last model call's usage, or a ``compact_boundary``'s ``post_tokens``)."""
    context_size: int | None = Field(default=None, ge=0)
    """The session's context window in tokens, from the same report."""
    commands: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    """The command names the agent advertises for this session (ACP ``available_commands_update``;
    the Claude CLI: ``slash_commands`` of its ``system/init`` event)."""

    @property
    def ok(self) -> bool:
        return self.outcome is TurnOutcome.COMPLETED


@runtime_checkable
class AgentAdapter(Protocol):
    """What the runner needs from an adapter. One adapter drives one turn at a time."""

    @property
    def name(self) -> str: ...

    async def probe(self) -> AdapterReport:
        """Start the agent if needed and report what it offers and whether it is logged in."""
        ...

    async def run_turn(self, request: TurnRequest, cancel: asyncio.Event | None = None) -> TurnResult:
        """Run one prompt. Setting ``cancel`` stops the turn (session/cancel, then kill)."""
        ...

    async def close(self) -> None:
        """Stop the agent process, if any."""
        ...

"""How the ACP adapter names what happened: its report, outcomes, failures and per-turn state."""

from __future__ import annotations

from dataclasses import dataclass, field

from acp import schema

from helmhive.runner.adapters.acp_process import options_from_acp
from helmhive.runner.adapters.base import MAX_LIST, AdapterReport, AgentCapabilities, ConfigChange, TurnOutcome
from helmhive.runner.adapters.decisions import ConfigKind, find_option

AUTH_REQUIRED_CODE = -32000
RESOURCE_NOT_FOUND_CODE = -32002


class AdapterFailure(Exception):
    """A turn (or probe) step failed with a named outcome."""

    def __init__(
        self,
        outcome: TurnOutcome,
        message: str,
        *,
        stage: str = "turn",
        diagnostics: str = "",
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.stage = stage
        self.diagnostics = diagnostics
        self.exit_code = exit_code


@dataclass
class TurnState:
    """What a turn has established so far, kept for its result whichever way it ends."""

    session_id: str | None = None
    resumed: bool = False
    forked: bool = False
    model: str | None = None
    effort: str | None = None
    changes: list[ConfigChange] = field(default_factory=list)
    exit_code: int | None = None
    diagnostics: str = ""
    usage: tuple[int, int] | None = None
    commands: tuple[str, ...] = ()


def error_outcome(code: int) -> TurnOutcome:
    """The outcome for an ACP error code answered to a turn's request."""
    return TurnOutcome.AUTH_REQUIRED if code == AUTH_REQUIRED_CODE else TurnOutcome.PROTOCOL_ERROR


def describe_agent(report: AdapterReport, init: schema.InitializeResponse | None) -> AdapterReport:
    if init is None:
        return report
    caps = init.agent_capabilities or schema.AgentCapabilities()
    mcp = caps.mcp_capabilities or schema.McpCapabilities()
    prompt = caps.prompt_capabilities or schema.PromptCapabilities()
    sessions = caps.session_capabilities or schema.SessionCapabilities()
    info = init.agent_info
    return report.model_copy(
        update={
            "agent_name": info.name if info else None,
            "agent_title": info.title if info else None,
            "agent_version": info.version if info else None,
            "protocol_version": init.protocol_version,
            "auth_methods": [method.id for method in (init.auth_methods or [])][:MAX_LIST],
            "capabilities_known": True,
            "capabilities": AgentCapabilities(
                load_session=bool(caps.load_session),
                resume_session=sessions.resume is not None,
                fork_session=sessions.fork is not None,
                mcp_http=bool(mcp.http),
                mcp_sse=bool(mcp.sse),
                prompt_image=bool(prompt.image),
                prompt_embedded_context=bool(prompt.embedded_context),
            ),
        }
    )


def with_catalogue(
    report: AdapterReport,
    options: list[schema.SessionConfigOptionSelect | schema.SessionConfigOptionBoolean] | None,
) -> AdapterReport:
    views = options_from_acp(options)
    model, effort = find_option(views, ConfigKind.MODEL), find_option(views, ConfigKind.EFFORT)
    return report.model_copy(
        update={
            "models": list(model.values[:MAX_LIST]) if model else [],
            "default_model": model.current_value if model else None,
            "effort_levels": list(effort.values[:MAX_LIST]) if effort else [],
            "default_effort": effort.current_value if effort else None,
        }
    )

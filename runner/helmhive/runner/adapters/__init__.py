"""Agent adapters: how a runner talks to an agent (ACP over stdio; the Claude CLI's stream-json: ``claude_*``)."""

from helmhive.runner.adapters.acp import AcpAdapter, AcpAdapterConfig
from helmhive.runner.adapters.base import (
    AdapterReport,
    AgentAdapter,
    AgentCapabilities,
    AuthReason,
    AuthState,
    CancelOrigin,
    ConfigChange,
    ToolPermissionRecord,
    TurnOutcome,
    TurnRequest,
    TurnResult,
)

__all__ = [
    "AcpAdapter",
    "AcpAdapterConfig",
    "AdapterReport",
    "AgentAdapter",
    "AgentCapabilities",
    "AuthReason",
    "AuthState",
    "CancelOrigin",
    "ConfigChange",
    "ToolPermissionRecord",
    "TurnOutcome",
    "TurnRequest",
    "TurnResult",
]

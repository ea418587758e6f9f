"""Which ACP ``authenticate`` method the runner may call for an agent that requires one. Pure.

An agent that answers ``session/new`` (or ``session/load``, ``session/fork``) with the ACP
auth-required error (``-32000``) gets one ``authenticate`` call, with the method chosen here from
the ``authMethods`` its ``initialize`` advertised, then the request again. The runner holds one
kind of credential: an API key in the pool's ``credential.envName`` (the proxy's placeholder with
``credentialIsolation: Proxy``, the key itself with ``InSandbox``). So the only method that fits is
an ``env_var`` method that names that variable, and whose other required variables the agent's
environment also holds:

=======================  ==========================  ========================================
Agent                    ``credential.envName``      method chosen
=======================  ==========================  ========================================
codex-acp 0.16           ``CODEX_API_KEY``           ``codex-api-key``
codex-acp 0.16           ``OPENAI_API_KEY``          ``openai-api-key``
any ACP agent            a variable an ``env_var``   that method
                         method names
=======================  ==========================  ========================================

Never an ``agent`` method (the agent's own login flow, e.g. codex-acp's ``chatgpt``, which opens
a browser) nor a ``terminal`` method (an interactive login): a job has nobody to answer them.
No fitting method is a named refusal (:class:`AuthChoice` with ``method_id`` None), never a guess.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from acp import schema

from helmhive.runner.adapters.base import AuthReason

__all__ = ["AuthChoice", "AuthRefused", "decide_auth_method"]

AuthMethod = schema.EnvVarAuthMethod | schema.TerminalAuthMethod | schema.AuthMethodAgent


@dataclass(frozen=True)
class AuthChoice:
    """The method to authenticate with, or why there is none (a message with no secret in it)."""

    method_id: str | None
    message: str


class AuthRefused(Exception):
    """The agent requires authentication and the runner could not give it (reason named, no secret)."""

    def __init__(self, reason: AuthReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _kind(method: AuthMethod) -> str:
    if isinstance(method, schema.EnvVarAuthMethod):
        return "env_var"
    if isinstance(method, schema.TerminalAuthMethod):
        return "terminal"
    return "agent"


def decide_auth_method(
    methods: Sequence[AuthMethod] | None, *, credential_env: str | None, env_names: Collection[str]
) -> AuthChoice:
    """The ``env_var`` method naming ``credential_env`` whose required variables are all in ``env_names``."""
    offered = list(methods or ())
    if not offered:
        return AuthChoice(None, "the agent requires authentication but advertises no authMethods")
    if credential_env is None:
        return AuthChoice(None, "the agent requires authentication and the runner holds no API-key credential")
    for method in offered:
        if not isinstance(method, schema.EnvVarAuthMethod):
            continue
        names = {var.name for var in method.vars}
        required = {var.name for var in method.vars if not var.optional}
        if credential_env in names and required <= set(env_names):
            return AuthChoice(method.id, f"method {method.id} ({credential_env})")
    listed = ", ".join(f"{m.id} ({_kind(m)})" for m in offered[:8])
    return AuthChoice(
        None,
        f"no advertised auth method takes the credential in {credential_env} (offered: {listed}); "
        "the runner never picks an interactive login",
    )

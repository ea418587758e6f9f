"""Where a runner's provider credential lives, and where its egress proxy may forward. Pure.

Owns the RunnerPool fields ``credentialIsolation`` and ``egress``, and the per-provider defaults
(:data:`PROVIDER_EGRESS`): the provider's own API base URL, the environment variables its CLIs and
SDKs read for a base URL. The placeholder key goes only into the pool's ``credential.envName``
(which decides how the agent sends it: ``ANTHROPIC_API_KEY`` as ``x-api-key``,
``CLAUDE_CODE_OAUTH_TOKEN`` or ``ANTHROPIC_AUTH_TOKEN`` as a bearer token). The runner
(``helmhive.runner.egress.proxy``) and the operator (``helmhive.policy.runners.pool``) both read the
defaults from here, so they never disagree.

Sources for the variable names (each tool's own documentation, and for Gemini CLI the change that
added the variable, google-gemini/gemini-cli#21561):

- Claude Code: ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY`` (sent as ``x-api-key``),
  ``ANTHROPIC_AUTH_TOKEN`` (sent as ``Authorization: Bearer``) and ``CLAUDE_CODE_OAUTH_TOKEN``
  (a subscription's long-lived token from ``claude setup-token``).
- OpenAI's SDKs: ``OPENAI_BASE_URL`` (which includes ``/v1``), ``OPENAI_API_KEY``. Codex CLI 0.171
  reads neither: it takes the config key ``openai_base_url`` and ``CODEX_API_KEY`` (found by running
  it, ``tests/runner/test_runner_egress_npm.py``).
- Gemini CLI: ``GOOGLE_GEMINI_BASE_URL`` (plain ``http`` is accepted only for loopback hosts) and
  ``GEMINI_API_KEY`` (the proxy replaces it in ``x-goog-api-key`` or a ``key`` query parameter).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, StringConstraints

from helmhive.api.common import ApiModel

__all__ = [
    "POOL_RULES",
    "PROVIDER_EGRESS",
    "CredentialIsolation",
    "EgressSpec",
    "HostName",
    "NetworkNamespace",
    "PathPrefix",
    "ProviderEgress",
    "UpstreamUrl",
    "decide_allowed_paths",
    "decide_isolation",
    "decide_isolation_problems",
    "provider_egress",
]

HostName = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ),
]
"""A DNS host name in lower case (no port, no wildcard)."""

UpstreamUrl = Annotated[
    str,
    StringConstraints(
        min_length=9,
        max_length=512,
        pattern=r"^https://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$",
    ),
]
"""An ``https://host[:port][/path]`` URL: no credentials, query or fragment; TLS only."""

PathPrefix = Annotated[
    str,
    StringConstraints(min_length=1, max_length=256, pattern=r"^/([A-Za-z0-9_~:@-][A-Za-z0-9._~:@-]*/?)*$"),
]
"""An absolute URL path prefix without dot segments, empty segments, a query or encoded characters."""


class NetworkNamespace(enum.StrEnum):
    """Whether a job's agent must run in a network namespace of its own (only the proxy reachable)."""

    PREFERRED = "Preferred"
    """Where the pod allows user and network namespaces; elsewhere Landlock's port rule only, and the
    Runner's ``report.sandbox.network`` says ``Landlock`` with the reason."""
    REQUIRED = "Required"
    """Every job whose network is disabled fails closed (``SandboxUnavailable``) without one."""


class CredentialIsolation(enum.StrEnum):
    """Where the provider credential is while a job's agent runs."""

    PROXY = "Proxy"
    """Only in the runner process: the agent gets a placeholder and a base URL pointing at the
    runner's egress proxy, which puts the real key on requests to the provider's API host."""
    IN_SANDBOX = "InSandbox"
    """In the agent's environment (an API key) or its login directory (a subscription login):
    any process the agent starts can read it."""


class EgressSpec(ApiModel):
    """Where the runner's egress proxy forwards (only with ``credentialIsolation: Proxy``)."""

    upstream: Annotated[
        UpstreamUrl | None,
        Field(
            description=(
                "The provider API's base URL (https only) the proxy forwards to and adds the credential for. "
                "Default: the provider's own (anthropic: https://api.anthropic.com, openai: https://api.openai.com, "
                "google: https://generativelanguage.googleapis.com); required for any other provider but reference."
            )
        ),
    ] = None
    allowed_hosts: Annotated[
        list[HostName],
        Field(
            max_length=16,
            description=(
                "Further hosts the proxy forwards to over https when the agent names them in an absolute "
                "request URI, never with the credential. Default: none. Anything else is refused (403) and counted."
            ),
        ),
    ] = []
    allowed_paths: Annotated[
        list[PathPrefix] | None,
        Field(
            max_length=32,
            description=(
                "URL path prefixes of the upstream the proxy forwards to (matched segment by segment, before the "
                "upstream's own path). Default: the provider's API (anthropic: /v1/messages, /v1/models, "
                "/v1/complete; openai: /v1/responses, /v1/chat/completions, /v1/completions, /v1/embeddings, "
                "/v1/models; google: /v1beta/models, /v1/models, /v1alpha/models); every path for another "
                "provider's upstream. Any other path is refused (403, refused-path) and counted."
            ),
        ),
    ] = None
    requests_per_minute: Annotated[
        int,
        Field(
            ge=1,
            le=100000,
            description=(
                "Requests each job may send through the proxy per minute (a token bucket refilled continuously); "
                "beyond it a request is refused (429, refused-rate). Default 600."
            ),
        ),
    ] = 600
    burst: Annotated[
        int,
        Field(ge=1, le=10000, description="Requests a job may send at once before the rate applies. Default 60."),
    ] = 60
    max_concurrent_requests: Annotated[
        int,
        Field(
            ge=1,
            le=1024,
            description=(
                "Requests of one job in flight at once (a streamed response counts until it ends); one more is "
                "refused (429, refused-concurrency), never queued. Default 16."
            ),
        ),
    ] = 16
    network_namespace: Annotated[
        NetworkNamespace,
        Field(
            description=(
                "Preferred (default): a job whose network is disabled runs its agent in a network namespace of "
                "its own, whose only way out is a relay to the proxy, where the pod allows user and network "
                "namespaces, else under Landlock's port rule (the Runner's report.sandbox says which, and why). "
                "Required: such a job fails closed (SandboxUnavailable) without one."
            )
        ),
    ] = NetworkNamespace.PREFERRED
    ca_bundle: Annotated[
        Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^/")] | None,
        Field(
            description=(
                "A PEM file in the runner's image or mounts whose certificates the proxy trusts for the "
                "upstream's TLS instead of the system's. Default: the system's certificate authorities."
            )
        ),
    ] = None


@dataclass(frozen=True, slots=True)
class ProviderEgress:
    """A provider's defaults: its API, and what its agents read to find it and the key."""

    upstream: str | None
    base_url_env: tuple[str, ...] = ()
    """Variables that take the proxy's base URL (each CLI or SDK reads its own)."""
    base_url_suffix: str = ""
    """Appended to the proxy's URL in those variables (OpenAI's clients expect ``/v1``)."""
    allowed_paths: tuple[str, ...] = ("/",)
    """The upstream's paths its agents call (``egress.allowedPaths`` when the pool sets none)."""


_ANTHROPIC_PATHS = ("/v1/messages", "/v1/models", "/v1/complete")
_OPENAI_PATHS = ("/v1/responses", "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models")
_GOOGLE_PATHS = ("/v1beta/models", "/v1/models", "/v1alpha/models")


PROVIDER_EGRESS: dict[str, ProviderEgress] = {
    "anthropic": ProviderEgress(
        upstream="https://api.anthropic.com", base_url_env=("ANTHROPIC_BASE_URL",), allowed_paths=_ANTHROPIC_PATHS
    ),
    "openai": ProviderEgress(
        upstream="https://api.openai.com",
        base_url_env=("OPENAI_BASE_URL",),
        base_url_suffix="/v1",
        allowed_paths=_OPENAI_PATHS,
    ),
    "google": ProviderEgress(
        upstream="https://generativelanguage.googleapis.com",
        base_url_env=("GOOGLE_GEMINI_BASE_URL",),
        allowed_paths=_GOOGLE_PATHS,
    ),
    "reference": ProviderEgress(
        upstream=None, allowed_paths=tuple(dict.fromkeys((*_ANTHROPIC_PATHS, *_OPENAI_PATHS, *_GOOGLE_PATHS)))
    ),
    # The reference agent calls no provider; its proxy refuses every request unless a pool sets an upstream.
}


def provider_egress(provider: str) -> ProviderEgress | None:
    """The defaults of a provider; None for one Helmhive does not know (it needs ``egress.upstream``)."""
    return PROVIDER_EGRESS.get(provider)


def decide_allowed_paths(*, provider: str, egress: EgressSpec) -> tuple[str, ...]:
    """The upstream paths the proxy forwards: the pool's, else its provider's, else every path."""
    if egress.allowed_paths is not None:
        return tuple(egress.allowed_paths)
    defaults = provider_egress(provider)
    return defaults.allowed_paths if defaults is not None else ("/",)


_KNOWN = ", ".join(f"'{name}'" for name in PROVIDER_EGRESS)
POOL_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": (
            "!has(self.spec.credentialIsolation) || self.spec.credentialIsolation == 'InSandbox' "
            "|| !has(self.spec.credential.volume)"
        ),
        "message": (
            "spec.credentialIsolation: Proxy needs an API key (credential.secretRef); a login volume is refreshed "
            "by the CLI inside the sandbox, so it runs InSandbox"
        ),
        "fieldPath": ".spec.credentialIsolation",
    },
    {
        "rule": (
            "!has(self.spec.credentialIsolation) || self.spec.credentialIsolation == 'InSandbox' "
            f"|| (has(self.spec.egress) && has(self.spec.egress.upstream)) || self.spec.provider in [{_KNOWN}]"
        ),
        "message": "spec.egress.upstream: required with credentialIsolation Proxy for a provider without defaults",
        "fieldPath": ".spec.egress.upstream",
    },
    {
        "rule": "!has(self.spec.credential.volume) || !has(self.spec.replicas) || self.spec.replicas <= 1",
        "message": (
            "spec.replicas: a login volume (credential.volume) is one subscription login, so at most 1 replica: "
            "pods sharing it would race each other's token refreshes"
        ),
        "fieldPath": ".spec.replicas",
    },
)
"""The RunnerPool's CEL rules for these fields (the same checks as :func:`decide_isolation_problems`)."""


def decide_isolation(
    *, requested: CredentialIsolation | None, volume: bool, provider: str, upstream: str | None
) -> CredentialIsolation:
    """The isolation a pool runs with: what it asks for; else Proxy for an API key whose upstream is
    known (set, or the provider's default), InSandbox for a login volume or a provider without defaults."""
    if requested is not None:
        return requested
    if volume or (upstream is None and provider_egress(provider) is None):
        return CredentialIsolation.IN_SANDBOX
    return CredentialIsolation.PROXY


def decide_isolation_problems(
    *, provider: str, requested: CredentialIsolation | None, volume: bool, upstream: str | None, replicas: int = 1
) -> list[str]:
    """Every problem with a pool's credential settings: an explicit Proxy it cannot have, a login shared by pods."""
    problems = []
    if requested is CredentialIsolation.PROXY and volume:
        problems.append(POOL_RULES[0]["message"])
    if requested is CredentialIsolation.PROXY and upstream is None and provider_egress(provider) is None:
        problems.append(POOL_RULES[1]["message"])
    if volume and replicas > 1:
        problems.append(POOL_RULES[2]["message"])
    return problems

"""Small builders for routing tests: a profile binding, a job and runner views with readable defaults."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from helmhive.api.common import FilesystemAccess, JobKind, NetworkAccess, ReasoningEffort, SessionPolicy, ToolKind
from helmhive.api.envelope import OutputContract, OutputFormat
from helmhive.api.job import AgentJobSpec, ProfileBinding
from helmhive.api.profile import EffectiveProfile, MemoryPolicy, ProviderMapping, SessionSettings
from helmhive.policy.routing.route import RoutingJob, RunnerView

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
BOUND_AT = NOW - dt.timedelta(seconds=30)


def mapping(provider: str, model: str | None = None, *fallbacks: str, effort: str | None = None) -> ProviderMapping:
    return ProviderMapping.model_validate(
        {"provider": provider, "model": model, "fallbackModels": list(fallbacks), "reasoningEffort": effort}
    )


def binding(
    *mappings: ProviderMapping,
    capabilities: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    allow_override: bool = False,
    session: SessionPolicy = SessionPolicy.FRESH,
    envelope: JobKind = JobKind.IMPLEMENTATION_PROBE,
    bound_at: dt.datetime = BOUND_AT,
    name: str = "impl",
) -> ProfileBinding:
    effective = EffectiveProfile(
        envelope=envelope,
        tools=[ToolKind.READ],
        filesystem=FilesystemAccess.READ,
        network=NetworkAccess.DISABLED,
        output_contract=OutputContract(format=OutputFormat.TEXT),
        session=SessionSettings(policy=session),
        memory=MemoryPolicy(),
        required_labels=dict(labels or {}),
        required_capabilities=list(capabilities),
        provider_mappings=list(mappings) or [mapping("anthropic", "sonnet")],
        allow_model_override=allow_override,
        instructions="",
        purpose="tests",
    )
    return ProfileBinding(name=name, revision=f"{name}-abc", hash="sha256:00", snapshot=effective, bound_at=bound_at)


def job(
    *,
    kind: JobKind = JobKind.IMPLEMENTATION_PROBE,
    model: dict[str, Any] | None = None,
    service: str | None = None,
    namespace: str = "team",
    name: str = "job-1",
) -> RoutingJob:
    wire: dict[str, Any] = {"workspace": "shop", "jobKind": kind.value, "request": {"title": "t", "prompt": "p"}}
    if model is not None:
        wire["model"] = model
    if service is not None:
        wire["service"] = service
    return RoutingJob(namespace=namespace, name=name, spec=AgentJobSpec.model_validate(wire))


def _all_efforts(models: Iterable[str], default: str | None) -> dict[str, frozenset[str]]:
    """Every model (and the default) offers every effort: what a test that is not about efforts wants."""
    every = frozenset(e.value for e in ReasoningEffort)
    return {m: every for m in [*models, *([default] if default else [])]}


def runner(
    name: str,
    provider: str = "anthropic",
    *,
    models: Iterable[str] = ("sonnet",),
    default: str | None = None,
    capabilities: Iterable[str] = (),
    agent_capabilities: Iterable[str] | None = ("session-load", "session-fork"),
    efforts: Mapping[str, Iterable[str] | None] | None = None,
    labels: Mapping[str, str] | None = None,
    concurrency: int = 1,
    schedulable: bool = True,
    reason: str = "Schedulable",
    serves: bool = True,
    namespace: str = "team",
    pool: str = "pool",
    generation: int = 0,
) -> RunnerView:
    models = tuple(models)
    return RunnerView(
        namespace=namespace,
        name=name,
        pool=pool,
        provider=provider,
        schedulable=schedulable,
        schedulable_reason=reason,
        default_model=default,
        models=frozenset(models),
        capabilities=frozenset(capabilities),
        agent_capabilities=frozenset(agent_capabilities) if agent_capabilities is not None else None,
        efforts=(
            {m: frozenset(e) if e is not None else None for m, e in efforts.items()}
            if efforts is not None
            else _all_efforts(models, default)
        ),
        labels=dict(labels or {}),
        concurrency=concurrency,
        credential_generation=generation,
        serves_namespace=serves,
    )

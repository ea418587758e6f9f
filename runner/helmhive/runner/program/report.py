"""The runner's report (``status.report`` of its own Runner): how it is built and when it is written.

Everything here is pure: functions of what the adapter found, the runner's configuration and
``now``, returning data. No I/O, no clock, no Kubernetes client.

When to write (KEP-589's rule for node status, applied to runners): at registration, whenever
the content changes, and otherwise once every ``reportRefreshSeconds`` -- never because a
heartbeat happened. "Content" is the report without ``reportedAt``, so a refresh that only moves
the timestamp is not a change. What a heartbeat does carry is the report's digest
(:func:`helmhive.api.runner.build_report_digest`), on the Lease.

``authentication.verifiedAt`` is the time of a probe that confirmed the current state. A probe
with the same verdict moves it only once it is a quarter of the pool's ``authMaxAgeSeconds``
old (:func:`decide_verified_at`), so re-verifying costs one report write per quarter age, not
one per probe.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from helmhive.api.egress import CredentialIsolation
from helmhive.api.runner import (
    AdapterInfo,
    AuthReport,
    AuthState,
    ModelCatalogue,
    ModelEntry,
    RunnerReport,
    SandboxReport,
)
from helmhive.api.runnerpool import AdapterType
from helmhive.policy.runners.capabilities import decide_capabilities
from helmhive.runner.adapters.base import AdapterReport
from helmhive.runner.config import RunnerFileConfig

__all__ = [
    "NO_CREDENTIAL_REASON",
    "ReportDecision",
    "WriteReason",
    "build_catalogue",
    "build_fingerprint",
    "build_report",
    "decide_auth_report",
    "decide_learnt",
    "decide_report_write",
    "decide_verified_at",
    "report_content",
    "reverify_interval",
]

NO_CREDENTIAL_REASON = "NoCredential"
MAX_MODELS = 64
MAX_EFFORTS = 8
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@\[\]-]*$")
_EFFORT = re.compile(r"^.{1,32}$")


class WriteReason(enum.StrEnum):
    REGISTRATION = "Registration"
    CHANGED = "Changed"
    REFRESH = "Refresh"


@dataclass(frozen=True, slots=True)
class ReportDecision:
    """``write`` False means: leave the Runner alone until the next decision."""

    write: bool
    reason: WriteReason | None = None
    next_refresh_at: dt.datetime | None = None


def build_fingerprint(
    *,
    image: str,
    helmhive_version: str,
    adapter_type: AdapterType,
    agent_name: str | None,
    agent_version: str | None,
    provider: str,
    command: str,
    args: Iterable[str],
    env_names: Iterable[str],
    credential_kind: str,
) -> str:
    """``sha256:<hex>`` of the execution environment: image, versions and settings.

    Environment variables count by name only and the credential by its kind (file or
    directory), so no value that could be secret ever enters the hash.
    """
    document = {
        "image": image,
        "helmhive": helmhive_version,
        "adapter": adapter_type.value,
        "agent": [agent_name or "", agent_version or ""],
        "provider": provider,
        "command": command,
        "args": list(args),
        "envNames": sorted(set(env_names)),
        "credential": credential_kind,
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def reverify_interval(auth_max_age_seconds: int) -> dt.timedelta:
    """How often auth is re-verified (and ``verifiedAt`` republished): a quarter of the pool's bound.

    A quarter leaves room for one missed probe plus a probe timeout before the bound is reached.
    """
    return dt.timedelta(seconds=auth_max_age_seconds / 4)


def decide_verified_at(
    *, previous: AuthReport | None, current: AuthReport, probed_at: dt.datetime, auth_max_age_seconds: int
) -> dt.datetime:
    """``verifiedAt`` for ``current``, a verdict a probe reached at ``probed_at``.

    A new verdict (state or reason) is verified now; the same verdict keeps the published time
    until it is :func:`reverify_interval` old.
    """
    if previous is None or previous.verified_at is None:
        return probed_at
    if (previous.state, previous.reason) != (current.state, current.reason):
        return probed_at
    if probed_at - previous.verified_at >= reverify_interval(auth_max_age_seconds):
        return probed_at
    return previous.verified_at


def decide_auth_report(*, adapter: AdapterReport, credential_present: bool) -> AuthReport:
    """The report's authentication: the adapter's verdict, unless the runner holds no credential.

    Some agents open sessions without any login (their first prompt fails instead), so a
    runner with an empty credential never claims ``Authenticated`` (nor ``Unknown``): it says
    ``Unauthenticated`` with reason ``NoCredential`` and keeps the agent's own words in the
    message. An agent that already says ``Unauthenticated`` or ``Failing`` keeps its own, more
    specific, reason.
    """
    message = adapter.auth_message[:900]
    if not credential_present and adapter.auth in (AuthState.AUTHENTICATED, AuthState.UNKNOWN):
        return AuthReport(
            state=AuthState.UNAUTHENTICATED,
            reason=NO_CREDENTIAL_REASON,
            message=(
                "the runner holds no credential (the credential file or login directory is missing or empty); "
                f"the agent said: {adapter.auth.value}/{adapter.auth_reason.value}"
            )[:1024],
        )
    return AuthReport(state=adapter.auth, reason=adapter.auth_reason.value, message=message)


def _efforts(levels: Iterable[str]) -> list[str]:
    return [e for e in dict.fromkeys(levels) if _EFFORT.match(e)][:MAX_EFFORTS]


def decide_learnt(*, previous: AdapterReport | None, current: AdapterReport) -> AdapterReport:
    """``current``, keeping what an earlier probe of the same agent learnt that this one did not.

    A probe that never reached the agent (``capabilities_known`` False) keeps the last known
    advertisement; one that learnt no efforts per model (the agent hung on a config request, the
    Claude CLI's ``--help`` did not answer) keeps the last ones, if the agent's version and models
    are unchanged. So one bad probe does not make routing refuse jobs the runner can run.
    """
    if previous is None:
        return current
    update: dict[str, object] = {}
    if not current.capabilities_known and previous.capabilities_known:
        update |= {"capabilities": previous.capabilities, "capabilities_known": True}
    same_agent = (previous.agent_name, previous.agent_version, previous.models) == (
        current.agent_name,
        current.agent_version,
        current.models,
    )
    if not current.model_efforts and previous.model_efforts and same_agent:
        update["model_efforts"] = previous.model_efforts
    return current.model_copy(update=update) if update else current


def build_catalogue(*, adapter: AdapterReport) -> ModelCatalogue:
    """The model catalogue: the models the agent offers (invalid IDs dropped), each with its efforts, and its default.

    A model's efforts are those the probe learnt for it (:attr:`AdapterReport.model_efforts`);
    a model it did not learn has none named (``efforts`` absent), which routing reads as unknown.
    """
    models = [m for m in dict.fromkeys(adapter.models) if len(m) <= 128 and _MODEL_ID.match(m)][:MAX_MODELS]
    default = adapter.default_model if adapter.default_model in models else None
    entries = [
        ModelEntry(id=m, efforts=_efforts(adapter.model_efforts[m]) if m in adapter.model_efforts else None)
        for m in models
    ]
    return ModelCatalogue(models=entries, default=default)


def build_report(
    *,
    file: RunnerFileConfig,
    runner_name: str,
    adapter: AdapterReport,
    authentication: AuthReport,
    active_jobs: int,
    fingerprint: str,
    credential_generation: int,
    registered_at: dt.datetime,
    now: dt.datetime,
    credential_isolation: CredentialIsolation | None = None,
    sandbox: SandboxReport | None = None,
) -> RunnerReport:
    """The whole report, bounded as the API demands.

    The capabilities are the pool's declaration intersected with the agent's advertisement
    (:func:`helmhive.policy.runners.capabilities.decide_capabilities`).
    """
    advertised = adapter.capabilities.names() if adapter.capabilities_known else None
    capabilities = decide_capabilities(declared=file.capabilities, advertised=advertised)
    return RunnerReport(
        provider=file.provider,
        adapter=AdapterInfo(
            type=file.adapter.type,
            name=(adapter.agent_name or adapter.adapter)[:256],
            version=(adapter.agent_version or "unknown")[:64],
        ),
        authentication=authentication,
        placement_labels=dict(file.placement_labels),
        capabilities=capabilities.names,
        offered_capabilities=list(capabilities.offered),
        withheld_capabilities=list(capabilities.withheld),
        agent_capabilities=advertised,
        concurrency=file.concurrency,
        active_jobs=max(0, min(active_jobs, 64)),
        environment_fingerprint=fingerprint,
        catalogue=build_catalogue(adapter=adapter),
        credential_generation=credential_generation,
        credential_isolation=credential_isolation,
        sandbox=sandbox,
        pod_name=runner_name,
        reported_at=now,
        registered_at=registered_at,
    )


def report_content(report: RunnerReport) -> dict[str, Any]:
    """What counts as the report's content: everything but ``reportedAt``."""
    wire = report.to_wire()
    wire.pop("reportedAt", None)
    return wire


def decide_report_write(
    *,
    previous: RunnerReport | None,
    current: RunnerReport,
    last_written_at: dt.datetime | None,
    now: dt.datetime,
    refresh: dt.timedelta,
) -> ReportDecision:
    """Write at registration (nothing written yet), on a content change, or when ``refresh`` has passed."""
    if previous is None or last_written_at is None:
        return ReportDecision(True, WriteReason.REGISTRATION, now + refresh)
    if report_content(previous) != report_content(current):
        return ReportDecision(True, WriteReason.CHANGED, now + refresh)
    due = last_written_at + refresh
    if now >= due:
        return ReportDecision(True, WriteReason.REFRESH, now + refresh)
    return ReportDecision(False, None, due)

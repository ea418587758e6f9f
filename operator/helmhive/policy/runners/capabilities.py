"""What a runner offers: its pool's declared capabilities against what its agent advertises. Pure.

A pool's ``spec.capabilities`` are declarations. Some name what Helmhive or the image provides
(``structured-output``, ``diff-review``, ``workspace-write``): no agent advertisement decides
those, and the runner offers them as declared (source ``Pool``). Others name a feature of the
agent itself, which the runner learns from the agent when it probes it (ACP ``initialize``, the
Claude CLI's ``--help``): those are :data:`AGENT_CAPABILITIES`. A declared agent capability is
offered only if the agent advertised it (source ``Agent``); otherwise it is *withheld*, with a
reason, and the Runner and its pool say so in their ``CapabilitiesAdvertised`` condition.

So a runner's offered capabilities are the pool's declaration intersected with the agent's
advertisement, and routing (``MissingCapability:<name>``) reads only what is offered.

Sessions are a profile's choice, not a declaration: a job whose profile resumes (or forks) its
session needs an agent that advertised ``session-load`` (``session-fork``), whether or not the
pool declares it (:func:`decide_session_requirements`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from helmhive.api.common import SessionPolicy
from helmhive.api.reasons import Reason
from helmhive.api.runner import (
    CapabilitySource,
    OfferedCapability,
    RunnerReport,
    WithheldCapability,
    WithheldReason,
)
from helmhive.policy.runners.state import ConditionVerdict

__all__ = [
    "AGENT_CAPABILITIES",
    "SESSION_FORK",
    "SESSION_LOAD",
    "CapabilityDecision",
    "decide_capabilities",
    "decide_pool_capabilities_condition",
    "decide_runner_capabilities_condition",
    "decide_session_requirements",
]

SESSION_LOAD = "session-load"
SESSION_FORK = "session-fork"

AGENT_CAPABILITIES = MappingProxyType(
    {
        SESSION_LOAD: "the agent loads an earlier session (ACP loadSession; the Claude CLI's --resume)",
        "session-resume": "the agent resumes a session without replaying it (ACP sessionCapabilities.resume)",
        SESSION_FORK: "the agent forks a new session from an earlier one (ACP sessionCapabilities.fork; "
        "the Claude CLI's --fork-session)",
        "mcp-http": "the agent connects to MCP servers over HTTP (ACP mcpCapabilities.http; the Claude CLI's "
        "--mcp-config)",
        "mcp-sse": "the agent connects to MCP servers over SSE (ACP mcpCapabilities.sse; the Claude CLI's "
        "--mcp-config)",
        "prompt-image": "the agent accepts images in a prompt (ACP promptCapabilities.image)",
        "prompt-embedded-context": "the agent accepts embedded resources in a prompt "
        "(ACP promptCapabilities.embeddedContext)",
    }
)
"""The capabilities an agent advertises, by Helmhive name, and what each means."""

_MAX_NAMES = 8  # names in a condition message


@dataclass(frozen=True, slots=True)
class CapabilityDecision:
    """What the runner offers, in the pool's order, and what it withholds."""

    offered: tuple[OfferedCapability, ...]
    withheld: tuple[WithheldCapability, ...]

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.offered]


def decide_capabilities(*, declared: Sequence[str], advertised: Collection[str] | None) -> CapabilityDecision:
    """The pool's declaration intersected with the agent's advertisement (None: not probed yet)."""
    offered: list[OfferedCapability] = []
    withheld: list[WithheldCapability] = []
    for name in dict.fromkeys(declared):
        if name not in AGENT_CAPABILITIES:
            offered.append(OfferedCapability(name=name, source=CapabilitySource.POOL))
        elif advertised is None:
            withheld.append(WithheldCapability(name=name, reason=WithheldReason.AGENT_NOT_PROBED))
        elif name in advertised:
            offered.append(OfferedCapability(name=name, source=CapabilitySource.AGENT))
        else:
            withheld.append(WithheldCapability(name=name, reason=WithheldReason.NOT_ADVERTISED))
    return CapabilityDecision(offered=tuple(offered), withheld=tuple(withheld))


def decide_session_requirements(*, policy: SessionPolicy, resumable: bool) -> tuple[str, ...]:
    """The agent capabilities a job's session policy needs: none for a fresh (or governed) job."""
    if not resumable:
        return ()
    if policy is SessionPolicy.RESUME:
        return (SESSION_LOAD,)
    if policy is SessionPolicy.FORK:
        return (SESSION_FORK,)
    return ()


def _listed(names: Iterable[str]) -> str:
    unique = list(dict.fromkeys(names))
    shown = ", ".join(unique[:_MAX_NAMES])
    return shown + (f" and {len(unique) - _MAX_NAMES} more" if len(unique) > _MAX_NAMES else "")


def decide_runner_capabilities_condition(report: RunnerReport | None) -> ConditionVerdict:
    """The Runner's ``CapabilitiesAdvertised``: False while it withholds a declared capability."""
    if report is None:
        return ConditionVerdict(status=None, reason=Reason.NEVER_REPORTED, message="the runner has not reported yet")
    missing = [w.name for w in report.withheld_capabilities if w.reason is WithheldReason.NOT_ADVERTISED]
    if missing:
        return ConditionVerdict(
            status=False,
            reason=Reason.CAPABILITY_NOT_ADVERTISED,
            message=f"the pool declares {_listed(missing)}; agent {report.adapter.name} {report.adapter.version} "
            "does not advertise it, so this runner does not offer it",
        )
    if report.withheld_capabilities:
        return ConditionVerdict(
            status=None,
            reason=Reason.AGENT_NOT_PROBED,
            message="no probe has learnt yet whether the agent offers "
            + _listed(w.name for w in report.withheld_capabilities),
        )
    if report.agent_capabilities is None:  # never probed, or a runner older than the advertisement
        return ConditionVerdict(
            status=None,
            reason=Reason.AGENT_NOT_PROBED,
            message="the runner has not reported what its agent advertises yet; a job needing session load "
            "or fork waits for it",
        )
    return ConditionVerdict(
        status=True,
        reason=Reason.ALL_ADVERTISED,
        message="the agent advertises every agent capability the pool declares",
    )


def decide_pool_capabilities_condition(
    *, declared: Sequence[str], reports: Iterable[RunnerReport | None]
) -> ConditionVerdict:
    """The RunnerPool's ``CapabilitiesAdvertised``, from its runners' reports.

    False when any runner withholds a declared capability its agent did not advertise (the
    message names them); Unknown until a runner has probed its agent; True otherwise, and True
    at once when the pool declares no agent capability.
    """
    agent_declared = [name for name in dict.fromkeys(declared) if name in AGENT_CAPABILITIES]
    if not agent_declared:
        return ConditionVerdict(
            status=True, reason=Reason.ALL_ADVERTISED, message="the pool declares no agent capability"
        )
    missing: list[str] = []
    runners_missing = probed = 0
    for report in reports:
        if report is None or report.agent_capabilities is None:
            continue
        probed += 1
        absent = [w.name for w in report.withheld_capabilities if w.reason is WithheldReason.NOT_ADVERTISED]
        if absent:
            runners_missing += 1
            missing.extend(absent)
    if missing:
        return ConditionVerdict(
            status=False,
            reason=Reason.CAPABILITY_NOT_ADVERTISED,
            message=f"the pool declares {_listed(missing)}, which the agent of {runners_missing} of {probed} "
            "probed runner(s) does not advertise; those runners do not offer it",
        )
    if not probed:
        return ConditionVerdict(
            status=None,
            reason=Reason.AGENT_NOT_PROBED,
            message=f"no runner has probed its agent yet for {_listed(agent_declared)}",
        )
    return ConditionVerdict(
        status=True,
        reason=Reason.ALL_ADVERTISED,
        message=f"the agent of every probed runner ({probed}) advertises {_listed(agent_declared)}",
    )

"""Pure decisions about the runner's control state (Active, Draining, Disabled, Revoked).

The operator derives ``status.effectiveControlState`` (the most restrictive of the pool's and
the runner's); until it has, the runner reads ``spec.controlState`` itself. What each state
means for the runner:

=========  ==================  =====================  =============================================
state      new jobs            running jobs           the runner
=========  ==================  =====================  =============================================
Active     accepted            run                    registered, heartbeating
Draining   refused             finish                 registered, heartbeating
Disabled   refused             cancelled              registered, heartbeating
Revoked    refused             cancelled              wipes its credential, releases its Lease,
                                                      exits 0; refuses to start again while the
                                                      Runner says Revoked for its credential
                                                      generation
=========  ==================  =====================  =============================================

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from helmhive.api.common import ControlState

__all__ = [
    "ControlAction",
    "ControlFields",
    "StartupDecision",
    "accepts_jobs",
    "decide_control_action",
    "decide_control_state",
    "decide_startup",
    "read_control_fields",
]

REVOKED_GENERATION_REASON = "RevokedCredentialGeneration"
_RESTRICTIVENESS = {
    ControlState.ACTIVE: 0,
    ControlState.DRAINING: 1,
    ControlState.DISABLED: 2,
    ControlState.REVOKED: 3,
}


class ControlAction(enum.StrEnum):
    RUN = "Run"
    DRAIN = "Drain"
    HOLD = "Hold"
    REVOKE = "Revoke"


@dataclass(frozen=True, slots=True)
class ControlFields:
    """What the runner reads from its Runner object."""

    spec_state: str | None = None
    effective_state: str | None = None
    reported_generation: int | None = None
    registered_at: str | None = None


def read_control_fields(obj: dict[str, Any] | None) -> ControlFields:
    """Extract the fields the runner acts on from a Runner object (None: the object is gone)."""
    if not obj:
        return ControlFields()
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    report = status.get("report") or {}
    generation = report.get("credentialGeneration")
    return ControlFields(
        spec_state=spec.get("controlState"),
        effective_state=status.get("effectiveControlState"),
        reported_generation=generation if isinstance(generation, int) else None,
        registered_at=report.get("registeredAt"),
    )


def _parse(value: str | None) -> ControlState | None:
    if value is None:
        return None
    try:
        return ControlState(value)
    except ValueError:
        return ControlState.DISABLED  # an unknown state fails closed


def decide_control_state(*, view: ControlFields) -> ControlState:
    """The operator's effective state if it has derived one, else the runner's spec, else Active.

    When both are present the more restrictive wins, so a runner never acts more permissively
    than either its administrator or the operator said.
    """
    states = [s for s in (_parse(view.effective_state), _parse(view.spec_state)) if s is not None]
    if not states:
        return ControlState.ACTIVE
    return max(states, key=lambda s: _RESTRICTIVENESS[s])


def decide_control_action(*, state: ControlState) -> ControlAction:
    return {
        ControlState.ACTIVE: ControlAction.RUN,
        ControlState.DRAINING: ControlAction.DRAIN,
        ControlState.DISABLED: ControlAction.HOLD,
        ControlState.REVOKED: ControlAction.REVOKE,
    }[state]


def accepts_jobs(*, state: ControlState) -> bool:
    return state is ControlState.ACTIVE


@dataclass(frozen=True, slots=True)
class StartupDecision:
    start: bool
    reason: str = ""
    message: str = ""


def decide_startup(
    *,
    state: ControlState,
    reported_generation: int | None,
    generation: int,
    revoked_generation: int | None,
) -> StartupDecision:
    """Refuse to start while the Runner says Revoked for the credential generation this runner holds.

    The generation revoked is the one the Runner last reported (or the one this runner's state
    directory remembers revoking). A Runner that is Revoked but never reported a generation
    refuses too: nothing says the credential in hand is not the revoked one.
    """
    if state is not ControlState.REVOKED:
        return StartupDecision(True)
    if generation in (reported_generation, revoked_generation) or reported_generation is None:
        return StartupDecision(
            False,
            REVOKED_GENERATION_REASON,
            f"the Runner is Revoked for credential generation {generation}; "
            "a new credential generation (or an administrator setting another control state) is needed",
        )
    return StartupDecision(True)

"""Pure decisions an adapter makes: which config option to set, which tool to allow, what to redact.

Nothing here does I/O or knows the ``acp`` package; the ACP adapter converts protocol objects
into the small views below and acts on the returned decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from helmhive.runner.adapters.base import TurnOutcome

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 4


class ConfigKind(StrEnum):
    MODEL = "model"
    EFFORT = "effort"


# ACP's semantic category for each kind, then the option ids accepted when no category is given.
_CATEGORY = {ConfigKind.MODEL: "model", ConfigKind.EFFORT: "thought_level"}
_FALLBACK_IDS = {
    ConfigKind.MODEL: ("model",),
    ConfigKind.EFFORT: ("effort", "thought_level", "reasoning_effort"),
}
_NOT_OFFERED = {
    ConfigKind.MODEL: TurnOutcome.MODEL_NOT_OFFERED,
    ConfigKind.EFFORT: TurnOutcome.EFFORT_NOT_OFFERED,
}


@dataclass(frozen=True, slots=True)
class ConfigOptionView:
    """A select config option of a session: its id, category, current value and offered values."""

    id: str
    category: str | None
    current_value: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ConfigDecision:
    """``keep``: send nothing; ``set``: send session/set_config_option; ``refuse``: fail the turn."""

    action: Literal["keep", "set", "refuse"]
    config_id: str | None = None
    value: str | None = None
    outcome: TurnOutcome | None = None
    message: str = ""


def find_option(options: Sequence[ConfigOptionView], kind: ConfigKind) -> ConfigOptionView | None:
    """The first option of the kind's ACP category, else the first whose id names the kind."""
    for option in options:
        if option.category == _CATEGORY[kind]:
            return option
    for option in options:
        if option.id in _FALLBACK_IDS[kind]:
            return option
    return None


def decide_config_change(options: Sequence[ConfigOptionView], kind: ConfigKind, wanted: str | None) -> ConfigDecision:
    """Decide whether to set ``kind`` to ``wanted`` on a session offering ``options``.

    Nothing wanted, or the value already held: keep. An offered value not held: set it. A value
    the session does not offer, or no option of the kind at all: refuse with a named outcome, so
    the turn fails closed instead of running on a model (or effort) nobody asked for.
    """
    if wanted is None:
        return ConfigDecision("keep")
    option = find_option(options, kind)
    if option is None:
        return ConfigDecision(
            "refuse", outcome=_NOT_OFFERED[kind], message=f"the session offers no {kind.value} option"
        )
    if wanted not in option.values:
        offered = ", ".join(option.values[:16])
        return ConfigDecision(
            "refuse",
            config_id=option.id,
            value=wanted,
            outcome=_NOT_OFFERED[kind],
            message=f"{kind.value} {wanted!r} is not offered (offered: {offered})",
        )
    if option.current_value == wanted:
        return ConfigDecision("keep", config_id=option.id, value=wanted)
    return ConfigDecision("set", config_id=option.id, value=wanted)


@dataclass(frozen=True, slots=True)
class PermissionOptionView:
    option_id: str
    kind: str


@dataclass(frozen=True, slots=True)
class PermissionDecision:
    """``option_id`` None with ``allowed`` False means: answer with the ``cancelled`` outcome."""

    allowed: bool
    option_id: str | None


def tool_allowed(tool: str, kind: str | None, allowed_tools: Iterable[str]) -> bool:
    """A tool is allowed if its name, or ``kind:<its ACP kind>``, is in the allow-list."""
    allow = set(allowed_tools)
    if tool and tool in allow:
        return True
    return kind is not None and f"kind:{kind}" in allow


def decide_permission(
    tool: str,
    kind: str | None,
    options: Sequence[PermissionOptionView],
    allowed_tools: Iterable[str],
    *,
    cancelling: bool = False,
) -> PermissionDecision:
    """Answer a session/request_permission from the allow-list.

    An allowed tool gets an ``allow_once`` option (never ``allow_always``, which would outlive the
    job's policy); if the agent offers none, the request is denied. A denied tool gets
    ``reject_once``, else ``reject_always``, else the ``cancelled`` outcome. While the turn is being
    cancelled every request is answered ``cancelled``, as the protocol asks.
    """
    if cancelling:
        return PermissionDecision(False, None)
    if tool_allowed(tool, kind, allowed_tools):
        for option in options:
            if option.kind == "allow_once":
                return PermissionDecision(True, option.option_id)
    for wanted in ("reject_once", "reject_always"):
        for option in options:
            if option.kind == wanted:
                return PermissionDecision(False, option.option_id)
    return PermissionDecision(False, None)


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret (at least 4 characters long) with ``[REDACTED]``.

    Longer secrets are replaced first, so a secret containing another is removed whole.
    """
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def bounded(text: str, limit: int) -> tuple[str, bool]:
    """Cut ``text`` to ``limit`` characters, keeping the start; return it and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit], True


def tail(text: str, limit: int) -> str:
    """The last ``limit`` characters of ``text``."""
    return text[-limit:] if len(text) > limit else text

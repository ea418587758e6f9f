"""Condition bookkeeping: set one condition in a list, keeping transition times honest.

``lastTransitionTime`` changes only when ``status`` changes; reason, message and
``observedGeneration`` are updated in place. The caller patches only when ``changed``.
Pure: the clock is an argument.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from helmhive.policy.timestamps import format_timestamp

__all__ = ["ConditionUpdate", "find_condition", "set_condition"]


class ConditionUpdate:
    """The result of :func:`set_condition`: the new list and whether anything changed."""

    __slots__ = ("changed", "conditions")

    def __init__(self, conditions: list[dict[str, Any]], changed: bool) -> None:
        self.conditions = conditions
        self.changed = changed


def find_condition(conditions: Sequence[dict[str, Any]] | None, ctype: str) -> dict[str, Any] | None:
    """Return the condition of type ``ctype``, or None."""
    for cond in conditions or ():
        if cond.get("type") == ctype:
            return cond
    return None


def set_condition(
    conditions: Sequence[dict[str, Any]] | None,
    *,
    type: str,
    status: bool | None,
    reason: str,
    message: str = "",
    generation: int | None = None,
    now: dt.datetime,
) -> ConditionUpdate:
    """Return ``conditions`` (wire form) with ``type`` set; never mutates the input."""
    status_text = "Unknown" if status is None else ("True" if status else "False")
    message = message[:1024]
    result: list[dict[str, Any]] = []
    changed = True
    found = False
    for cond in conditions or ():
        if cond.get("type") != type:
            result.append(dict(cond))
            continue
        found = True
        same_status = cond.get("status") == status_text
        new = {
            "type": type,
            "status": status_text,
            "reason": reason,
            "message": message,
            "lastTransitionTime": cond.get("lastTransitionTime") if same_status else format_timestamp(now),
        }
        if generation is not None:
            new["observedGeneration"] = generation
        if not new.get("lastTransitionTime"):
            new["lastTransitionTime"] = format_timestamp(now)
        changed = new != cond
        result.append(new)
    if not found:
        new = {
            "type": type,
            "status": status_text,
            "reason": reason,
            "message": message,
            "lastTransitionTime": format_timestamp(now),
        }
        if generation is not None:
            new["observedGeneration"] = generation
        result.append(new)
    return ConditionUpdate(result, changed)

"""The reference agent's output contract (``OUTPUT-CONTRACT: json``): the schema a prompt names,
the smallest document it accepts, and the JSON answers built over it (on purpose invalid when
asked). Pure; :mod:`helmhive.reference_agent.rules` re-exports it and renders the reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final

from helmhive.reference_agent.directives import AGENT_NAME, CONTRACT_PREFIX, SuggestLine

_FENCE: Final = re.compile(r"```json\s*\n(.*?)\n```", re.DOTALL)


def find_schema(prompt: str) -> dict[str, Any] | None:
    """The JSON Schema the prompt asks the answer to satisfy: the first fenced ```json block, after
    the ``OUTPUT-CONTRACT: json`` line, that holds a JSON object; None without one."""
    marker = prompt.find(f"{CONTRACT_PREFIX} json")
    if marker < 0:
        return None
    for match in _FENCE.finditer(prompt, marker):
        try:
            schema = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(schema, dict):
            return schema
    return None


def minimal_instance(schema: Any) -> Any:
    """The smallest deterministic document satisfying the common subset of JSON Schema the
    envelopes use: ``allOf``, ``const``, ``enum``, ``type``, ``required``, ``minItems``,
    ``minLength``/``maxLength`` and ``minimum``. Unknown shapes give ``None``."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            value = minimal_instance(part)
            if isinstance(value, dict):
                merged.update(value)
            elif value is not None:
                return value
        return merged
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    raw_properties = schema.get("properties")
    properties: dict[str, Any] = raw_properties if isinstance(raw_properties, dict) else {}
    if kind == "object" or (kind is None and ("properties" in schema or "required" in schema)):
        return {name: minimal_instance(properties.get(name, {})) for name in schema.get("required", [])}
    if kind == "array":
        return [minimal_instance(schema.get("items", {})) for _ in range(int(schema.get("minItems", 0)))]
    if kind == "string":
        text = "reference answer"
        text = text.ljust(int(schema.get("minLength", 0)), ".")
        return text[: int(schema["maxLength"])] if "maxLength" in schema else text
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return None


def structured_answer(
    facts: dict[str, object],
    schema: dict[str, Any] | None,
    *,
    invalid: bool,
    suggestions: Sequence[SuggestLine] = (),
) -> object:
    """The JSON answer: the facts, plus the smallest document the prompt's schema accepts.

    ``suggestions`` (the prompt's ``REFERENCE-AGENT: suggest`` lines) become the answer's
    ``suggestions`` when the schema has that property (:func:`suggestion_items`).
    With ``invalid``, the schema's required properties are left out (or, when it requires
    none, the answer is no JSON object at all), so a client's contract check must fail.
    """
    if schema is None:
        return facts
    if invalid:
        return facts if _requires_something(schema) else ["not", "an", "object"]
    instance = minimal_instance(schema)
    if not isinstance(instance, dict):
        return facts
    if suggestions:
        items = suggestion_items(suggestions, schema)
        if items is not None:
            instance["suggestions"] = items
    closed = any(part.get("additionalProperties") is False for part in _parts(schema))
    return instance if closed else {**facts, **instance}


def governed_answer(document: dict[str, Any], schema: dict[str, Any] | None, *, invalid: bool) -> object:
    """A stage document plus ``agent``, over the smallest document the schema needs; a closed
    schema keeps only its own properties. ``invalid`` leaves the stage document out."""
    base: dict[str, Any] = {"agent": AGENT_NAME}
    if schema is None:
        return {**base, **document}
    if invalid:
        return base if _requires_something(schema) else ["not", "an", "object"]
    instance = minimal_instance(schema)
    answer = {**(instance if isinstance(instance, dict) else {}), **base, **document}
    parts = _parts(schema)
    if any(part.get("additionalProperties") is False for part in parts):
        allowed = {name for part in parts if isinstance(part.get("properties"), dict) for name in part["properties"]}
        answer = {key: value for key, value in answer.items() if key in allowed}
    return answer


def suggestion_items(suggestions: Sequence[SuggestLine], schema: dict[str, Any]) -> list[Any] | None:
    """The ``suggestions`` array for ``schema``, one item per line in order; None when no part of
    the schema (``allOf`` included) declares a ``suggestions`` property.

    An item is ``name`` (when the line gave one), ``kind``, ``scope`` (``{"type": "workspace"}`` or
    ``{"type": "service", "service": …}``), ``text``, ``sensitivity`` and a fixed ``rationale``
    naming the line. A closed item schema keeps only its own properties, a string is cut to the
    item schema's ``maxLength`` (an ending ``…`` marks a cut), the list to the smallest
    ``maxItems`` and topped up to the largest ``minItems`` with the item schema's smallest document.
    """
    arrays = [
        part["properties"]["suggestions"]
        for part in _parts(schema)
        if isinstance(part.get("properties"), dict) and isinstance(part["properties"].get("suggestions"), dict)
    ]
    if not arrays:
        return None
    item_schemas = [a["items"] for a in arrays if isinstance(a.get("items"), dict)]
    closed = any(part.get("additionalProperties") is False for item in item_schemas for part in _parts(item))
    declared = {
        name: value
        for item in item_schemas
        for part in _parts(item)
        if isinstance(part.get("properties"), dict)
        for name, value in part["properties"].items()
    }
    count = len(suggestions)
    for array in arrays:
        if isinstance(array.get("maxItems"), int):
            count = min(count, array["maxItems"])
    items: list[Any] = []
    for index, line in enumerate(suggestions[:count], start=1):
        scope: dict[str, str] = {"type": "workspace"} if line.service is None else {"type": "service"}
        if line.service is not None:
            scope["service"] = line.service
        item: dict[str, Any] = {"name": line.name} if line.name else {}
        item.update(
            kind=line.kind,
            scope=scope,
            text=line.text,
            sensitivity=line.sensitivity,
            rationale=f"Suggestion {index} of the prompt's REFERENCE-AGENT suggest lines "
            "(deterministic reference agent, not a model).",
        )
        items.append(
            {key: _bounded(value, declared.get(key)) for key, value in item.items() if not closed or key in declared}
        )
    least = max((a["minItems"] for a in arrays if isinstance(a.get("minItems"), int)), default=0)
    filler = minimal_instance({"allOf": item_schemas}) if item_schemas else None
    items.extend(filler for _ in range(least - len(items)))
    return items


def _bounded(value: Any, schema: Any) -> Any:
    limit = schema.get("maxLength") if isinstance(schema, dict) else None
    if not isinstance(value, str) or not isinstance(limit, int) or len(value) <= limit:
        return value
    return value[: limit - 1] + "…" if limit > 0 else ""


def _parts(schema: dict[str, Any]) -> list[dict[str, Any]]:
    nested = schema.get("allOf")
    if isinstance(nested, list):
        return [schema, *(p for part in nested if isinstance(part, dict) for p in _parts(part))]
    return [schema]


def _requires_something(schema: dict[str, Any]) -> bool:
    return any(part.get("required") for part in _parts(schema))

"""What the API server does to a custom object beyond plain JSON Schema, for offline validation.

:mod:`helmhive.policy.validation.manifests` checks manifests with ``jsonschema``; to agree with the API
server on every object (the differential fuzz test in ``tests/fuzz`` holds them to it) three
things are read as kube-apiserver reads them:

* ``pattern``: RE2/ECMA-262 semantics, where ``$`` is the end of the text
  (:func:`api_regex`);
* ``format: date-time``: kube-openapi's ``IsDateTime`` (:func:`is_api_date_time`);
* null fields that are not ``nullable`` are dropped before validation (:func:`without_nulls`).

Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterator
from typing import Any

# Typed by types-jsonschema when it is installed; without it the ignore keeps mypy clean.
from jsonschema import Draft202012Validator, validators  # type: ignore[import-untyped,unused-ignore]
from jsonschema.exceptions import ValidationError as SchemaValidationError  # type: ignore[import-untyped,unused-ignore]

__all__ = ["ApiServerValidator", "api_regex", "is_api_date_time", "without_nulls"]


@functools.cache
def api_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` as the API server (RE2) and JSON Schema (ECMA-262) read it.

    There ``$`` matches only at the end of the text; Python's ``$`` also matches before a
    final newline, which would let ``name\\n`` through offline that the API server refuses.
    Each ``$`` outside a character class becomes ``\\Z``.
    """
    out: list[str] = []
    in_class = escaped = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char == "$" and not in_class:
            out.append(r"\Z")
            continue
        out.append(char)
    return re.compile("".join(out))


def _pattern_keyword(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[SchemaValidationError]:
    if validator.is_type(instance, "string") and not api_regex(pattern).search(instance):
        yield SchemaValidationError(f"{instance!r} does not match {pattern!r}")


_DATE = re.compile(r"^([0-9]{4})-([0-9]{2})-([0-9]{2})\Z")
_TIME = re.compile(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))\Z")


def is_api_date_time(text: str) -> bool:
    """Whether the API server takes ``text`` as ``format: date-time`` (kube-openapi's ``IsDateTime``).

    A calendar date, ``T``, then ``hh:mm:ss``, an optional fraction and ``Z`` or ``±hh:mm``
    (case-insensitive). ``2027-01-15`` and ``2027-01-15 00:00`` are refused there, though
    Python would parse them.
    """
    parts = text.lower().split("t")
    if len(text) < 4 or len(parts) < 2 or not (date := _DATE.match(parts[0])):
        return False
    try:
        dt.date(int(date.group(1)), int(date.group(2)), int(date.group(3)))
    except ValueError:
        return False
    time = _TIME.match(parts[1])
    return time is not None and time.group(1) <= "23" and time.group(2) <= "59" and time.group(3) <= "59"


def _format_keyword(validator: Any, fmt: str, instance: Any, schema: Any) -> Iterator[SchemaValidationError]:
    if fmt == "date-time" and validator.is_type(instance, "string") and not is_api_date_time(instance):
        yield SchemaValidationError(f"{instance!r} is not a date-time")


ApiServerValidator = validators.extend(  # type: ignore[no-untyped-call,unused-ignore]
    Draft202012Validator, {"pattern": _pattern_keyword, "format": _format_keyword}
)


def without_nulls(schema: Any, value: Any) -> Any:
    """``value`` without the null fields the API server drops before it validates.

    A CRD field that is not ``nullable`` and is null is pruned (or defaulted) as if it were
    absent (apiextensions.k8s.io/v1), so ``memory: {enabled: null}`` is accepted there. List
    items are not fields: a null item stays, and is refused by the schema.
    """
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = properties.get(key) if key in properties else additional
            if item is None and isinstance(sub, dict) and not sub.get("nullable"):
                continue
            out[key] = without_nulls(sub, item)
        return out
    if isinstance(value, list):
        return [without_nulls(schema.get("items"), item) for item in value]
    return value

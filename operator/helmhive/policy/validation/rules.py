"""What the API server checks beyond JSON Schema, offline: CRD CEL rules and keyed-list uniqueness.

Step 2 of :mod:`helmhive.policy.validation.manifests`. The CRDs' create-time ``x-kubernetes-validations``
rules are evaluated for the few forms the generated CRDs use (:func:`cel_rule_supported` says
which; a test asserts every rule of every CRD is one of them), with the API server's regular
expressions; transition rules (``oldSelf``) need no offline check. ``x-kubernetes-list-type: map``
lists must not repeat a key. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from helmhive.api.egress import POOL_RULES
from helmhive.api.execution import EXECUTION_RULES
from helmhive.api.pod_settings import RESERVED_ANNOTATION_RULE, RESERVED_LABEL_RULE, RESOURCE_RULES, TOLERATION_RULE
from helmhive.api.qualification import QUALIFICATION_RULES
from helmhive.api.reasons import Reason
from helmhive.policy.validation.apiserver import api_regex
from helmhive.policy.violations import PathSegment, Violation, field_path

__all__ = ["cel_rule_supported", "decide_server_rules"]

_CEL_MATCHES = re.compile(r"^self\.matches\('([^'\\]*)'\)$")
_CEL_CONDITIONAL = re.compile(r"^self\.(\w+) == '([^']*)' \? has\(self\.(\w+)\) : !has\(self\.(\w+)\)$")
_CEL_EXACTLY_ONE = re.compile(r"^has\(self\.(\w+)\) != has\(self\.(\w+)\)$")
_CEL_KEYS = re.compile(r"^self\.all\(k, (.+)\)$")
# "an optional value, when a non-empty list is set, is one of its items" (claudeCli.defaultModel in models)
_CEL_MEMBER = re.compile(
    r"^!has\(self\.(\w+)\) \|\| !has\(self\.(\w+)\) \|\| size\(self\.\2\) == 0 \|\| self\.\1 in self\.\2$"
)
_CEL_KEY_CHECK = re.compile(r"^size\(k\) (<=|>=) (\d+)$|^k\.matches\(r'([^']*)'\)$")


_MODEL_CHECKED = frozenset(
    r["rule"]
    for r in (
        *POOL_RULES,
        *RESOURCE_RULES,
        *EXECUTION_RULES,
        TOLERATION_RULE,
        RESERVED_LABEL_RULE,
        RESERVED_ANNOTATION_RULE,
        *QUALIFICATION_RULES,
    )
)
"""Rules the spec's pydantic models enforce too (step 3), with the same message: offline, the models check them."""


def cel_rule_supported(rule: str) -> bool:
    """Whether offline validation evaluates ``rule`` (transition rules need no offline check)."""
    if "oldSelf" in rule or rule in _MODEL_CHECKED:
        return True
    if any(form.match(rule) for form in (_CEL_CONDITIONAL, _CEL_EXACTLY_ONE, _CEL_MATCHES, _CEL_MEMBER)):
        return True
    keys = _CEL_KEYS.match(rule)
    if keys is None:
        return False
    return all(_CEL_KEY_CHECK.match(c) for c in keys.group(1).split(" && "))


def _cel_holds(rule: str, value: Any) -> bool | None:
    """Evaluate a create-time rule of a supported form; None when it does not apply."""
    if (m := _CEL_MATCHES.match(rule)) and isinstance(value, str):
        return api_regex(m.group(1)).search(value) is not None
    if "oldSelf" in rule or not isinstance(value, dict):
        return None
    if m := _CEL_CONDITIONAL.match(rule):
        selector, wanted, then_field, else_field = m.groups()
        if then_field != else_field:
            return None
        return (then_field in value) == (value.get(selector) == wanted)
    if m := _CEL_EXACTLY_ONE.match(rule):
        return (m.group(1) in value) != (m.group(2) in value)
    if m := _CEL_MEMBER.match(rule):
        item, items = value.get(m.group(1)), value.get(m.group(2))
        return item is None or not isinstance(items, list) or not items or item in items
    if m := _CEL_KEYS.match(rule):
        return all(_key_ok(key, m.group(1)) for key in value)
    return None


def _key_ok(key: Any, checks: str) -> bool:
    if not isinstance(key, str):
        return False
    for check in checks.split(" && "):
        m = _CEL_KEY_CHECK.match(check)
        if m is None:
            return True
        op, number, pattern = m.groups()
        if pattern is not None and api_regex(pattern).search(key) is None:
            return False
        if op == "<=" and len(key) > int(number):
            return False
        if op == ">=" and len(key) < int(number):
            return False
    return True


def decide_server_rules(schema: Mapping[str, Any], value: Any, path: tuple[PathSegment, ...]) -> Iterator[Violation]:
    """CEL rules and keyed-list uniqueness: what the API server checks beyond JSON Schema."""
    for rule in schema.get("x-kubernetes-validations", ()):
        if _cel_holds(rule["rule"], value) is False:
            extra = rule.get("fieldPath", "").lstrip(".")
            yield Violation(
                field_path=field_path(*path, *([extra] if extra else [])),
                reason=Reason.INVALID_SPEC,
                message=rule.get("message") or f"failed rule {rule['rule']}",
            )
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key) if key in properties else additional
            if isinstance(sub, dict):
                yield from decide_server_rules(sub, item, (*path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        if schema.get("x-kubernetes-list-type") == "map":
            yield from _duplicate_keys(value, schema.get("x-kubernetes-list-map-keys", []), path)
        for index, item in enumerate(value):
            yield from decide_server_rules(schema["items"], item, (*path, index))


def _duplicate_keys(items: list[Any], keys: list[str], path: tuple[PathSegment, ...]) -> Iterator[Violation]:
    seen: dict[tuple[Any, ...], int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        key = tuple(repr(item.get(k)) for k in keys)
        if key in seen:
            shown = ", ".join(f"{k}={item.get(k)}" for k in keys)
            yield Violation(
                field_path=field_path(*path, index),
                reason=Reason.INVALID_SPEC,
                message=f"duplicate entry {shown} (first at {field_path(*path, seen[key])})",
            )
        else:
            seen[key] = index

"""Reads manifests' YAML as ``kubectl`` does, so offline checks judge what the API server would receive.

``kubectl`` (through ``sigs.k8s.io/yaml``) reads YAML 1.1 the way go-yaml v2 does, then sends
JSON. PyYAML's YAML 1.1 differs on plain (unquoted) scalars, and each difference would make
``helmhive validate`` pass what the API server refuses, or the reverse:

==================  =====================  ======================
plain scalar        kubectl sends          PyYAML alone reads
==================  =====================  ======================
``y``, ``N``        ``true``, ``false``    the string
``1:30``            the string             90 (base 60)
``0o17``, ``08``    15, 8                  the string
``1e3``, ``+.5``    1000, 0.5              the string
``2027-01-15``      the string             a date
``y:`` as a key     ``"true"``             ``True``
==================  =====================  ======================

:class:`ManifestLoader` resolves every plain scalar with :func:`decide_plain_scalar` (go-yaml's
rules, then the JSON round trip: a whole float is an integer, ``.inf`` and a null key are refused
as kubectl refuses them) and makes every mapping key the string kubectl makes of it.
:class:`ManifestDumper` is its inverse for what Helmhive writes for Kubernetes tools (CRDs, the
chart, kubeconfigs, what the demo applies): a string kubectl would read as something else
(``y``, ``1e3``) is quoted. A stream whose first character is ``{`` is JSON to kubectl, not YAML
(:func:`is_json_stream`, :func:`load_json_stream`: tabs are fine there, ``NaN`` is not).
``tests/operator/test_manifest_yaml_kubectl.py`` compares it with a real ``kubectl``.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Hashable
from decimal import Decimal
from typing import Any

import yaml
from yaml.constructor import ConstructorError

__all__ = [
    "JsonStreamError",
    "ManifestDumper",
    "ManifestLoader",
    "decide_map_key",
    "decide_plain_scalar",
    "is_json_stream",
    "load_json_stream",
]

_PLAIN_TAG = "tag:helmhive.dev,2026:plain"

_WORDS: dict[str, Any] = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
"""go-yaml v2's resolve table: the only words that are not strings."""

_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
"""go-yaml v2's ``yamlStyleFloat`` (the text must also parse as a finite float64)."""
_DOT_FLOAT = re.compile(r"\.[0-9_]+([eE][-+]?[0-9_]+)?")
"""What Go's ``ParseFloat`` takes of a scalar that starts with a point (underscores only between digits)."""
_PREFIXED = re.compile(r"([-+]?)0([xXoObB])(.+)")
_INT64 = (-(2**63), 2**63 - 1)
_UINT64_MAX = 2**64 - 1
_BASES = {"x": 16, "o": 8, "b": 2}


def _digits(text: str, base: int) -> int | None:
    """``text`` as unsigned digits of ``base`` (no sign, no underscore), or None."""
    if not text or text[0] in "+-" or "_" in text:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def _go_parse_int(text: str) -> int | None:
    """Go's ``ParseInt(text, 0, 64)``, then ``ParseUint``: a prefix picks the base, a leading 0 is octal."""
    prefixed = _PREFIXED.fullmatch(text)
    if prefixed is not None:
        sign, base, rest = prefixed.groups()
        value = _digits(rest, _BASES[base.lower()])
    else:
        sign, body = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
        value = _digits(body[1:], 8) if len(body) > 1 and body[0] == "0" else _digits(body, 10)
        value = 0 if body == "0" else value
    if value is None:
        return None
    value = -value if sign == "-" else value
    if _INT64[0] <= value <= _INT64[1] or (not sign and value <= _UINT64_MAX):
        return value
    return None


def _go_binary_fallback(text: str) -> int | None:
    """go-yaml's last try: ``0b<digits>`` and ``-0b<digits>`` read by ``ParseInt(…, 2, 64)`` (which takes a sign)."""
    for prefix, negate in (("0b", False), ("-0b", True)):
        if text.startswith(prefix):
            rest = text[len(prefix) :]
            sign, digits = (rest[0], rest[1:]) if rest[:1] in ("+", "-") else ("", rest)
            value = _digits(digits, 2)
            if value is None:
                return None
            value = -value if sign == "-" else value
            if not _INT64[0] <= value <= _INT64[1]:
                return None
            return -value if negate else value
    return None


def _go_yaml_number(text: str) -> int | float | None:
    """What go-yaml v2 makes of a plain scalar that starts with a digit, a sign or a point, or None (a string)."""
    if text[0] == ".":  # go-yaml: Go's ParseFloat of the text as written
        if _DOT_FLOAT.fullmatch(text) is None or re.search(r"(?<![0-9])_|_(?![0-9])", text):
            return None  # an underscore must sit between two digits
        value = float(text.replace("_", ""))
        return value if math.isfinite(value) else None
    plain = text.replace("_", "")
    number = _go_parse_int(plain)
    if number is not None:
        return number
    if _FLOAT.fullmatch(plain):
        value = float(plain)
        if math.isfinite(value):  # Go's ParseFloat fails on overflow
            return value
    return _go_binary_fallback(plain)


def _as_json(value: int | float) -> int | float:
    """The number as kubectl sends it: int64, or a float64 that Go writes without a fraction is an integer."""
    if isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
        return value
    number = float(value)
    if number.is_integer() and abs(number) < 1e21:
        return int(Decimal(repr(number)))  # Go writes the shortest digits, then zeros: 1.8446744073709552e19 is …552000
    return number


def _go_yaml_value(text: str) -> Any:
    """What go-yaml v2 makes of a plain scalar: a bool, None, an int (int64 or uint64), a float or the string."""
    if text in _WORDS:
        return _WORDS[text]
    if text[0] in "+-.0123456789":
        value = _go_yaml_number(text)
        return text if value is None else value
    return text


def decide_plain_scalar(text: str) -> Any:
    """The value kubectl sends for a plain (unquoted) YAML scalar. Pure.

    Raises ValueError for ``.inf`` and ``.nan``, which JSON cannot hold (kubectl refuses them too).
    """
    value = _go_yaml_value(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{text!r} is not a number JSON can hold (kubectl refuses it too)")
    return _as_json(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _float32(value: float) -> float:
    """``float32(value)`` as Go converts it (to the nearest; beyond float32's range, an infinity)."""
    try:
        return float(struct.unpack("f", struct.pack("f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def _go_float32_g(value: float) -> str:
    """Go's ``FormatFloat(value, 'g', -1, 32)``: the shortest digits that read back as the same float32."""
    single = _float32(value)
    if math.isinf(single):
        return "+Inf" if single > 0 else "-Inf"
    digits = f"{single:.8e}"
    for precision in range(9):
        digits = f"{single:.{precision}e}"
        if _float32(float(digits)) == single:
            break
    mantissa, exponent_text = digits.split("e")
    exponent = int(exponent_text)
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    if exponent < -4 or exponent >= 6:  # Go's threshold for the shortest form
        return f"{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    return format(Decimal(digits).normalize(), "f")


def decide_map_key(key: Hashable) -> str:
    """The string kubectl makes of a mapping key, as go-yaml read it (``sigs.k8s.io/yaml``). Pure.

    Raises ValueError for a null key and a key beyond int64 (go-yaml's uint64), which kubectl refuses.
    """
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int) and _INT64[0] <= key <= _INT64[1]:
        return str(key)
    if isinstance(key, float):
        if math.isnan(key):
            return ".nan"
        text = _go_float32_g(key)
        return {"+Inf": ".inf", "-Inf": "-.inf"}.get(text, text)
    raise ValueError(f"a mapping key {key!r} of type {type(key).__name__} (kubectl refuses it: unsupported map key)")


class ManifestLoader(yaml.SafeLoader):
    """Safe YAML that reads plain scalars and keys as ``kubectl`` does (see the module)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0] and value != "<<":
            return _PLAIN_TAG
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]  # untyped in the stubs

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        """As PyYAML's, with each key made a string as it is built (``1`` and ``y`` stay two keys)."""
        if not isinstance(node, yaml.MappingNode):
            raise ConstructorError(None, None, f"expected a mapping node, but found {node.id}", node.start_mark)
        self.flatten_mapping(node)  # merge keys (<<), as go-yaml does
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            plain = isinstance(key_node, yaml.ScalarNode) and key_node.tag == _PLAIN_TAG
            key = _go_yaml_value(key_node.value) if plain else self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise ConstructorError(
                    "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
                )
            try:
                name = decide_map_key(key)
            except ValueError as err:
                raise ConstructorError(
                    "while constructing a mapping", node.start_mark, str(err), key_node.start_mark
                ) from None
            out[name] = self.construct_object(value_node, deep=deep)
        return out


def _construct_plain(loader: ManifestLoader, node: yaml.ScalarNode) -> Any:
    try:
        return decide_plain_scalar(node.value)
    except ValueError as err:
        raise ConstructorError(None, None, str(err), node.start_mark) from None


ManifestLoader.add_constructor(_PLAIN_TAG, _construct_plain)


_TAG = "tag:yaml.org,2002:"


class ManifestDumper(yaml.SafeDumper):
    """Safe YAML whose plain scalars ``kubectl`` reads back as what was written (strings stay strings)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            try:
                read = decide_plain_scalar(value)
            except ValueError:
                return f"{_TAG}float"  # .inf, .nan
            if isinstance(read, bool):
                return f"{_TAG}bool"
            if read is None:
                return f"{_TAG}null"
            if isinstance(read, int | float):
                # As the representers write them: a float always has a point, an exponent or a word.
                return f"{_TAG}float" if any(c in value for c in ".eEn") else f"{_TAG}int"
            return f"{_TAG}str"
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]  # untyped in the stubs


class JsonStreamError(ValueError):
    """A JSON manifest stream that does not parse; ``line`` and ``column`` are 1-based."""

    def __init__(self, message: str, *, line: int, column: int) -> None:
        super().__init__(message)
        self.line, self.column = line, column


def is_json_stream(text: str) -> bool:
    """Whether kubectl reads ``text`` as JSON (its first non-blank character is ``{``) rather than YAML."""
    return text.lstrip(" \t\r\n").startswith("{")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_json_stream(text: str) -> list[Any]:
    """The JSON objects of a stream, one after another, with numbers as kubectl sends them. Pure.

    Raises :class:`JsonStreamError` at the first that does not parse.
    """
    decoder = json.JSONDecoder(
        parse_float=lambda t: _as_json(float(t)) if math.isfinite(float(t)) else _no_constant(t),
        parse_int=lambda t: _as_json(int(t)),
        parse_constant=_no_constant,
    )
    found: list[Any] = []
    at = 0
    while True:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        if at >= len(text):
            return found
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as err:
            raise JsonStreamError(f"JSON: {err.msg}", line=err.lineno, column=err.colno) from None
        except ValueError as err:  # NaN, Infinity, an overflowing number
            line = text.count("\n", 0, at) + 1
            raise JsonStreamError(f"JSON: {err}", line=line, column=at - text.rfind("\n", 0, at)) from None
        found.append(value)

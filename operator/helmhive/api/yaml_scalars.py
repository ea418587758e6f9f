"""go-yaml v2's reading of a plain (unquoted) YAML scalar, and what kubectl then sends as JSON. Pure.

:func:`decide_plain_scalar` is the value of a plain scalar; :func:`decide_map_key` the string
kubectl makes of a mapping key; :func:`go_yaml_value` the value before the JSON round trip
(explicit tags and keys need it). :mod:`helmhive.api.manifest_yaml` builds the loader on them;
``tests/operator/test_manifest_yaml_kubectl.py`` compares them with a real kubectl.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Hashable
from decimal import Decimal
from typing import Any

__all__ = ["as_json", "decide_map_key", "decide_plain_scalar", "go_yaml_value"]

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


_DIGITS = {
    2: re.compile(r"[01]+"),
    8: re.compile(r"[0-7]+"),
    10: re.compile(r"[0-9]+"),
    16: re.compile(r"[0-9a-fA-F]+"),
}


def _digits(text: str, base: int) -> int | None:
    """``text`` as unsigned ASCII digits of ``base``, or None (Python's ``int`` would also take spaces and ``١٢``)."""
    if _DIGITS[base].fullmatch(text) is None:
        return None
    return int(text, base)


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


def as_json(value: int | float) -> int | float:
    """The number as kubectl sends it: int64, or a float64 that Go writes without a fraction is an integer."""
    if isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
        return value
    number = float(value)
    if number.is_integer() and abs(number) < 1e21:
        return int(Decimal(repr(number)))  # Go writes the shortest digits, then zeros: 1.8446744073709552e19 is …552000
    return number


def go_yaml_value(text: str) -> Any:
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
    value = go_yaml_value(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{text!r} is not a number JSON can hold (kubectl refuses it too)")
    return as_json(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


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

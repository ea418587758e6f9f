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

import base64
import binascii
import datetime as dt
import json
import math
import re
from collections.abc import Hashable, Iterator
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from helmhive.api.yaml_scalars import as_json, decide_map_key, decide_plain_scalar, go_yaml_value

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
_TAG = "tag:yaml.org,2002:"
_ALIAS_FREE_NODES = 400_000
"""go-yaml v2 lets a document expand to this many nodes whatever its aliases (then 10% at most from aliases)."""
_GO_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{1,2})-(\d{1,2})(?:[Tt ](\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.\d{1,9})?(Z|[+-]\d{2}:\d{2})?)?"
)


def _refuse(node: yaml.Node, problem: str) -> ConstructorError:
    return ConstructorError(None, None, problem, node.start_mark)


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes ``node`` stands for once every alias is expanded (memoised: aliases share nodes)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    size = 1 + sum(_expanded_size(child, sizes) for child in children)
    sizes[id(node)] = size
    return size


class ManifestLoader(yaml.SafeLoader):
    """Safe YAML that reads scalars, tags, keys and merges as ``kubectl`` does (see the module)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            return _PLAIN_TAG  # "<<" too: it merges only as a key (construct_mapping)
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]  # untyped in the stubs

    def compose_scalar_node(self, anchor: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in the stubs
        if event.tag == "!":  # YAML's non-specific tag: go-yaml reads the text as a string
            event.tag = f"{_TAG}str"
        return super().compose_scalar_node(anchor)

    def construct_document(self, node: Any) -> Any:
        # A billion-laughs document: refused as go-yaml refuses it, before anything walks it.
        sizes: dict[int, int] = {}
        expanded = _expanded_size(node, sizes)
        if expanded > _ALIAS_FREE_NODES and (expanded - len(sizes)) * 10 > expanded:
            raise _refuse(node, f"the document contains excessive aliasing ({expanded} nodes once expanded)")
        return super().construct_document(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        """Keys made strings as kubectl makes them; ``<<`` merges in document order, as go-yaml does.

        A later key (merged or not) replaces an earlier one; of a list of maps merged, the first wins.
        """
        if not isinstance(node, yaml.MappingNode):
            raise _refuse(node, f"expected a mapping node, but found {node.id}")
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if _is_merge(key_node):
                for source in _merge_sources(value_node):
                    out.update(self.construct_mapping(source, deep=True))
                continue
            plain = isinstance(key_node, yaml.ScalarNode) and key_node.tag == _PLAIN_TAG
            key = go_yaml_value(key_node.value) if plain else self.construct_object(key_node, deep=deep)
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


def _is_merge(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and (
        (node.tag == _PLAIN_TAG and node.value == "<<") or node.tag == f"{_TAG}merge"
    )


def _merge_sources(node: yaml.Node) -> Iterator[yaml.MappingNode]:
    """The maps a ``<<`` merges, in the order go-yaml applies them (so the first listed wins)."""
    if isinstance(node, yaml.MappingNode):
        yield node
        return
    if isinstance(node, yaml.SequenceNode) and all(isinstance(n, yaml.MappingNode) for n in node.value):
        yield from reversed(node.value)
        return
    raise _refuse(node, "map merge requires map or sequence of maps as the value")


def _construct_plain(loader: ManifestLoader, node: yaml.ScalarNode) -> Any:
    try:
        return decide_plain_scalar(node.value)
    except ValueError as err:
        raise _refuse(node, str(err)) from None


def _tagged(want: str) -> Any:
    """A constructor for ``!!bool``, ``!!int``, ``!!float`` or ``!!null``: the text as go-yaml reads it, checked."""

    def construct(loader: ManifestLoader, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise _refuse(node, f"cannot decode a collection as a !!{want}")
        value = go_yaml_value(node.value)
        ok = {
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, int | float) and not isinstance(value, bool),
            "null": value is None,
        }[want]
        if not ok:
            raise _refuse(node, f"cannot decode `{node.value[:40]}` as a !!{want}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value) if want == "float" else value
            if isinstance(number, float) and not math.isfinite(number):
                raise _refuse(node, f"{node.value[:40]!r} is not a number JSON can hold (kubectl refuses it too)")
            return as_json(number)
        return value

    return construct


def _construct_timestamp(loader: ManifestLoader, node: yaml.ScalarNode) -> str:
    """A ``!!timestamp``: checked as Go parses it, and sent as written (as kubectl sends a timestamp)."""
    match = _GO_TIMESTAMP.fullmatch(str(node.value))
    try:
        if match is None:
            raise ValueError(node.value)
        dt.date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        raise _refuse(node, f"cannot decode `{str(node.value)[:40]}` as a !!timestamp") from None
    return str(node.value)


def _construct_binary(loader: ManifestLoader, node: yaml.ScalarNode) -> str:
    """A ``!!binary``: go-yaml decodes it, and kubectl sends the bytes as a (UTF-8) string."""
    try:
        raw = base64.b64decode("".join(str(node.value).split()), validate=True)
    except (binascii.Error, ValueError):
        raise _refuse(node, "cannot decode a !!binary that is not base64") from None
    return raw.decode("utf-8", errors="replace")


def _construct_as_map(loader: ManifestLoader, node: yaml.Node) -> dict[str, Any]:
    """``!!set``: go-yaml knows no sets; it is a map (of nulls)."""
    return loader.construct_mapping(node, deep=True)


def _construct_as_list(loader: ManifestLoader, node: yaml.Node) -> list[Any]:
    """``!!omap`` and ``!!pairs``: go-yaml reads the sequence as it is, a list of one-key maps."""
    if not isinstance(node, yaml.SequenceNode):
        raise _refuse(node, f"expected a sequence node, but found {type(node).__name__}")
    return [loader.construct_object(child, deep=True) for child in node.value]


def _construct_unknown(loader: ManifestLoader, node: yaml.Node) -> Any:
    """A tag go-yaml does not resolve (``!foo``): the node is read as if untagged, a scalar as its text."""
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return [loader.construct_object(child, deep=True) for child in node.value]
    return str(node.value)


ManifestLoader.add_constructor(_PLAIN_TAG, _construct_plain)
for _want in ("bool", "int", "float", "null"):
    ManifestLoader.add_constructor(f"{_TAG}{_want}", _tagged(_want))
ManifestLoader.add_constructor(f"{_TAG}timestamp", _construct_timestamp)
ManifestLoader.add_constructor(f"{_TAG}binary", _construct_binary)
ManifestLoader.add_constructor(f"{_TAG}set", _construct_as_map)
ManifestLoader.add_constructor(f"{_TAG}omap", _construct_as_list)
ManifestLoader.add_constructor(f"{_TAG}pairs", _construct_as_list)
ManifestLoader.add_constructor(None, _construct_unknown)


class ManifestDumper(yaml.SafeDumper):
    """Safe YAML whose plain scalars ``kubectl`` reads back as what was written (strings stay strings)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            if value == "<<":
                return f"{_TAG}merge"  # quoted: as a key, kubectl would merge
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
    """A JSON manifest stream that does not parse; ``line`` and ``column`` are 1-based.

    ``decoded`` holds the objects before the one that failed, which starts at ``offset``: kubectl
    reads the rest as YAML when at most one object came before (apimachinery's YAMLOrJSONDecoder).
    """

    def __init__(self, message: str, *, line: int, column: int, decoded: list[Any], offset: int) -> None:
        super().__init__(message)
        self.line, self.column = line, column
        self.decoded, self.offset = decoded, offset


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
        parse_float=lambda t: as_json(float(t)) if math.isfinite(float(t)) else _no_constant(t),
        parse_int=lambda t: as_json(int(t)),
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
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError as err:
            raise JsonStreamError(
                f"JSON: {err.msg}", line=err.lineno, column=err.colno, decoded=found, offset=at
            ) from None
        except ValueError as err:  # NaN, Infinity, an overflowing number
            line, column = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
            raise JsonStreamError(f"JSON: {err}", line=line, column=column, decoded=found, offset=at) from None
        found.append(value)
        at = end

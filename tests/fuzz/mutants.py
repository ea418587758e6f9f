"""Mutated Helmhive manifests for property-based fuzzing, with what each mutation must be refused for.

The seeds are the shipped examples (``examples/*.yaml``) plus one valid object of each kind
the examples do not show (Envelope, Runner, SessionBinding, AuditRecord). A :class:`Mutant`
is a seed changed by one *targeted* mutation, which knows the field path and reasons it must
be refused with (a string one past its ``maxLength``, a value outside its enum, ...), or by a
stack of *random* ones (wrong types, dropped and unknown fields, arbitrary values), which
carry no expectation beyond "never crash".

Every mutation reads the generated offline schema (:func:`helmhive.policy.validation.manifests`'s
source, :func:`helmhive.api.crdgen.build_offline_schema`) to find the bounds, enums and
patterns it breaks, so a new field is fuzzed without a change here.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.crdgen import build_offline_schema
from helmhive.api.kinds import API_VERSION, KINDS
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import ENVELOPES
from helmhive.policy.violations import PathSegment, field_path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SCHEMAS: dict[str, dict[str, Any]] = {k.kind: build_offline_schema(k) for k in KINDS}

# Reasons that depend on other objects in the set, not on the object alone.
CROSS_OBJECT = frozenset(
    {
        Reason.PROFILE_NOT_FOUND,
        Reason.PROFILE_KIND_MISMATCH,
        Reason.SERVICE_NOT_IN_WORKSPACE,
        Reason.DUPLICATE_OBJECT,
        Reason.ENVELOPE_DIFFERS_FROM_CODE,
    }
)

_COMMIT = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def _extra_seeds() -> list[dict[str, Any]]:
    """One valid object of each kind the examples do not show."""
    envelope = ENVELOPES[next(iter(ENVELOPES))]
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "Envelope",
            "metadata": {"name": envelope.job_kind.value},
            "spec": envelope.to_wire(),
        },
        {
            "apiVersion": API_VERSION,
            "kind": "Runner",
            "metadata": {"name": "anthropic-eu-0"},
            "spec": {"poolRef": {"name": "anthropic-eu"}, "controlState": "Active"},
        },
        {
            "apiVersion": API_VERSION,
            "kind": "SessionBinding",
            "metadata": {"name": "payments-quick-review-anthropic"},
            "spec": {
                "workspace": "payments",
                "profile": "quick-review",
                "provider": "anthropic",
                "runner": "anthropic-eu-0",
                "credentialGeneration": 1,
                "scope": "service",
                "service": "api",
            },
        },
        {
            "apiVersion": API_VERSION,
            "kind": "AuditRecord",
            "metadata": {"name": "job-routed-check-anthropic-login"},
            "spec": {
                "action": "JobRouted",
                "actor": {"username": "system:serviceaccount:helmhive-system:helmhive-operator"},
                "object": {"apiVersion": API_VERSION, "kind": "AgentJob", "name": "check-anthropic-login"},
                "time": "2026-12-01T10:00:00Z",
                "message": "routed to anthropic-eu-0",
                "details": {"model": "claude-sonnet-4-5"},
            },
        },
        # An AgentJob with an exact source, so the SourceRef rules are fuzzed on jobs too.
        {
            "apiVersion": API_VERSION,
            "kind": "AgentJob",
            "metadata": {"name": "review-at-commit"},
            "spec": {
                "workspace": "payments",
                "jobKind": "review-probe",
                "profile": "quick-review",
                "request": {"title": "Review", "prompt": "Review the diff."},
                "source": {"repository": "https://git.example.com/acme/payments.git", "commit": _COMMIT},
            },
        },
    ]


@functools.cache
def example_set() -> tuple[dict[str, Any], ...]:
    """Every document of ``examples/*.yaml`` (a consistent, valid set), then the extra seeds."""
    docs: list[dict[str, Any]] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if isinstance(d, dict)]
    return (*docs, *_extra_seeds())


def seed_key(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@dataclass(frozen=True)
class Expect:
    """The mutant must be refused with an issue at ``path`` (or below it) with one of ``reasons``."""

    path: str
    reasons: frozenset[Reason]


@dataclass(frozen=True)
class Mutant:
    body: Any
    seed: str
    ops: tuple[str, ...]
    expect: tuple[Expect, ...] = ()
    single_object: bool = True
    """False when the mutation is about references between objects (only the offline set sees it)."""
    notes: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.seed}: {'; '.join(self.ops)}"


# --- walking documents and schemas ---------------------------------------------------------------


def walk(value: Any, path: tuple[PathSegment, ...] = ()) -> Iterator[tuple[tuple[PathSegment, ...], Any]]:
    """Every (path, value) in a document, parents before children."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from walk(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk(item, (*path, index))


def schema_at(schema: dict[str, Any], path: tuple[PathSegment, ...]) -> dict[str, Any] | None:
    """The schema node that governs ``path`` (None inside free-form values)."""
    node: Any = schema
    for segment in path:
        if not isinstance(node, dict) or node.get("x-kubernetes-preserve-unknown-fields"):
            return None
        if isinstance(segment, int):
            node = node.get("items")
        elif segment in node.get("properties", {}):
            node = node["properties"][segment]
        else:
            node = node.get("additionalProperties")
    return node if isinstance(node, dict) else None


def get_at(doc: Any, path: tuple[PathSegment, ...]) -> Any:
    for segment in path:
        doc = doc[segment]
    return doc


def set_at(doc: Any, path: tuple[PathSegment, ...], value: Any) -> None:
    get_at(doc, path[:-1])[path[-1]] = value


def delete_at(doc: Any, path: tuple[PathSegment, ...]) -> None:
    del get_at(doc, path[:-1])[path[-1]]


def go_pattern(pattern: str) -> re.Pattern[str]:
    """``pattern`` as RE2 and ECMA-262 read it: ``$`` is the end of the text, not before a final newline."""
    out, in_class, escaped = [], False, False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == "[":
            in_class = True
            out.append(char)
        elif char == "]":
            in_class = False
            out.append(char)
        elif char == "$" and not in_class:
            out.append(r"\Z")
        else:
            out.append(char)
    return re.compile("".join(out))


# --- values -----------------------------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    _TEXT,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=6,
)


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def type_conflicts(schema_type: str, value: Any) -> bool:
    """Whether ``value`` is refused by ``type: schema_type`` (as both JSON Schema and the API server see it)."""
    have = _type_of(value)
    if have == "null":
        return False  # the API server prunes nulls of optional fields; not a clear-cut expectation
    if schema_type == "number":
        return have not in ("integer", "number")
    if schema_type == "integer" and have == "number":
        return not float(value).is_integer()
    return have != schema_type


_OTHER_TYPE_VALUES: dict[str, Any] = {
    "string": 7,
    "integer": "seven",
    "number": "seven",
    "boolean": "yes",
    "array": {"a": 1},
    "object": ["a"],
}

BAD_NAMES = (
    "",
    "Payments",
    "pay_ments",
    "-payments",
    "payments-",
    "pay..ments",
    "payments\n",
    "pay ments",
    "päyments",
    "a" * 254,
    ".payments",
)
BAD_COMMITS = (
    "main",
    "4b825dc",
    _COMMIT.upper(),
    _COMMIT + "\n",
    " " + _COMMIT,
    _COMMIT[:-1],
    _COMMIT + "0",
    _COMMIT + "a" * 25,
    "g" * 40,
    "refs/heads/main",
    "",
)
BAD_REPOSITORIES = (
    "git.example.com/acme/payments.git",
    "ssh://git@git.example.com/acme/payments.git",
    "https://user:hunter2@git.example.com/acme/payments.git",
    "https://git.example.com/acme/payments.git?ref=main",
    "https://git.example.com/acme/payments.git#main",
    "https://git.example.com",
    "https://git.example.com/acme pay.git",
    "file:///srv/payments.git",
    "https://git.example.com/acme/payments.git\n",
    "",
    "https://" + "a" * 2048 + "/x.git",
)
BAD_DATES = (
    "1700000000",
    "2027-01-15",
    "2027-13-01T00:00:00Z",
    "2027-02-30T00:00:00Z",
    "2027-01-15T24:00:00Z",
    "tomorrow",
    "2027-01-15 00:00",
    "2027-01-15T00:00:00",
    "",
)
ODD_DATES = (
    # What the API server's date-time takes, though it looks unusual: both sides must still agree.
    "2027-01-15t00:00:00z",
    "2027-01-15T00:00:00.123456789Z",
    "2027-01-15T00:00:00+23:59",
    "2027-01-15T00:00:00+25:00",
    "2027-01-15T23:59:59-00:00",
    "2027-01-15T00:00:00x5Z",
    "2027-01-15T00:00:00ZTjunk",
    "0001-01-01T00:00:00Z",
)


def _pattern_breakers(value: str) -> list[str]:
    return [
        value + "\n",
        " " + value,
        value.upper() + "A",
        value + "_",
        value + "@",
        "-" + value,
        value + "!",
        "",
        "\u00e9" + value,
    ]


# --- targeted mutations ---------------------------------------------------------------------------

_BOUND = frozenset({Reason.OVER_LIMIT, Reason.INVALID_SPEC})
_INVALID = frozenset({Reason.INVALID_SPEC})


def _candidates(doc: dict[str, Any]) -> list[tuple[tuple[PathSegment, ...], Any, dict[str, Any]]]:
    schema = SCHEMAS[doc["kind"]]
    out = []
    for path, value in walk(doc):
        if not path or path[0] not in ("spec", "metadata"):
            continue
        if path[0] == "metadata" and path != ("metadata", "name"):
            continue
        node = schema_at(schema, path)
        if node is not None:
            out.append((path, value, node))
    return out


@st.composite
def targeted(draw: st.DrawFn, seeds: tuple[dict[str, Any], ...]) -> Mutant:
    """One seed, one mutation whose refusal is certain, with the path and reasons it must be refused with."""
    seed = draw(st.sampled_from(seeds))
    doc = copy.deepcopy(seed)
    key = seed_key(seed)
    kind = seed["kind"]
    op = draw(
        st.sampled_from(
            ["wrong_type", "drop_required", "unknown_field", "oversize", "bad_enum", "bad_pattern", "bad_name"]
            + (
                ["bad_source"]
                if isinstance(doc["spec"].get("source"), dict) and "commit" in doc["spec"]["source"]
                else []
            )
            + (["widen_profile"] if kind == "Profile" else [])
            + (["bad_date"] if any(n.get("format") == "date-time" for _, _, n in _candidates(doc)) else [])
        )
    )
    candidates = _candidates(doc)

    def pick(predicate: Any) -> tuple[tuple[PathSegment, ...], Any, dict[str, Any]] | None:
        chosen = [c for c in candidates if predicate(c)]
        return draw(st.sampled_from(chosen)) if chosen else None

    def done(description: str, path: tuple[PathSegment, ...], reasons: frozenset[Reason]) -> Mutant:
        return Mutant(body=doc, seed=key, ops=(description,), expect=(Expect(field_path(*path), reasons),))

    if op == "wrong_type":
        found = pick(lambda c: "type" in c[2] and len(c[0]) > 1)
        if found is not None:
            path, _, node = found
            replacement = draw(st.one_of(json_values, st.just(_OTHER_TYPE_VALUES[node["type"]])))
            set_at(doc, path, replacement)
            if type_conflicts(node["type"], replacement):
                return done(f"{field_path(*path)} = {replacement!r} (wants {node['type']})", path, _INVALID)
            return Mutant(body=doc, seed=key, ops=(f"{field_path(*path)} = {replacement!r}",))
    if op == "drop_required":
        schema = SCHEMAS[kind]
        found = pick(lambda c: len(c[0]) > 1 and c[0][-1] in ((schema_at(schema, c[0][:-1]) or {}).get("required", ())))
        if found is not None:
            path = found[0]
            delete_at(doc, path)
            return done(f"drop required {field_path(*path)}", path, _INVALID)
    if op == "unknown_field":
        found = pick(
            lambda c: (
                isinstance(c[1], dict)
                and "properties" in c[2]
                and not c[2].get("x-kubernetes-preserve-unknown-fields")
                and c[0] != ("metadata",)
            )
        )
        if found is not None:
            path, value, node = found
            name = draw(st.from_regex(r"\A[a-z][A-Za-z0-9]{0,15}\Z").filter(lambda n: n not in node["properties"]))
            value[name] = draw(json_values)
            return done(f"unknown field {field_path(*path, name)}", (*path, name), frozenset({Reason.UNKNOWN_FIELD}))
    if op == "oversize":
        found = pick(lambda c: any(b in c[2] for b in ("maxLength", "maxItems", "maxProperties")))
        if found is not None:
            path, value, node = found
            at_bound = draw(st.booleans())
            if "maxLength" in node and isinstance(value, str) and value:
                limit = int(node["maxLength"])
                size = limit if at_bound else limit + 1
                filler = value[-1] if value[-1].isalnum() else "a"
                new = (value + filler * size)[:size] if len(value) < size else value[:size]
                if "pattern" in node and not go_pattern(node["pattern"]).search(new):
                    new = "a" * size
                set_at(doc, path, new)
                if at_bound:
                    return Mutant(
                        body=doc,
                        seed=key,
                        ops=(f"{field_path(*path)}: {size} characters (at the bound)",),
                        notes={"not_over": field_path(*path)},
                    )
                return done(f"{field_path(*path)}: {size} characters (limit {limit})", path, _BOUND)
            if "maxItems" in node and isinstance(value, list) and value:
                limit = int(node["maxItems"])
                size = limit + 1
                items = [copy.deepcopy(value[i % len(value)]) for i in range(size)]
                set_at(doc, path, items)
                return done(f"{field_path(*path)}: {size} items (limit {limit})", path, _BOUND)
            if "maxProperties" in node and isinstance(value, dict):
                limit = int(node["maxProperties"])
                template = next(iter(value.values()), "v")
                grown = {**value, **{f"k{i}": copy.deepcopy(template) for i in range(limit + 1)}}
                set_at(doc, path, grown)
                return done(f"{field_path(*path)}: {len(grown)} entries (limit {limit})", path, _BOUND)
    if op == "bad_enum":
        found = pick(lambda c: "enum" in c[2] and isinstance(c[1], str))
        if found is not None:
            path, value, node = found
            bad = draw(
                st.sampled_from([value.upper() + "X", value + " ", "", "unknown", value[:-1] or "x"]).filter(
                    lambda v: v not in node["enum"]
                )
            )
            set_at(doc, path, bad)
            return done(f"{field_path(*path)} = {bad!r} (enum)", path, _INVALID)
    if op == "bad_pattern":
        found = pick(lambda c: "pattern" in c[2] and isinstance(c[1], str))
        if found is not None:
            path, value, node = found
            regex = go_pattern(node["pattern"])
            choices = [b for b in _pattern_breakers(value) if not regex.search(b)]
            if choices:
                bad = draw(st.sampled_from(choices))
                set_at(doc, path, bad)
                return done(f"{field_path(*path)} = {bad!r} (pattern {node['pattern']})", path, _BOUND)
    if op == "bad_name":
        bad = draw(st.sampled_from(BAD_NAMES))
        doc["metadata"]["name"] = bad
        return done(f"metadata.name = {bad!r}", ("metadata", "name"), _BOUND)
    if op == "bad_source":
        which = draw(st.sampled_from(["commit", "repository"]))
        node = schema_at(SCHEMAS[kind], ("spec", "source", which)) or {}
        regex = go_pattern(node.get("pattern", ""))
        # Only what the schema truly refuses (a newline inside a URL's path matches its pattern).
        refused = [
            b
            for b in (BAD_COMMITS if which == "commit" else BAD_REPOSITORIES)
            if not regex.search(b) or len(b) > node.get("maxLength", len(b)) or len(b) < node.get("minLength", 0)
        ]
        bad = draw(st.sampled_from(refused))
        doc["spec"]["source"][which] = bad
        return done(f"spec.source.{which} = {bad[:80]!r}", ("spec", "source", which), _BOUND)
    if op == "bad_date":
        found = pick(lambda c: c[2].get("format") == "date-time")
        if found is not None:
            path = found[0]
            if draw(st.booleans()):
                odd = draw(st.sampled_from(ODD_DATES))
                set_at(doc, path, odd)
                return Mutant(body=doc, seed=key, ops=(f"{field_path(*path)} = {odd!r} (odd date-time)",))
            bad = draw(st.sampled_from(BAD_DATES))
            set_at(doc, path, bad)
            return done(f"{field_path(*path)} = {bad!r} (date-time)", path, _INVALID)
    if op == "widen_profile":
        return _widen(draw, doc, key)
    return Mutant(body=doc, seed=key, ops=("unchanged",))


_PROFILE_REASONS = frozenset(
    {
        Reason.TOOL_OUTSIDE_ENVELOPE,
        Reason.FILESYSTEM_WIDER_THAN_ENVELOPE,
        Reason.NETWORK_WIDER_THAN_ENVELOPE,
        Reason.MEMORY_FORBIDDEN,
        Reason.REVIEW_PROFILE_WRITES,
        Reason.INVALID_SPEC,
    }
)


def _widen(draw: st.DrawFn, doc: dict[str, Any], key: str) -> Mutant:
    """Ask for more than the profile's envelope allows: a tool, filesystem, network or memory."""
    spec = doc["spec"]
    envelope = ENVELOPES.get(spec["envelope"])
    options: list[str] = []
    if envelope is not None:
        if set(ToolKind) - set(envelope.max_tools):
            options.append("tools")
        if envelope.filesystem is not FilesystemAccess.WRITE:
            options.append("filesystem")
        if envelope.network is NetworkAccess.DISABLED:
            options.append("network")
        if envelope.memory.value == "forbidden":
            options.append("memory")
    if not options:
        return Mutant(body=doc, seed=key, ops=("unchanged (envelope allows everything)",))
    what = draw(st.sampled_from(options))
    if what == "tools":
        assert envelope is not None
        extra = draw(st.sampled_from(sorted(set(ToolKind) - set(envelope.max_tools))))
        spec["tools"] = [*(spec.get("tools") or [t.value for t in envelope.max_tools]), extra.value][:16]
        path = "spec.tools"
    elif what == "filesystem":
        spec["filesystem"] = "write"
        path = "spec.filesystem"
    elif what == "network":
        spec["network"] = "enabled"
        path = "spec.network"
    else:
        spec["memory"] = {"enabled": True}
        path = "spec.memory"
    return Mutant(body=doc, seed=key, ops=(f"widen {what}",), expect=(Expect(path, _PROFILE_REASONS),))


# --- random stacks -----------------------------------------------------------------------------------


@st.composite
def stacked(draw: st.DrawFn, seeds: tuple[dict[str, Any], ...]) -> Mutant:
    """One seed changed by one to four random edits anywhere (no expectation: only "never crash")."""
    seed = draw(st.sampled_from(seeds))
    doc: Any = copy.deepcopy(seed)
    ops: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = [p for p, _ in walk(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "drop", "add", "duplicate"]))
        parent = get_at(doc, path[:-1])
        if action == "replace":
            value = draw(json_values)
            parent[path[-1]] = value
            ops.append(f"{field_path(*path)} = {value!r}")
        elif action == "drop":
            del parent[path[-1]]
            ops.append(f"drop {field_path(*path)}")
        elif action == "add" and isinstance(parent, dict):
            name = draw(_TEXT)
            parent[name] = draw(json_values)
            ops.append(f"add {field_path(*path[:-1], name)}")
        elif action == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[path[-1]]))
            ops.append(f"duplicate {field_path(*path)}")
    return Mutant(body=doc, seed=seed_key(seed), ops=tuple(ops) or ("unchanged",))


_REFERENCE_FIELDS = (
    ("AgentJob", ("spec", "workspace")),
    ("AgentJob", ("spec", "profile")),
    ("Change", ("spec", "service")),
    ("MemoryRecord", ("spec", "scope", "service")),
    ("Workspace", ("spec", "profiles", 0, "profile")),
)


@st.composite
def wrong_reference(draw: st.DrawFn) -> Mutant:
    """A reference to an object (or service) that is not in the example set: only the set can tell."""
    seeds = example_set()
    options = [
        (i, path)
        for i, doc in enumerate(seeds)
        for kind, path in _REFERENCE_FIELDS
        if doc["kind"] == kind and _has(doc, path)
    ]
    index, path = draw(st.sampled_from(options))
    doc = copy.deepcopy(seeds[index])
    set_at(doc, path, draw(st.sampled_from(["nowhere", "payments-old", "ghost"])))
    reasons = frozenset({Reason.PROFILE_NOT_FOUND, Reason.SERVICE_NOT_IN_WORKSPACE})
    # A Workspace that is not in the set is not guessed at, so only the other references are expected.
    expect = (Expect(field_path(*path), reasons),) if path != ("spec", "workspace") else ()
    return Mutant(
        body=doc, seed=seed_key(doc), ops=(f"{field_path(*path)} -> missing",), expect=expect, single_object=False
    )


def _has(doc: Any, path: tuple[PathSegment, ...]) -> bool:
    try:
        get_at(doc, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True


def mutants(seeds: tuple[dict[str, Any], ...] | None = None) -> st.SearchStrategy[Mutant]:
    chosen = seeds if seeds is not None else example_set()
    return st.one_of(targeted(chosen), stacked(chosen))

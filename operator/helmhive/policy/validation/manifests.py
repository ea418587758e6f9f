"""Offline validation of a set of manifests: schema, single-object rules and cross-object rules.

This is the rule book behind ``helmhive validate``. The command line reads files and
parses YAML; this module gets the parsed documents and returns every
:class:`ValidationIssue` at once, each with a field path and a named reason. It never
raises on bad input.

For each document, in order:

1. **Shape.** It must be a mapping with ``apiVersion`` and ``kind``. A document with
   neither is not a Kubernetes object and is skipped (a CI workflow file in the same
   folder, say). An ``apiVersion`` that is not ``version`` or ``group/version`` is
   ``InvalidDocument`` whatever its group (no API server could take it). Objects of other
   API groups are skipped too, except that an ``apiVersion`` that names a ``helmhive`` group
   other than ``helmhive.dev/v1alpha1`` (or no group for a Helmhive kind) is
   ``WrongApiVersion``, and an unknown kind in ``helmhive.dev`` is ``UnknownKind``.
2. **Schema.** The generated CRD schema (:func:`helmhive.api.crdgen.build_offline_schema`)
   checked with ``jsonschema`` as the API server reads it (RE2 patterns, its ``date-time``,
   null fields pruned: :mod:`helmhive.policy.validation.apiserver`), unknown fields refused as
   ``kubectl apply`` does;
   plus what the API server adds beyond JSON Schema: the CRDs' create-time CEL rules
   and the uniqueness of keyed lists (``x-kubernetes-list-type: map``;
   :mod:`helmhive.policy.validation.rules`).
3. **Model.** The spec parsed by its pydantic model (catches, for example, timestamps).
4. **Cross-object rules** over every object that parsed:

   * a Profile against its envelope from the code catalogue (:func:`decide_profile`);
   * an Envelope object must equal the code catalogue's;
   * a profile named by a Workspace binding or an AgentJob must be in the set (same
     namespace) or be declared external; if it is in the set, its envelope must be the
     job kind it is bound to (``ProfileKindMismatch``);
   * an AgentJob without a profile, and a Change (planning, implementation, review),
     need a binding in their Workspace when that Workspace is in the set;
   * a service named by a MemoryRecord scope, an AgentJob or a Change must be a service
     of its Workspace when that Workspace is in the set;
   * an object may be defined only once per kind, namespace and name.

References resolve within one ``metadata.namespace`` (an unset namespace matches only
unset). A profile is external when it is listed in ``external_profiles`` (``NAME`` or
``NAMESPACE/NAME``) or in the referencing object's ``helmhive.dev/external-profiles``
annotation (a comma-separated list of names, or ``*`` for all).

Pure: no file or network I/O and no clock.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

# Typed by types-jsonschema when it is installed; without it the ignore keeps mypy clean.
from jsonschema.exceptions import ValidationError as SchemaValidationError  # type: ignore[import-untyped,unused-ignore]
from pydantic import ValidationError as ModelValidationError

from helmhive.api.crdgen import build_offline_schema
from helmhive.api.kinds import API_VERSION, GROUP, KINDS, KindDef
from helmhive.api.reasons import Reason
from helmhive.policy.validation.apiserver import ApiServerValidator, without_nulls
from helmhive.policy.validation.model import (
    CheckedObject,
    SkippedDocument,
    SourceDocument,
    ValidationIssue,
    ValidationReport,
)
from helmhive.policy.validation.refs import EXTERNAL_PROFILES_ANNOTATION, GOVERNED_STAGES, apply_cross_object_rules
from helmhive.policy.validation.rules import cel_rule_supported, decide_server_rules
from helmhive.policy.violations import PathSegment, Violation, field_path

__all__ = [
    "EXTERNAL_PROFILES_ANNOTATION",
    "GOVERNED_STAGES",
    "SkippedDocument",
    "SourceDocument",
    "ValidationIssue",
    "ValidationReport",
    "cel_rule_supported",
    "validate_documents",
]

_KINDS_BY_NAME: Mapping[str, KindDef] = {k.kind: k for k in KINDS}
_API_VERSION_FORMAT = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
)
"""``version`` or ``group/version``: what the API server can serve (anything else no client can apply)."""
_MESSAGE_LIMIT = 300


def validate_documents(
    *, documents: Sequence[SourceDocument], external_profiles: Collection[str] = ()
) -> ValidationReport:
    """Check every document and every cross-object rule; return all issues together."""
    issues: list[ValidationIssue] = []
    skipped: list[SkippedDocument] = []
    objects: list[CheckedObject] = []
    for doc in documents:
        found = _classify(doc, issues, skipped)
        if found is not None:
            try:
                _check_object(found)
            except RecursionError:
                found.spec = None
                found.issues = []
                found.issue("", Reason.INVALID_DOCUMENT, "nested too deeply to check (hundreds of levels)")
            objects.append(found)
    apply_cross_object_rules(objects, external=frozenset(external_profiles))
    for obj in objects:
        issues.extend(obj.issues)
    order = {(d.file, d.index): n for n, d in enumerate(documents)}
    issues.sort(key=lambda i: order.get((i.file, i.document), 0))
    return ValidationReport(issues=tuple(issues), objects=len(objects), skipped=tuple(skipped))


# --- 1. shape -------------------------------------------------------------------------------


def _classify(
    doc: SourceDocument, issues: list[ValidationIssue], skipped: list[SkippedDocument]
) -> CheckedObject | None:
    def fail(path: str, reason: Reason, message: str, kind: str = "", name: str = "") -> None:
        issues.append(
            ValidationIssue(
                file=doc.file,
                kind=kind,
                name=name,
                field_path=path,
                reason=reason,
                message=message,
                document=doc.index,
            )
        )

    if doc.load_reason is not None:
        fail("", doc.load_reason, doc.load_message)
        return None
    body = doc.body
    if body is None:
        return None
    if not isinstance(body, dict):
        fail("", Reason.INVALID_DOCUMENT, f"a manifest must be a mapping, not {_type_name(body)}")
        return None
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if api_version is None and kind is None:
        skipped.append(
            SkippedDocument(file=doc.file, document=doc.index, why="not a Kubernetes object (no apiVersion or kind)")
        )
        return None
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    name = name if isinstance(name, str) else ""
    kind_text = kind if isinstance(kind, str) else ""
    if not isinstance(kind, str) or not kind:
        fail("kind", Reason.INVALID_DOCUMENT, "kind must be a non-empty string", name=name)
        return None
    if not isinstance(api_version, str) or not api_version:
        fail("apiVersion", Reason.INVALID_DOCUMENT, "apiVersion must be a non-empty string", kind_text, name)
        return None
    if _API_VERSION_FORMAT.fullmatch(api_version) is None:
        fail(
            "apiVersion",
            Reason.INVALID_DOCUMENT,
            f"{api_version!r} is not an apiVersion: expected 'version' or 'group/version' "
            "(a DNS subdomain, then a DNS label)",
            kind_text,
            name,
        )
        return None
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    ours = group == GROUP or "helmhive" in group or (not group and kind in _KINDS_BY_NAME)
    if not ours:
        skipped.append(SkippedDocument(file=doc.file, document=doc.index, why=f"{api_version} {kind}"))
        return None
    if api_version != API_VERSION:
        fail(
            "apiVersion",
            Reason.WRONG_API_VERSION,
            f"{api_version!r} is not served; Helmhive kinds are {API_VERSION}",
            kind_text,
            name,
        )
        return None
    if kind not in _KINDS_BY_NAME:
        fail(
            "kind",
            Reason.UNKNOWN_KIND,
            f"{kind!r} is not a kind of {API_VERSION} (known: {', '.join(sorted(_KINDS_BY_NAME))})",
            kind_text,
            name,
        )
        return None
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return CheckedObject(
        doc=doc,
        kind=kind,
        name=name,
        namespace=namespace if isinstance(namespace, str) else "",
        annotations=annotations if isinstance(annotations, dict) else {},
    )


# --- 2 and 3. schema, API-server rules and the model ---------------------------------------------


@functools.cache
def _schema(kind: str) -> dict[str, Any]:
    return build_offline_schema(_KINDS_BY_NAME[kind])


@functools.cache
def _validator(kind: str) -> Any:
    return ApiServerValidator(_schema(kind))


def _check_object(obj: CheckedObject) -> None:
    validator = _validator(obj.kind)
    body = without_nulls(_schema(obj.kind), obj.doc.body)
    schema_errors = sorted(validator.iter_errors(body), key=lambda e: [str(p) for p in e.absolute_path])
    for error in schema_errors:
        for violation in _schema_violations(error):
            obj.violation(violation)
    server_rules = list(decide_server_rules(_schema(obj.kind), body, ()))
    for violation in server_rules:
        obj.violation(violation)
    if schema_errors or server_rules:
        return
    model = _KINDS_BY_NAME[obj.kind].spec
    try:
        obj.spec = model.model_validate(body.get("spec", {}))
    except ModelValidationError as exc:
        for error in exc.errors():
            loc: tuple[PathSegment, ...] = tuple(p for p in error["loc"] if isinstance(p, str | int))
            reason = {
                "extra_forbidden": Reason.UNKNOWN_FIELD,
                "string_too_long": Reason.OVER_LIMIT,
                "too_long": Reason.OVER_LIMIT,
            }.get(error["type"], Reason.INVALID_SPEC)
            for path, message in _located(loc, error):
                obj.issue(path, reason, _short(message))


_RULE_MESSAGE = re.compile(r"^(spec(?:\.[A-Za-z][A-Za-z0-9]*)+): ")
_PROBLEMS = re.compile(r"; (?=spec\.)")  # the rules' own messages hold "; " too


def _located(loc: tuple[PathSegment, ...], error: Any) -> Iterator[tuple[str, str]]:
    """A model error's field path and message. A spec-wide rule (a ``value_error`` at ``spec``) is
    split into its problems, each at the field its message starts with, as the API server names it
    from the same rule's ``fieldPath`` (``spec.jobLimits.memoryBytes: above ...``)."""
    if error["type"] != "value_error":
        yield field_path("spec", *loc), str(error["msg"])
        return
    text = str(error.get("ctx", {}).get("error", error["msg"]))  # the rule's own words, no "Value error, "
    if loc:
        yield field_path("spec", *loc), text
        return
    for problem in _PROBLEMS.split(text):
        found = _RULE_MESSAGE.match(problem)
        yield (found.group(1) if found else "spec"), problem


def _schema_violations(error: SchemaValidationError) -> Iterator[Violation]:
    path: tuple[PathSegment, ...] = tuple(error.absolute_path)
    where = field_path(*path)
    instance: Any = error.instance
    value: Any = error.validator_value
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        known = set(schema.get("properties", {}))
        for extra in sorted(set(instance) - known, key=str):
            yield Violation(
                field_path=field_path(*path, extra),
                reason=Reason.UNKNOWN_FIELD,
                message=f'unknown field "{extra}"',
            )
        return
    if error.validator == "required":
        match = re.match(r"^'(.+)' is a required property$", error.message)
        missing = match.group(1) if match else ""
        yield Violation(
            field_path=field_path(*path, missing) if missing else where,
            reason=Reason.INVALID_SPEC,
            message="required field is missing",
        )
        return
    if error.validator in ("maxLength", "maxItems", "maxProperties") and isinstance(instance, str | list | dict):
        unit = {"maxLength": "characters", "maxItems": "items", "maxProperties": "entries"}[str(error.validator)]
        yield Violation(
            field_path=where,
            reason=Reason.OVER_LIMIT,
            message=f"{len(instance)} {unit}; at most {value} allowed",
        )
        return
    shown = _shown(instance, path)
    messages = {
        "enum": lambda: f"{shown} is not one of: {', '.join(map(str, value))}",
        "const": lambda: f"must be {value!r}",
        "type": lambda: f"must be {'an' if str(value)[0] in 'aeiou' else 'a'} {value}, not {_type_name(instance)}",
        "pattern": lambda: (
            f"{shown} does not match {value}" + (f": {hint}" if (hint := _cel_message(error.schema)) else "")
        ),
        "minLength": lambda: "must not be empty" if value == 1 else f"must have at least {value} characters",
        "minItems": lambda: f"must have at least {value} item{'s' if value != 1 else ''}",
        "format": lambda: f"{shown} is not a {value} (for example 2027-01-15T00:00:00Z)",
    }
    render = messages.get(str(error.validator))
    fallback = _short(error.message) if not _sensitive(path) else f"{shown} is not valid here"
    yield Violation(field_path=where, reason=Reason.INVALID_SPEC, message=render() if render else fallback)


_SENSITIVE = ("credential", "secret", "token", "password", "apikey")


def _sensitive(path: tuple[PathSegment, ...]) -> bool:
    """A field where a mistaken value may be a credential (a key pasted for a Secret's name)."""
    return any(isinstance(p, str) and any(word in p.lower() for word in _SENSITIVE) for p in path)


def _shown(instance: Any, path: tuple[PathSegment, ...]) -> str:
    """The value for a message: quoted and shortened, or only its size where it may be a credential."""
    if _sensitive(path) and isinstance(instance, str):
        return f"the value ({len(instance)} characters, not shown: this field may hold a credential's name)"
    return _short(repr(instance), 80)


def _cel_message(schema: Any) -> str:
    """The message of a field's own CEL rule, which says in words what its pattern means."""
    rules = schema.get("x-kubernetes-validations") if isinstance(schema, dict) else None
    return str(rules[0].get("message") or "") if isinstance(rules, list) and rules else ""


def _type_name(value: Any) -> str:
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _short(text: str, limit: int = _MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

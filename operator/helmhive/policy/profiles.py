"""Profile semantics: a profile narrowed to its envelope, or every reason it cannot be.

:func:`decide_profile` is the one place that says what a profile means. The admission
webhook calls it to refuse a bad profile, the reconciler to write the ``Valid``
condition and ``status.effective``, and ``helmhive validate`` to check manifests in a
pull request. It returns either the :class:`~helmhive.api.profile.EffectiveProfile` or
the full list of :class:`Violation` s, never both and never only the first.

Narrowing, axis by axis (a profile that asks for *more* than the envelope is refused,
never silently narrowed):

* tools: the envelope's maximum, in the envelope's order, intersected with the profile's;
* filesystem (``none < read < write``) and network (``disabled < enabled``): the
  profile's value if set, else the envelope's;
* output contract: the envelope's contract always applies. A profile may keep the same
  format and add a JSON Schema (draft 2020-12, self-contained); the effective schema is
  ``allOf: [envelope schema, profile schema]`` with nested ``allOf`` flattened and
  duplicates removed, so narrowing an effective profile again changes nothing;
* session policy: the profile's, which must be one the envelope allows;
* required capabilities and labels: the union of the envelope's and the profile's;
  a profile label may not contradict an envelope label.

Pure: no I/O, no clock, no Kubernetes client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Typed by types-jsonschema when it is installed; without it the ignore keeps mypy clean.
from jsonschema import Draft202012Validator  # type: ignore[import-untyped,unused-ignore]
from pydantic import ValidationError

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.envelope import EnvelopeClass, EnvelopeSpec, MemoryAccess, OutputContract, OutputFormat
from helmhive.api.profile import EffectiveProfile, ProfileSpec
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import CAP_WORKSPACE_WRITE, get_envelope, is_review
from helmhive.policy.violations import Violation, field_path

__all__ = [
    "LABEL_LIMIT",
    "WRITE_TOOLS",
    "ProfileVerdict",
    "Violation",
    "as_profile_spec",
    "compose_output_schema",
    "decide_profile",
    "decide_profile_body",
    "format_violations",
]

WRITE_TOOLS: frozenset[ToolKind] = frozenset({ToolKind.EDIT, ToolKind.DELETE, ToolKind.MOVE, ToolKind.EXECUTE})
"""Tools that can change the workspace; a review profile may offer none of them."""

LABEL_LIMIT = 32
"""Most required labels an effective profile may carry (the API's bound on a label map)."""

_FS_RANK = {FilesystemAccess.NONE: 0, FilesystemAccess.READ: 1, FilesystemAccess.WRITE: 2}
_NET_RANK = {NetworkAccess.DISABLED: 0, NetworkAccess.ENABLED: 1}


@dataclass(frozen=True, kw_only=True)
class ProfileVerdict:
    """Either ``effective`` (and no violations) or every violation (and no effective)."""

    effective: EffectiveProfile | None
    violations: tuple[Violation, ...] = ()

    @property
    def valid(self) -> bool:
        return self.effective is not None and not self.violations


def decide_profile(*, profile: ProfileSpec, envelope: EnvelopeSpec | None) -> ProfileVerdict:
    """Narrow ``profile`` to ``envelope``, or return every violation with its field path.

    ``envelope`` is the code catalogue's envelope for ``profile.envelope``
    (:func:`helmhive.policy.envelopes.get_envelope`); None or a different job kind is an
    ``UnknownEnvelope`` violation.
    """
    if envelope is None or envelope.job_kind != profile.envelope:
        named = str(profile.envelope)
        return ProfileVerdict(
            effective=None,
            violations=(
                Violation(
                    field_path="spec.envelope",
                    reason=Reason.UNKNOWN_ENVELOPE,
                    message=f"no envelope {named!r} in the operator's catalogue",
                ),
            ),
        )
    violations = [
        *_check_tools(profile, envelope),
        *_check_access(profile, envelope),
        *_check_output(profile, envelope),
        *_check_review_read_only(profile, envelope),
        *_check_session(profile, envelope),
        *_check_memory(profile, envelope),
        *_check_labels(profile, envelope),
        *_check_mappings(profile),
    ]
    if violations:
        return ProfileVerdict(effective=None, violations=tuple(violations))
    return ProfileVerdict(effective=_narrow(profile, envelope))


def as_profile_spec(effective: EffectiveProfile) -> ProfileSpec:
    """Return a profile that asks for exactly ``effective``.

    Narrowing the result against the same envelope gives ``effective`` again; the
    reconciler uses this to re-check a job's snapshot against the current catalogue.
    """
    return ProfileSpec(
        envelope=effective.envelope,
        purpose=effective.purpose,
        instructions=effective.instructions,
        provider_mappings=[m.model_copy(deep=True) for m in effective.provider_mappings],
        tools=list(effective.tools),
        filesystem=effective.filesystem,
        network=effective.network,
        output_contract=effective.output_contract.model_copy(deep=True),
        session=effective.session.model_copy(),
        memory=effective.memory.model_copy(),
        required_labels=dict(effective.required_labels),
        required_capabilities=list(effective.required_capabilities),
        allow_model_override=effective.allow_model_override,
    )


def compose_output_schema(*schemas: dict[str, Any] | None) -> dict[str, Any] | None:
    """Return the conjunction of ``schemas`` as one schema (None when there are none).

    Schemas that are only ``{"allOf": [...]}`` are flattened and exact duplicates are
    dropped (first occurrence kept), so composing is idempotent:
    ``compose(a, compose(a, b)) == compose(a, b)``.
    """
    parts: list[dict[str, Any]] = []
    seen: set[str] = set()
    for schema in _flatten_all_of(schemas):
        key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        if key not in seen:
            seen.add(key)
            parts.append(schema)
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return {"allOf": parts}


def _flatten_all_of(schemas: Sequence[dict[str, Any] | None]) -> Iterator[dict[str, Any]]:
    for schema in schemas:
        if schema is None:
            continue
        if set(schema) == {"allOf"} and isinstance(schema["allOf"], list):
            yield from _flatten_all_of(schema["allOf"])
        else:
            yield schema


# --- checks: each yields every violation it finds -------------------------------------------


def _check_tools(profile: ProfileSpec, envelope: EnvelopeSpec) -> Iterator[Violation]:
    allowed = ", ".join(t.value for t in envelope.max_tools) or "none"
    for index, tool in enumerate(profile.tools or ()):
        if tool not in envelope.max_tools:
            yield Violation(
                field_path=field_path("spec", "tools", index),
                reason=Reason.TOOL_OUTSIDE_ENVELOPE,
                message=f"tool {tool.value!r} is outside envelope {envelope.job_kind.value} (allowed: {allowed})",
            )


def _check_access(profile: ProfileSpec, envelope: EnvelopeSpec) -> Iterator[Violation]:
    if profile.filesystem is not None and _FS_RANK[profile.filesystem] > _FS_RANK[envelope.filesystem]:
        yield Violation(
            field_path="spec.filesystem",
            reason=Reason.FILESYSTEM_WIDER_THAN_ENVELOPE,
            message=f"filesystem {profile.filesystem.value!r} is wider than envelope "
            f"{envelope.job_kind.value} allows ({envelope.filesystem.value!r})",
        )
    if profile.network is not None and _NET_RANK[profile.network] > _NET_RANK[envelope.network]:
        yield Violation(
            field_path="spec.network",
            reason=Reason.NETWORK_WIDER_THAN_ENVELOPE,
            message=f"network {profile.network.value!r} is wider than envelope "
            f"{envelope.job_kind.value} allows ({envelope.network.value!r})",
        )


def _check_output(profile: ProfileSpec, envelope: EnvelopeSpec) -> Iterator[Violation]:
    contract = profile.output_contract
    if contract is None:
        return
    if contract.format != envelope.output_contract.format:
        yield Violation(
            field_path="spec.outputContract.format",
            reason=Reason.OUTPUT_CONTRACT_MISMATCH,
            message=f"format {contract.format.value!r} is not envelope {envelope.job_kind.value}'s "
            f"{envelope.output_contract.format.value!r}; a profile may only refine the envelope's contract",
        )
    if contract.json_schema is None:
        return
    if contract.format is not OutputFormat.STRUCTURED:
        yield Violation(
            field_path="spec.outputContract.schema",
            reason=Reason.OUTPUT_CONTRACT_MISMATCH,
            message="a schema applies only to structured output; text output cannot carry one",
        )
        return
    yield from _check_schema(contract.json_schema)


def _check_schema(schema: dict[str, Any]) -> Iterator[Violation]:
    meta = Draft202012Validator(Draft202012Validator.META_SCHEMA)
    errors = sorted(meta.iter_errors(schema), key=lambda e: [str(p) for p in e.absolute_path])
    for error in errors:
        yield Violation(
            field_path=field_path("spec", "outputContract", "schema", *error.absolute_path),
            reason=Reason.INVALID_OUTPUT_SCHEMA,
            message=f"not a valid JSON Schema (draft 2020-12): {_short(error.message)}",
        )
    if errors:
        return
    for path, ref in _refs(schema, ("spec", "outputContract", "schema")):
        if not ref.startswith("#"):
            yield Violation(
                field_path=field_path(*path),
                reason=Reason.INVALID_OUTPUT_SCHEMA,
                message=f"$ref {ref!r} is not local; an output schema must be self-contained",
            )


def _refs(node: Any, path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                yield (*path, key), value
            else:
                yield from _refs(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _refs(value, (*path, index))


def _check_review_read_only(profile: ProfileSpec, envelope: EnvelopeSpec) -> Iterator[Violation]:
    """A review profile is read-only whatever it inherits: checked on the effective values."""
    if not is_review(envelope.job_kind):
        return
    if (profile.filesystem or envelope.filesystem) is FilesystemAccess.WRITE:
        yield Violation(
            field_path="spec.filesystem",
            reason=Reason.REVIEW_PROFILE_WRITES,
            message="a review profile stays read-only: filesystem may be 'none' or 'read'",
        )
    if profile.tools is None:
        inherited = [t.value for t in envelope.max_tools if t in WRITE_TOOLS]
        if inherited:
            yield Violation(
                field_path="spec.tools",
                reason=Reason.REVIEW_PROFILE_WRITES,
                message="a review profile stays read-only: list its tools without " + ", ".join(inherited),
            )
    for index, tool in enumerate(profile.tools or ()):
        if tool in WRITE_TOOLS:
            yield Violation(
                field_path=field_path("spec", "tools", index),
                reason=Reason.REVIEW_PROFILE_WRITES,
                message=f"a review profile stays read-only: tool {tool.value!r} can change the workspace",
            )
    for index, capability in enumerate(profile.required_capabilities):
        # The envelope's own requirements are not the profile's to answer for.
        if capability == CAP_WORKSPACE_WRITE and capability not in envelope.required_capabilities:
            yield Violation(
                field_path=field_path("spec", "requiredCapabilities", index),
                reason=Reason.REVIEW_PROFILE_WRITES,
                message=f"a review profile stays read-only: it cannot require {CAP_WORKSPACE_WRITE!r}",
            )


def _check_session(profile: ProfileSpec, envelope: EnvelopeSpec) -> Iterator[Violation]:
    policy = profile.session.policy
    if policy not in envelope.session_policies:
        allowed = ", ".join(p.value for p in envelope.session_policies)
        why = (
            "governed-change work always starts fresh"
            if envelope.envelope_class is EnvelopeClass.GOVERNED_CHANGE
            else f"envelope {envelope.job_kind.value} allows: {allowed}"
        )
        yield Violation(
            field_path="spec.session.policy",
            reason=Reason.SESSION_POLICY_FORBIDDEN,
            message=f"session policy {policy.value!r} is forbidden: {why}",
        )


def _check_memory(profile: ProfileSpec, envelope: EnvelopeSpec) -> Iterator[Violation]:
    if profile.memory.enabled and envelope.memory is MemoryAccess.FORBIDDEN:
        why = (
            "governed-change jobs receive no memory"
            if envelope.envelope_class is EnvelopeClass.GOVERNED_CHANGE
            else f"envelope {envelope.job_kind.value} forbids memory"
        )
        yield Violation(
            field_path="spec.memory.enabled",
            reason=Reason.MEMORY_FORBIDDEN,
            message=f"memory cannot be enabled: {why}",
        )


def _check_labels(profile: ProfileSpec, envelope: EnvelopeSpec) -> Iterator[Violation]:
    for key, value in profile.required_labels.items():
        wanted = envelope.required_labels.get(key)
        if wanted is not None and wanted != value:
            yield Violation(
                field_path=field_path("spec", "requiredLabels", key),
                reason=Reason.LABEL_CONFLICTS_WITH_ENVELOPE,
                message=f"label {key}={value} contradicts envelope {envelope.job_kind.value}'s "
                f"{key}={wanted}; requirements are unioned, never replaced",
            )
    union = {**envelope.required_labels, **profile.required_labels}
    if len(union) > LABEL_LIMIT:
        yield Violation(
            field_path="spec.requiredLabels",
            reason=Reason.OVER_LIMIT,
            message=f"{len(union)} required labels with the envelope's; at most {LABEL_LIMIT}",
        )


def _check_mappings(profile: ProfileSpec) -> Iterator[Violation]:
    if not profile.provider_mappings:
        yield Violation(
            field_path="spec.providerMappings",
            reason=Reason.NO_PROVIDER_MAPPINGS,
            message="at least one provider mapping is required",
        )
        return
    first_seen: dict[tuple[str, str | None], int] = {}
    for index, mapping in enumerate(profile.provider_mappings):
        key = (mapping.provider, mapping.model)
        if key in first_seen:
            model = mapping.model or "the runner's default model"
            yield Violation(
                field_path=field_path("spec", "providerMappings", index),
                reason=Reason.DUPLICATE_MAPPING,
                message=f"provider {mapping.provider!r} with {model} repeats spec.providerMappings[{first_seen[key]}]",
            )
        else:
            first_seen[key] = index
        seen_fallbacks: set[str] = set()
        for position, fallback in enumerate(mapping.fallback_models):
            where = field_path("spec", "providerMappings", index, "fallbackModels", position)
            if mapping.model is not None and fallback == mapping.model:
                yield Violation(
                    field_path=where,
                    reason=Reason.FALLBACK_EQUALS_PRIMARY,
                    message=f"fallback model {fallback!r} is the mapping's primary model",
                )
            elif fallback in seen_fallbacks:
                yield Violation(
                    field_path=where,
                    reason=Reason.DUPLICATE_MAPPING,
                    message=f"fallback model {fallback!r} is listed twice",
                )
            seen_fallbacks.add(fallback)


# --- narrowing (only called when there are no violations) ------------------------------------


def _narrow(profile: ProfileSpec, envelope: EnvelopeSpec) -> EffectiveProfile:
    wanted = set(profile.tools) if profile.tools is not None else set(envelope.max_tools)
    contract = OutputContract(
        format=envelope.output_contract.format,
        json_schema=compose_output_schema(
            envelope.output_contract.json_schema,
            profile.output_contract.json_schema if profile.output_contract else None,
        ),
    )
    return EffectiveProfile(
        envelope=envelope.job_kind,
        tools=[t for t in envelope.max_tools if t in wanted],
        filesystem=profile.filesystem or envelope.filesystem,
        network=profile.network or envelope.network,
        output_contract=contract,
        session=profile.session.model_copy(),
        memory=profile.memory.model_copy(),
        required_labels={**envelope.required_labels, **profile.required_labels},
        required_capabilities=_union(envelope.required_capabilities, profile.required_capabilities),
        provider_mappings=[m.model_copy(deep=True) for m in profile.provider_mappings],
        allow_model_override=profile.allow_model_override,
        instructions=profile.instructions,
        purpose=profile.purpose,
    )


def _union(first: Sequence[str], second: Sequence[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_MESSAGE_LIMIT = 1000


def decide_profile_body(spec: Mapping[str, Any]) -> tuple[ProfileSpec | None, ProfileVerdict]:
    """Parse a Profile spec from the wire and decide it; parse errors become violations."""
    try:
        parsed = ProfileSpec.model_validate(dict(spec))
    except ValidationError as err:
        violations = tuple(
            Violation(
                field_path="spec." + ".".join(str(p) for p in e["loc"]),
                reason=Reason.INVALID_SPEC,
                message=str(e["msg"])[:300],
            )
            for e in err.errors()
        )
        return None, ProfileVerdict(effective=None, violations=violations)
    return parsed, decide_profile(profile=parsed, envelope=get_envelope(parsed.envelope))


def format_violations(violations: tuple[Violation, ...], *, limit: int = _MESSAGE_LIMIT) -> str:
    """All violations as ``path: Reason: message`` joined by ``; ``, bounded to ``limit``."""
    text = "; ".join(f"{v.field_path}: {v.reason.value}: {v.message}" for v in violations)
    return text if len(text) <= limit else text[: limit - 20] + f"… ({len(violations)} in all)"

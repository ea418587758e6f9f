"""Profile checks: every reason a profile cannot be narrowed to its envelope, each with its field path. Pure.

:func:`check_profile` runs every check and returns every violation (never only the first);
:func:`helmhive.policy.profiles.narrowing.decide_profile` narrows only a profile with none. Each check
is one axis of the narrowing rules in :mod:`helmhive.policy.profiles.narrowing`' docstring.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped,unused-ignore]

from helmhive.api.common import FilesystemAccess, NetworkAccess, ToolKind
from helmhive.api.envelope import EnvelopeClass, EnvelopeSpec, MemoryAccess, OutputFormat
from helmhive.api.profile import ProfileSpec
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import CAP_WORKSPACE_WRITE, is_review
from helmhive.policy.violations import Violation, field_path

__all__ = ["LABEL_LIMIT", "WRITE_TOOLS", "check_profile"]

WRITE_TOOLS: frozenset[ToolKind] = frozenset({ToolKind.EDIT, ToolKind.DELETE, ToolKind.MOVE, ToolKind.EXECUTE})
"""Tools that can change the workspace; a review profile may offer none of them."""

LABEL_LIMIT = 32
"""Most required labels an effective profile may carry (the API's bound on a label map)."""

_FS_RANK = {FilesystemAccess.NONE: 0, FilesystemAccess.READ: 1, FilesystemAccess.WRITE: 2}
_NET_RANK = {NetworkAccess.DISABLED: 0, NetworkAccess.ENABLED: 1}


def check_profile(profile: ProfileSpec, envelope: EnvelopeSpec) -> list[Violation]:
    """Every violation of ``profile`` against ``envelope`` (the envelope of its job kind), in axis order."""
    return [
        *_check_tools(profile, envelope),
        *_check_access(profile, envelope),
        *_check_output(profile, envelope),
        *_check_review_read_only(profile, envelope),
        *_check_session(profile, envelope),
        *_check_memory(profile, envelope),
        *_check_labels(profile, envelope),
        *_check_mappings(profile),
    ]


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


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

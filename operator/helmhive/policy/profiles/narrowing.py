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

Each axis's check is in :mod:`helmhive.policy.profiles.checks`; this module narrows a profile
that passes them all. Pure: no I/O, no clock, no Kubernetes client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Typed by types-jsonschema when it is installed; without it the ignore keeps mypy clean.
from pydantic import ValidationError

from helmhive.api.envelope import EnvelopeSpec, OutputContract
from helmhive.api.profile import EffectiveProfile, ProfileSpec
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import get_envelope
from helmhive.policy.profiles.checks import LABEL_LIMIT, WRITE_TOOLS, check_profile
from helmhive.policy.violations import Violation

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
    violations = check_profile(profile, envelope)
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

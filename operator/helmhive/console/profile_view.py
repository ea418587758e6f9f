"""The profiles page model: each profile's envelope beside what it narrows, its validity, its revisions. Pure.

The envelope is the job kind's fixed one from code (:func:`~helmhive.policy.envelopes.get_envelope`),
compared with the Envelope object the operator publishes. The profile's side is its spec (what it
asks) and ``status.effective`` (what the operator made of it). Like :mod:`helmhive.console.view`,
it names every field the page shows: a profile's ``instructions`` are shown by size only (as the
job page shows a snapshot's), and a revision by its number, name, hash and age, never its data.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from helmhive.console.view import Row, as_text, condition, format_age, get_path, object_ref
from helmhive.policy.envelopes import get_envelope

__all__ = ["ProfileBlock", "ProfilesPage", "build_profile", "build_profiles"]

REVISION_LABEL = "helmhive.dev/profile"
"""The label naming a ControllerRevision's profile (helmhive.policy.profiles.revisions.LABEL_PROFILE)."""

AS_ENVELOPE = "(as the envelope)"


@dataclass(frozen=True)
class ProfileBlock:
    namespace: str
    name: str
    envelope: str
    valid: Row
    summary: Row
    envelope_note: str
    aspects: list[Row]
    revisions: list[Row]


@dataclass(frozen=True)
class ProfilesPage:
    namespace: str
    profiles: list[ProfileBlock]
    problems: list[str]


def _words(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_words(v)}" for k, v in sorted(value.items())) or "none"
    if isinstance(value, list):
        return ", ".join(_words(v) for v in value) or "none"
    return str(value)


def _contract(value: Any) -> str:
    if not isinstance(value, dict):
        return _words(value)
    schema = value.get("schema") or value.get("jsonSchema")
    return as_text(value.get("format")) + (" (with a JSON schema)" if schema else "")


def _session(value: Any) -> str:
    if not isinstance(value, dict):
        return ""
    return f"{as_text(value.get('policy') or 'fresh')}, scope {as_text(value.get('scope') or 'workspace')}"


def _memory(value: Any) -> str:
    if not isinstance(value, dict):
        return ""
    if not value.get("enabled"):
        return "disabled"
    return f"enabled, up to {as_text(value.get('maxSensitivity', 'internal'))}, at most {value.get('maxRecords', 20)}"


def _mappings(value: Any) -> str:
    parts = []
    for m in value or []:
        if not isinstance(m, dict):
            continue
        text = as_text(m.get("provider"))
        if m.get("model"):
            text += f"/{m['model']}"
        if m.get("fallbackModels"):
            text += f" (fallback {', '.join(map(str, m['fallbackModels']))})"
        if m.get("reasoningEffort"):
            text += f" effort {m['reasoningEffort']}"
        parts.append(text)
    return "; ".join(parts) or "none"


def _narrower_memory(envelope: Any, effective: Any) -> bool:
    if envelope != "allowed" or not isinstance(effective, dict):
        return False
    if not effective.get("enabled"):
        return True
    return effective.get("maxSensitivity") != "restricted" or int(effective.get("maxRecords", 20)) < 20


def build_aspects(envelope: dict[str, Any], spec: dict[str, Any], effective: dict[str, Any]) -> list[Row]:
    """One row per governed aspect: the envelope's bound, what the profile asks, what is in effect.

    ``narrowed`` says whether what is in effect is narrower than the envelope (empty when nothing
    is in effect: the profile is not valid, or not reconciled yet).
    """
    env, eff = envelope, effective

    def asked(key: str, show: Any = _words) -> str:
        value = spec.get(key)
        return show(value) if value not in (None, {}, []) else ""

    rows: list[tuple[str, str, str, str, bool]] = [
        (
            "tools",
            _words(env.get("maxTools")),
            asked("tools"),
            _words(eff.get("tools")),
            set(eff.get("tools") or []) != set(env.get("maxTools") or []),
        ),
        *(
            (key, _words(env.get(key)), asked(key), _words(eff.get(key)), eff.get(key) != env.get(key))
            for key in ("filesystem", "network")
        ),
        (
            "output contract",
            _contract(env.get("outputContract")),
            asked("outputContract", _contract),
            _contract(eff.get("outputContract")),
            eff.get("outputContract") != env.get("outputContract"),
        ),
        (
            "session",
            "allows " + _words(env.get("sessionPolicies")),
            asked("session", _session),
            _session(eff.get("session")),
            len(env.get("sessionPolicies") or []) > 1,
        ),
        (
            "memory",
            _words(env.get("memory")),
            asked("memory", _memory),
            _memory(eff.get("memory")),
            _narrower_memory(env.get("memory"), eff.get("memory")),
        ),
        (
            "required labels",
            _words(env.get("requiredLabels") or {}),
            asked("requiredLabels"),
            _words(eff.get("requiredLabels") or {}),
            (eff.get("requiredLabels") or {}) != (env.get("requiredLabels") or {}),
        ),
        (
            "required capabilities",
            _words(env.get("requiredCapabilities") or []),
            asked("requiredCapabilities"),
            _words(eff.get("requiredCapabilities") or []),
            set(eff.get("requiredCapabilities") or []) != set(env.get("requiredCapabilities") or []),
        ),
        (
            "provider mappings",
            "any provider",
            asked("providerMappings", _mappings),
            _mappings(eff.get("providerMappings")),
            True,
        ),
        (
            "model override",
            "allowed",
            _words(spec.get("allowModelOverride")) if "allowModelOverride" in spec else "",
            _words(eff.get("allowModelOverride")),
            not eff.get("allowModelOverride"),
        ),
    ]
    return [
        {
            "aspect": aspect,
            "envelope": bound,
            "profile": wanted or AS_ENVELOPE,
            "effective": shown if eff else "(nothing: not valid, or not reconciled yet)",
            "narrowed": ("yes" if narrower else "no") if eff else "",
        }
        for aspect, bound, wanted, shown, narrower in rows
    ]


def _envelope_note(kind: str, code: dict[str, Any] | None, published: dict[str, Any] | None, listed: bool) -> str:
    if code is None:
        return f"no envelope for job kind {kind!r}"
    if not listed:
        return ""
    if published is None:
        return f"the Envelope {kind} is not published in the cluster"
    if published.get("spec") != code:
        return f"the published Envelope {kind} differs from the code (the operator restores it)"
    return f"the published Envelope {kind} equals the code"


def build_revision_rows(revisions: list[dict[str, Any]], current: str, now: dt.datetime) -> list[Row]:
    """A profile's ControllerRevisions, newest first: number, name, hash, age and whether current; never their data."""
    ordered = sorted(revisions, key=lambda r: (int(r.get("revision") or 0), object_ref(r)[1]), reverse=True)
    return [
        {
            "revision": as_text(r.get("revision")),
            "name": object_ref(r)[1],
            "hash": as_text(get_path(r, "metadata", "annotations", "helmhive.dev/hash") or get_path(r, "data", "hash")),
            "created": format_age(get_path(r, "metadata", "creationTimestamp"), now),
            "current": "current" if object_ref(r)[1] == current else "",
        }
        for r in ordered
    ]


def build_profile(
    profile: dict[str, Any],
    *,
    revisions: list[dict[str, Any]],
    published: dict[str, dict[str, Any]],
    envelopes_listed: bool,
    now: dt.datetime,
) -> ProfileBlock:
    """One profile: ``revisions`` its ControllerRevisions, ``published`` the Envelope objects by name."""
    ns, name = object_ref(profile)
    spec = profile.get("spec") or {}
    status = profile.get("status") or {}
    kind = as_text(spec.get("envelope"))
    code = get_envelope(kind)
    wire = code.to_wire() if code is not None else None
    effective = status.get("effective") if isinstance(status.get("effective"), dict) else {}
    valid = condition(profile, "Valid")
    instructions = spec.get("instructions") or ""
    return ProfileBlock(
        namespace=ns,
        name=name,
        envelope=kind,
        valid={k: as_text(valid.get(k)) for k in ("status", "reason", "message")} if valid else {"status": "unknown"},
        summary={
            "purpose": as_text(spec.get("purpose")),
            "instructions": f"{len(str(instructions))} characters, not shown" if instructions else "none",
            "currentRevision": as_text(status.get("currentRevision")),
            "currentHash": as_text(status.get("currentHash")),
        },
        envelope_note=_envelope_note(kind, wire, published.get(kind), envelopes_listed),
        aspects=build_aspects(wire or {}, spec, effective or {}),
        revisions=build_revision_rows(revisions, as_text(status.get("currentRevision")), now),
    )


def build_profiles(
    *,
    namespace: str,
    profiles: list[dict[str, Any]],
    revisions: list[dict[str, Any]],
    envelopes: list[dict[str, Any]],
    envelopes_listed: bool,
    now: dt.datetime,
    problems: list[str] | None = None,
) -> ProfilesPage:
    """The profiles page: every profile by name, each with its own revisions (by the profile label)."""
    by_profile: dict[str, list[dict[str, Any]]] = {}
    for rev in revisions:
        owner = get_path(rev, "metadata", "labels", REVISION_LABEL)
        if owner:
            by_profile.setdefault(str(owner), []).append(rev)
    published = {object_ref(env)[1]: env for env in envelopes}
    return ProfilesPage(
        namespace=namespace,
        profiles=[
            build_profile(
                p,
                revisions=by_profile.get(object_ref(p)[1], []),
                published=published,
                envelopes_listed=envelopes_listed,
                now=now,
            )
            for p in sorted(profiles, key=object_ref)
        ],
        problems=list(problems or []),
    )

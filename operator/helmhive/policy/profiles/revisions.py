"""Profile revisions: content hashes, immutable ControllerRevision snapshots, and pruning.

Every distinct accepted profile spec becomes one ``apps/v1`` ControllerRevision owned by
the profile. Its ``data`` (immutable in Kubernetes) holds the full spec, the effective
profile and the hash; its name is ``<profile>-<hash prefix>``, so the same spec always
maps to the same revision and a retried reconcile never makes a second one. Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from helmhive.api.kinds import API_VERSION
from helmhive.api.profile import EffectiveProfile, ProfileSpec

__all__ = [
    "LABEL_PROFILE",
    "build_profile_revision",
    "decide_revision_pruning",
    "profile_hash",
    "revision_name",
]

LABEL_PROFILE = "helmhive.dev/profile"
_HASH_PREFIX = 10


def profile_hash(spec: ProfileSpec) -> str:
    """``sha256:<hex>`` of the spec's canonical wire form (defaults applied)."""
    canonical = json.dumps(spec.to_wire(), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def revision_name(profile: str, digest: str) -> str:
    """The revision's object name: the profile name and a hash prefix, within 253 characters."""
    suffix = digest.removeprefix("sha256:")[:_HASH_PREFIX]
    return f"{profile[: 253 - _HASH_PREFIX - 1]}-{suffix}"


def build_profile_revision(
    *,
    profile: Mapping[str, Any],
    spec: ProfileSpec,
    effective: EffectiveProfile,
    number: int,
) -> dict[str, Any]:
    """Return the ControllerRevision manifest for ``spec`` of ``profile`` (an object dict)."""
    meta = profile["metadata"]
    digest = profile_hash(spec)
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": revision_name(meta["name"], digest),
            "namespace": meta["namespace"],
            "labels": {LABEL_PROFILE: meta["name"], "app.kubernetes.io/managed-by": "helmhive-operator"},
            "annotations": {"helmhive.dev/hash": digest},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "Profile",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "revision": number,
        "data": {"hash": digest, "spec": spec.to_wire(), "effective": effective.to_wire()},
    }


def decide_revision_pruning(
    *, revisions: Sequence[Mapping[str, Any]], keep: int, current: str | None, referenced: Collection[str]
) -> list[str]:
    """Names of revisions to delete: the oldest beyond ``keep``, never ``current`` or a referenced one."""
    ordered = sorted(revisions, key=lambda r: (int(r.get("revision", 0)), r["metadata"]["name"]), reverse=True)
    doomed = []
    for index, rev in enumerate(ordered):
        name = rev["metadata"]["name"]
        if index >= max(keep, 1) and name != current and name not in referenced:
            doomed.append(name)
    return sorted(doomed)

"""Bounded job results: what goes into status, and what goes into an owned artifact ConfigMap. Pure.

Status stays small: a summary of at most 4,096 characters and a structured output of at most
16 KiB inline. Anything larger (a long transcript, a patch, a big output document) goes into a
ConfigMap owned by the job: at most 256 KiB per artifact and 768 KiB in all, under the 1 MiB a
ConfigMap may hold and etcd's 1.5 MiB object limit. Nothing is cut silently: a cut artifact
says ``truncated: true`` and carries the size and SHA-256 of the *whole* content, and a cut
summary ends with a marker.

Some artifacts must never be cut: a patch is stored whole or not at all. They are passed as
``whole``, are budgeted first, and each may be at most :data:`PATCH_MAX_BYTES`
(:data:`ARTIFACT_MAX_BYTES`); the caller refuses a larger one (``PatchTooLarge``) before it
gets here, and this module raises ``ValueError`` rather than cut one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.governed import ArtifactRef

__all__ = [
    "ARTIFACTS_TOTAL_MAX_BYTES",
    "ARTIFACT_MAX_BYTES",
    "INLINE_OUTPUT_MAX_BYTES",
    "PATCH_MAX_BYTES",
    "SUMMARY_MAX_CHARS",
    "BoundedResult",
    "build_bounded_result",
]

SUMMARY_MAX_CHARS = 4096
INLINE_OUTPUT_MAX_BYTES = 16 * 1024
ARTIFACT_MAX_BYTES = 256 * 1024
ARTIFACTS_TOTAL_MAX_BYTES = 768 * 1024
PATCH_MAX_BYTES = ARTIFACT_MAX_BYTES
"""The largest patch an implementation job may produce (bytes of ``git diff --binary``); never cut."""
_CUT = "\n…[cut: the full text is in the transcript artifact]"


@dataclass(frozen=True, kw_only=True)
class BoundedResult:
    """Status fields and the artifact ConfigMap (None when nothing needs one)."""

    summary: str
    output: dict[str, Any] | None
    artifacts: list[ArtifactRef]
    config_map: dict[str, Any] | None


def _cut_utf8(text: str, limit: int) -> tuple[str, bool]:
    raw = text.encode()
    if len(raw) <= limit:
        return text, False
    return raw[:limit].decode(errors="ignore"), True


def build_bounded_result(
    *,
    job: Mapping[str, Any],
    text: str,
    output: dict[str, Any] | None,
    extra: Mapping[str, str] | None = None,
    whole: Mapping[str, str] | None = None,
) -> BoundedResult:
    """Split a job's answer into bounded status fields and an owned artifact ConfigMap.

    ``job`` is the AgentJob object (for the name, namespace and owner reference); ``extra``
    holds further artifacts by key (cut like the transcript if too large); ``whole`` holds
    artifacts stored byte for byte or not at all, such as ``patch.diff`` (``ValueError`` if one
    is over :data:`ARTIFACT_MAX_BYTES`).
    """
    meta = job["metadata"]
    name = f"{meta['name'][:230]}-artifacts"
    pieces: dict[str, str] = {}
    summary = text if len(text) <= SUMMARY_MAX_CHARS else text[: SUMMARY_MAX_CHARS - len(_CUT)] + _CUT
    if len(text) > SUMMARY_MAX_CHARS:
        pieces["transcript.txt"] = text
    inline: dict[str, Any] | None = output
    if output is not None:
        encoded = json.dumps(output, sort_keys=True)
        if len(encoded.encode()) > INLINE_OUTPUT_MAX_BYTES:
            pieces["output.json"] = encoded
            inline = None
    pieces.update(extra or {})
    kept = dict(whole or {})
    for key, content in kept.items():
        if len(content.encode()) > ARTIFACT_MAX_BYTES:
            raise ValueError(f"artifact {key} is over {ARTIFACT_MAX_BYTES} bytes and may not be cut")
        pieces.pop(key, None)
    if sum(len(c.encode()) for c in kept.values()) > ARTIFACTS_TOTAL_MAX_BYTES:
        raise ValueError(f"whole artifacts over {ARTIFACTS_TOTAL_MAX_BYTES} bytes in all may not be cut")
    artifacts: list[ArtifactRef] = []
    data: dict[str, str] = {}
    budget = ARTIFACTS_TOTAL_MAX_BYTES - sum(len(c.encode()) for c in kept.values())
    # Whole artifacts first (they fit: at most 256 KiB each, and they are budgeted up front).
    ordered = [*sorted(kept.items()), *sorted(pieces.items())]
    for key, content in ordered:
        if key in kept:
            stored, truncated = content, False
        else:
            stored, truncated = _cut_utf8(content, min(ARTIFACT_MAX_BYTES, max(budget, 0)))
            budget -= len(stored.encode())
        data[key] = stored
        artifacts.append(
            ArtifactRef(
                kind="ConfigMap",
                name=name,
                key=key,
                bytes=len(content.encode()),
                sha256=hashlib.sha256(content.encode()).hexdigest(),
                truncated=truncated,
            )
        )
    artifacts.sort(key=lambda a: a.key)
    config_map = None
    if data:
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {"helmhive.dev/job": meta["name"][:63], "app.kubernetes.io/managed-by": "helmhive"},
                "ownerReferences": [
                    {
                        "apiVersion": job.get("apiVersion", "helmhive.dev/v1alpha1"),
                        "kind": "AgentJob",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    }
                ],
            },
            "data": data,
        }
    return BoundedResult(summary=summary, output=inline, artifacts=artifacts, config_map=config_map)

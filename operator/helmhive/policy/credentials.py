"""Credential rotation, decided purely: a content hash of the pool's Secret and its generation.

The Secret's ``data`` goes in; only ``sha256:<hex>`` (over a fixed prefix and the canonical
JSON of the referenced key) comes out, and that hash is all the operator ever stores. A new
hash bumps the pool's credential generation; runners that reported an older generation are
not schedulable until they report again. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CredentialDecision", "build_credential_hash", "decide_credential"]


def build_credential_hash(*, data: Mapping[str, str], key: str | None) -> str | None:
    """``sha256:<hex>`` of the referenced key (or of every key); None if the key is absent.

    ``data`` is the Secret's ``data`` as stored (base64); only this digest leaves this function.
    """
    if key is not None:
        if key not in data:
            return None
        material: dict[str, str] = {key: data[key]}
    else:
        material = dict(data)
    canonical = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(b"helmhive-credential-v1\0" + canonical.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class CredentialDecision:
    """What the pool's status should say about its credential."""

    hash: str | None
    generation: int
    available: bool
    changed: bool
    previous_hash: str | None


def decide_credential(
    *, uses_secret: bool, observed_hash: str | None, observed_generation: int, digest: str | None
) -> CredentialDecision:
    """Bump the generation when the Secret's content hash differs from the stored one.

    ``digest`` is None when the Secret (or its key) is missing: the stored hash is kept, so a
    Secret restored with the same content is not a rotation. Volume logins have no hash.
    """
    if not uses_secret:
        return CredentialDecision(
            hash=None, generation=observed_generation, available=True, changed=False, previous_hash=None
        )
    if digest is None:
        return CredentialDecision(
            hash=observed_hash,
            generation=observed_generation,
            available=False,
            changed=False,
            previous_hash=observed_hash,
        )
    changed = digest != observed_hash
    return CredentialDecision(
        hash=digest,
        generation=observed_generation + 1 if changed else observed_generation,
        available=True,
        changed=changed,
        previous_hash=observed_hash,
    )

"""The pool's link key: the Secret its runners and their job pods' shims share to authenticate the link. Pure.

The operator makes one per pool in mode JobPod (:func:`~helmhive.api.jobpod.link_secret_name`),
owned by the pool; the caller draws the key's random bytes (this module reads no randomness).
The runner mounts it at :data:`~helmhive.api.jobpod.RUNNER_LINK_KEY_DIR`, the shim at
:data:`~helmhive.api.jobpod.LINK_KEY_DIR`; the agent's container never does.
"""

from __future__ import annotations

import base64
from typing import Any

from helmhive.api.jobpod import LINK_SECRET_KEY, link_secret_name
from helmhive.policy.jobpods.identity import PoolIdentity, build_pool_object_labels, build_pool_owner_reference

__all__ = ["LINK_KEY_BYTES", "build_link_secret"]

LINK_KEY_BYTES = 32
"""The fewest random bytes a link key may have (256 bits)."""


def build_link_secret(*, pool: PoolIdentity, namespace: str, key: bytes) -> dict[str, Any]:
    """The pool's link-key Secret holding ``key`` (at least :data:`LINK_KEY_BYTES` random bytes)."""
    if namespace != pool.namespace:
        raise ValueError(f"the link key of {pool.namespace}/{pool.name} is in {pool.namespace}, not {namespace}")
    if len(key) < LINK_KEY_BYTES:
        raise ValueError(f"a link key needs at least {LINK_KEY_BYTES} random bytes, not {len(key)}")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": link_secret_name(pool.name),
            "namespace": namespace,
            "labels": build_pool_object_labels(pool.name),
            "ownerReferences": [build_pool_owner_reference(pool)],
        },
        "data": {LINK_SECRET_KEY: base64.b64encode(key).decode("ascii")},
    }

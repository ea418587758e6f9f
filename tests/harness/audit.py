"""Read the local control plane's API audit log: which client read which Helmhive resource.

The dev cluster's audit policy (:func:`helmhive.devcluster.flags.build_audit_policy`) records
every get, list and watch of the ``helmhive.dev`` group, one event per request when it ends.
Unlike ``apiserver_request_total``, each event names its user, so a test can count one
client's reads while kube-controller-manager (for example the namespace controller emptying
an earlier test's namespace) reads the same resources in the same scope.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import ClusterHandle
from helmhive.devcluster.flags import StateLayout

__all__ = ["ApiAuditLog"]


@dataclass(frozen=True)
class ApiAuditLog:
    """The audit log of the session's local API server."""

    path: Path

    @classmethod
    def of(cls, cluster: ClusterHandle) -> ApiAuditLog:
        if cluster.info is None:
            pytest.fail("this test reads the API server's audit log: it needs the local control plane")
        return cls(StateLayout(cluster.info.state_dir).audit_log)

    def events(self) -> list[dict[str, Any]]:
        """Every event in the current file (the policy keeps it small; it rotates at 50 MB)."""
        if not self.path.is_file():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        # The last line may be half written while the API server appends to it.
        return [json.loads(line) for line in lines if line.endswith("}")]

    def count(self, *, user: str, verbs: Iterable[str], resources: Iterable[str]) -> dict[str, int]:
        """How many requests ``user`` made of each of ``resources`` with one of ``verbs``."""
        wanted_verbs, counts = set(verbs), dict.fromkeys(resources, 0)
        for event in self.events():
            ref = event.get("objectRef") or {}
            if event.get("user", {}).get("username") != user or event.get("verb") not in wanted_verbs:
                continue
            if ref.get("resource") in counts:
                counts[ref["resource"]] += 1
        return counts

"""Kopf's per-event essence is skipped for the kinds only event handlers watch, kept for the others."""

from __future__ import annotations

import kopf

from helmhive.controller.app import EventOnlyDiffBase, configure_settings


def body(kind: str) -> kopf.Body:
    return kopf.Body({"apiVersion": "helmhive.dev/v1alpha1", "kind": kind, "metadata": {"name": "x"}, "spec": {"a": 1}})


def test_event_only_kinds_get_no_essence_and_the_others_keep_theirs() -> None:
    settings = kopf.OperatorSettings()
    configure_settings(settings)
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, EventOnlyDiffBase)
    for kind in ("AgentJob", "Runner", "Lease"):
        assert dict(storage.build(body=body(kind))) == {}
    # Profiles have on.update handlers: their change detection still sees the spec.
    assert dict(storage.build(body=body("Profile")))["spec"] == {"a": 1}

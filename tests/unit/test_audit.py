"""Audit records: built from names and hashes only, and retained by age and count."""

from __future__ import annotations

import datetime as dt

import jsonschema
import pytest

from helmhive.api.audit import AuditAction, AuditActor, AuditState
from helmhive.api.crdgen import build_offline_schema
from helmhive.api.kinds import kind_by_name
from helmhive.policy.audit.records import build_audit_record, decide_audit_retention

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
PROFILE = {
    "apiVersion": "helmhive.dev/v1alpha1",
    "kind": "Profile",
    "metadata": {"name": "plan-change", "namespace": "team-a", "uid": "u-1"},
}


def test_record_is_valid_against_the_crd_schema_and_names_the_object() -> None:
    record = build_audit_record(
        action=AuditAction.PROFILE_REVISION_CREATED,
        obj=PROFILE,
        actor=AuditActor(username="alice@example.com", groups=["platform"]),
        before=AuditState(revision="plan-change-1", hash="sha256:aa"),
        after=AuditState(revision="plan-change-2", hash="sha256:bb"),
        details={"credentialHash": "sha256:cc"},
        now=NOW,
    )
    record["metadata"]["name"] = "x"
    jsonschema.validate(record, build_offline_schema(kind_by_name("AuditRecord")))
    assert record["metadata"]["namespace"] == "team-a"
    assert record["metadata"]["generateName"] == "profile-plan-change-"
    assert record["spec"]["object"] == {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "Profile",
        "namespace": "team-a",
        "name": "plan-change",
        "uid": "u-1",
    }
    assert record["spec"]["after"]["revision"] == "plan-change-2"
    assert record["metadata"]["labels"]["helmhive.dev/audit-action"] == "ProfileRevisionCreated"


@pytest.mark.parametrize("key", ["token", "apiKey", "sessionId", "password", "clientSecret"])
def test_secret_looking_detail_keys_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="secret material"):
        build_audit_record(action=AuditAction.SESSION_RESET, obj=PROFILE, details={key: "v"}, now=NOW)


def _rec(name: str, minutes_ago: int) -> dict[str, object]:
    when = (NOW - dt.timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"name": name}, "spec": {"time": when}}


def test_retention_drops_old_records_and_keeps_the_newest_by_count() -> None:
    records = [_rec("a", 1), _rec("b", 2), _rec("c", 3), _rec("old", 60 * 24 * 100)]
    assert decide_audit_retention(records, now=NOW, max_age=dt.timedelta(days=90), max_count=10) == ["old"]
    assert decide_audit_retention(records, now=NOW, max_age=dt.timedelta(days=90), max_count=2) == ["c", "old"]
    assert decide_audit_retention([], now=NOW, max_age=dt.timedelta(days=1), max_count=1) == []

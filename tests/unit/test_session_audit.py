"""Session resets audited: which counts get a record, with whose name, under which fixed name."""

from __future__ import annotations

import datetime as dt
import json

import jsonschema
import pytest

from helmhive.api.audit import AuditActor
from helmhive.api.crdgen import build_offline_schema
from helmhive.api.kinds import kind_by_name
from helmhive.controller.sessionaudit import ResetWitness
from helmhive.policy.sessions.audit import (
    ResetToAudit,
    actor_from_userinfo,
    build_session_deleted_audit,
    build_session_reset_audit,
    decide_reset_audits,
    deleted_audit_name,
    reset_audit_name,
    resets_of,
)

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
ALICE = AuditActor(username="alice@example.com", uid="u-alice", groups=["platform"])
BOB = AuditActor(username="system:serviceaccount:team:resetter", groups=["system:serviceaccounts"])
BINDING = {
    "apiVersion": "helmhive.dev/v1alpha1",
    "kind": "SessionBinding",
    "metadata": {"name": "sb-0123456789abcdef0123", "namespace": "team", "uid": "9f1c2d3e-aaaa-bbbb"},
    "spec": {
        "workspace": "payments",
        "profile": "quick-review",
        "provider": "anthropic",
        "runner": "pool-a-0",
        "credentialGeneration": 1,
        "scope": "workspace",
    },
    "status": {"stored": False, "resets": 2, "secretKey": "sb-0123456789abcdef0123"},
}


def _counts(resets: list[ResetToAudit]) -> list[tuple[int, int | None, str | None]]:
    return [(r.count, r.previous, r.actor.username if r.actor else None) for r in resets]


@pytest.mark.parametrize(
    ("before", "after", "witnessed", "expected"),
    [
        pytest.param(1, 2, {2: ALICE}, [(2, 1, ALICE.username)], id="one-witnessed-reset"),
        pytest.param(1, 2, {}, [(2, 1, None)], id="one-unwitnessed-reset"),
        pytest.param(
            1, 3, {2: ALICE, 3: BOB}, [(2, 1, ALICE.username), (3, 2, BOB.username)], id="two-resets-seen-as-one"
        ),
        pytest.param(1, 3, {3: BOB}, [(3, 1, BOB.username)], id="one-request-jumped-two"),
        pytest.param(None, 2, {}, [(2, None, None)], id="first-seen-already-reset"),
        pytest.param(2, 3, {1: ALICE, 2: ALICE, 3: BOB, 4: ALICE}, [(3, 2, BOB.username)], id="other-counts-ignored"),
        pytest.param(2, 2, {2: ALICE}, [], id="unchanged"),
        pytest.param(3, 1, {1: ALICE}, [], id="lower-is-not-a-reset"),
        pytest.param(None, 0, {}, [], id="never-reset"),
    ],
)
def test_which_resets_are_recorded(
    before: int | None, after: int, witnessed: dict[int, AuditActor], expected: list[tuple[int, int | None, str]]
) -> None:
    assert _counts(decide_reset_audits(before=before, after=after, witnessed=witnessed)) == expected


def test_at_most_sixteen_records_for_one_change_the_newest() -> None:
    witnessed = dict.fromkeys(range(1, 41), ALICE)
    resets = decide_reset_audits(before=0, after=40, witnessed=witnessed)
    assert [r.count for r in resets] == list(range(25, 41))
    assert resets[0].previous == 24


def test_a_reset_record_names_the_count_the_actor_and_where_the_actor_came_from() -> None:
    record = build_session_reset_audit(binding=BINDING, reset=ResetToAudit(count=2, previous=1, actor=ALICE), now=NOW)
    jsonschema.validate(record, build_offline_schema(kind_by_name("AuditRecord")))
    assert record["metadata"]["name"] == "sessionbinding-sb-0123456789abcdef0123-9f1c2d3e-reset-2"
    assert "generateName" not in record["metadata"] and record["metadata"]["namespace"] == "team"
    spec = record["spec"]
    assert (spec["action"], spec["actor"]) == ("SessionReset", ALICE.to_wire())
    assert spec["object"]["kind"] == "SessionBinding" and spec["object"]["uid"] == "9f1c2d3e-aaaa-bbbb"
    assert spec["details"] == {
        "workspace": "payments",
        "profile": "quick-review",
        "provider": "anthropic",
        "runner": "pool-a-0",
        "scope": "workspace",
        "via": "status",
        "resets": "2",
        "resetsBefore": "1",
        "actorSource": "admission",
    }
    assert (spec["before"], spec["after"]) == ({"value": "resets 1"}, {"value": "resets 2"})
    assert "by alice@example.com" in spec["message"]


def test_an_unwitnessed_reset_says_so_instead_of_guessing() -> None:
    record = build_session_reset_audit(binding=BINDING, reset=ResetToAudit(count=2, previous=None, actor=None), now=NOW)
    spec = record["spec"]
    assert spec["actor"] == {"username": "unknown", "groups": []}
    assert spec["details"]["actorSource"] == "notWitnessed" and spec["details"]["resetsBefore"] == "unknown"
    assert "did not witness" in spec["message"]


def test_a_deletion_record_has_its_own_fixed_name() -> None:
    record = build_session_deleted_audit(
        binding={**BINDING, "status": {"stored": True, "resets": 0}}, actor=BOB, now=NOW
    )
    jsonschema.validate(record, build_offline_schema(kind_by_name("AuditRecord")))
    assert record["metadata"]["name"] == deleted_audit_name("sb-0123456789abcdef0123", "9f1c2d3e-aaaa-bbbb")
    assert record["metadata"]["name"].endswith("-9f1c2d3e-deleted")
    spec = record["spec"]
    assert spec["actor"]["username"] == BOB.username and spec["details"]["via"] == "delete"
    assert (spec["before"], spec["after"]) == ({"value": "stored"}, {"value": "deleted"})
    assert "secretKey" not in json.dumps(spec) and "sb-0123456789abcdef0123" in spec["message"]


def test_names_differ_by_count_and_by_uid() -> None:
    names = {
        reset_audit_name("sb-x", "uid-one-1", 1),
        reset_audit_name("sb-x", "uid-one-1", 2),
        reset_audit_name("sb-x", "uid-two-2", 1),
        deleted_audit_name("sb-x", "uid-one-1"),
    }
    assert len(names) == 4
    assert len(reset_audit_name("a" * 253, "u" * 36, 10**6)) <= 253


def test_actor_from_userinfo_is_bounded_and_needs_a_username() -> None:
    actor = actor_from_userinfo({"username": "x" * 400, "uid": "", "groups": [f"g{i}" for i in range(40)]})
    assert actor is not None
    assert len(actor.username) == 256 and actor.uid is None and len(actor.groups) == 16
    assert actor_from_userinfo({"groups": ["system:masters"]}) is None


def test_resets_of_reads_a_count() -> None:
    assert resets_of(None) == 0
    assert resets_of({"status": {"resets": 3}}) == 3
    assert resets_of({"status": {"resets": "nope"}}) == 0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_witness_remembers_for_a_while_and_only_so_much() -> None:
    clock = Clock()
    witness = ResetWitness(ttl_seconds=60, limit=3, clock=clock)
    witness.note_reset("uid-1", 1, ALICE)
    witness.note_reset("uid-1", 2, BOB)
    witness.note_deletion("uid-1", BOB)
    assert witness.resets("uid-1") == {1: ALICE, 2: BOB}
    assert witness.deleted_by("uid-1") == BOB and witness.deleted_by("uid-2") is None
    witness.note_reset("uid-2", 1, ALICE)  # over the limit: the oldest note goes
    assert witness.resets("uid-1") == {2: BOB}
    clock.now = 61
    assert witness.resets("uid-2") == {} and witness.deleted_by("uid-1") is None

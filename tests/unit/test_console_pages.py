"""The console's pure parts: page models, the HTML (escaped), the diff, and the live-update hub's fan-out."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import queue
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

from helmhive.api.change import ChangeStatus
from helmhive.api.kubeerrors import Unavailable
from helmhive.console import audit_view, change_view, html, policy_html, profile_view, view
from helmhive.console.diff import classify_line, render_diff
from helmhive.console.hub import Hub, Notice, WatchTarget
from helmhive.console.pages import _snapshot_text

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
DIGEST = "sha256:" + "a" * 64


class _Text(HTMLParser):
    """The text of the element with id ``patch``, as a browser's textContent."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.depth or ("id", "patch") in attrs:
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.text.append(data)


def _cond(ctype: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": ctype, "status": status, "reason": reason, "message": message}


def _job(name: str, *conditions: dict[str, str], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"jobKind": "review-probe"},
        "status": {"conditions": list(conditions), **status},
    }


def test_the_diff_keeps_every_byte_of_the_patch_as_text_and_escapes_markup() -> None:
    patch = (
        "diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1 +1,2 @@\n"
        " def f(): return '<script>alert(1)</script>' & 1\n+# added\r\n-gone\n\\ No newline at end of file"
    )
    rendered = render_diff(patch)
    assert "<script>" not in rendered
    parser = _Text()
    parser.feed(rendered)
    assert "".join(parser.text) == patch
    kinds = [classify_line(line) for line in patch.split("\n")]
    assert kinds == ["file", "meta", "meta", "hunk", "ctx", "add", "del", "meta"]


def test_jobs_are_grouped_by_state_with_their_reasons() -> None:
    failed = _job(
        "opus",
        _cond("Routed", "False", "ModelNotAdvertised", "no runner advertises claude-opus-4-1"),
        _cond("Succeeded", "False", "ModelNotAdvertised"),
        _cond("Ready", "False", "ModelNotAdvertised", "failed closed"),
    )
    waiting = _job("later", _cond("Ready", "False", "WaitingForCapacity", "every runner is busy"))
    running = _job("now", _cond("Running", "True", "Running"), assignment={"runner": "alpha-0"})
    stalled = _job(
        "stalled", _cond("Ready", "False", "ProviderNotMapped"), _cond("Stalled", "True", "ProviderNotMapped")
    )
    page = view.build_overview(
        namespace="ns", pools=[], runners=[], jobs=[running, waiting, failed, stalled], changes=[], now=NOW
    )
    assert list(page.jobs_by_state) == ["Failed", "Waiting", "Running"]
    assert [r["name"] for r in page.jobs_by_state["Failed"]] == ["opus", "stalled"]
    row = page.jobs_by_state["Failed"][0]
    assert row["reason"] == "ModelNotAdvertised"
    assert "no runner advertises claude-opus-4-1" in row["message"] and "failed closed" in row["message"]
    assert page.jobs_by_state["Waiting"][0]["message"] == "every runner is busy"
    assert page.jobs_by_state["Running"][0]["runner"] == "alpha-0"


def test_a_runner_row_shows_qualification_auth_capacity_isolation_and_network() -> None:
    runner = {
        "metadata": {"namespace": "pools", "name": "alpha-0"},
        "spec": {"poolRef": {"name": "alpha"}},
        "status": {
            "effectiveControlState": "Active",
            "reportedStatus": "Ready",
            "models": "small,large",
            "conditions": [
                _cond("Schedulable", "False", "QualificationFailed", "probe failed"),
                _cond("Qualified", "False", "QualificationFailed", "review-probe: wrong verdict"),
            ],
            "qualification": {"state": "Failed", "round": 3, "lastFailure": "review-probe: wrong verdict"},
            "report": {
                "provider": "alpha",
                "authentication": {"state": "Authenticated", "verifiedAt": "2026-12-06T11:57:00Z"},
                "activeJobs": 1,
                "concurrency": 2,
                "credentialIsolation": "SeparateUser",
                "sandbox": {"network": "Namespace"},
            },
        },
    }
    row = view.build_overview(namespace="ns", pools=[], runners=[runner], jobs=[], changes=[], now=NOW).runners[0]
    assert row["qualified"] == "False QualificationFailed"
    assert row["qualification"] == "Failed (round 3): review-probe: wrong verdict"
    assert (row["auth"], row["capacity"]) == ("Authenticated 3m ago", "1/2")
    assert (row["credentialIsolation"], row["network"], row["control"]) == ("SeparateUser", "Namespace", "Active")
    assert "wrong verdict" in html.render_overview(
        view.build_overview(namespace="ns", pools=[], runners=[runner], jobs=[], changes=[], now=NOW)
    )


def test_the_candidate_table_has_a_row_per_runner_with_its_reason() -> None:
    groups = [
        {"runners": ["alpha-0", "alpha-1"], "provider": "alpha", "model": "opus", "reason": "ModelNotAdvertised:opus"},
        {"runners": ["beta-0"], "provider": "beta", "reason": "ProviderNotMapped"},
    ]
    rows = view.build_candidates(groups)
    assert [(r["runner"], r["reason"]) for r in rows] == [
        ("alpha-0", "ModelNotAdvertised:opus"),
        ("alpha-1", "ModelNotAdvertised:opus"),
        ("beta-0", "ProviderNotMapped"),
    ]


def test_a_session_binding_is_shown_by_name_and_mode_only() -> None:
    job = _job("j", session={"binding": "sb-1", "mode": "resumed", "sessionId": "native-123"})
    page = view.build_job(job=job, explanation=None, routing_note="", events=[], snapshot_text="")
    assert page.session == {"binding": "sb-1", "mode": "resumed"}
    assert "native-123" not in html.render_job(page)


def test_the_snapshot_shows_instructions_by_size_only() -> None:
    text = _snapshot_text({"snapshot": {"instructions": "secret sauce", "tools": ["read"]}})
    assert "secret sauce" not in text and "12 characters, not shown" in text and "read" in text


def _change(mode: str, **status: Any) -> tuple[dict[str, Any], ChangeStatus]:
    obj = {
        "metadata": {"namespace": "ns", "name": "c"},
        "spec": {"approval": mode, "request": {"title": "<b>refunds</b>"}},
        "status": status,
    }
    return obj, ChangeStatus.model_validate(status)


def test_approve_is_offered_for_a_manual_change_with_an_unapproved_plan_and_posts_the_digest_shown() -> None:
    plan = {"job": "c-plan", "digest": DIGEST, "summary": "do <it>", "steps": [{"title": "one"}]}
    obj, status = _change("Manual", plan=plan)
    page = change_view.build_change(obj, status)
    assert page.can_approve
    body = html.render_change(page, patch_html="", patch_note="")
    assert f'name="digest" value="{DIGEST}"' in body and 'id="approve"' in body
    assert "<b>refunds</b>" not in body and "&lt;b&gt;refunds&lt;/b&gt;" in body and "do &lt;it&gt;" in body
    approval = {"by": "alice", "digest": DIGEST, "at": "2026-12-06T12:00:00Z"}
    approved = change_view.build_change(*_change("Manual", plan=plan, approval=approval))
    assert not approved.can_approve and approved.approval["by"] == "alice"
    assert not change_view.build_change(*_change("Automatic", plan=plan)).can_approve


def test_the_hub_tells_every_subscriber_a_lost_watch_once_then_its_resync_and_changes() -> None:
    calls = {"lists": 0}
    released = threading.Event()

    def lister(plural: str | None, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        calls["lists"] += 1
        if calls["lists"] <= 2:  # the same cause twice: told once
            raise Unavailable(0, "connection refused")
        return [], "7"

    def watcher(plural: str | None, namespace: str | None, version: str, seconds: int) -> Iterator[tuple[str, Any]]:
        assert version == "7"
        yield "ADDED", {}
        released.wait(10)

    hub = Hub(lister=lister, watcher=watcher, targets=[WatchTarget("changes", "changes", "ns")])
    with hub.subscribe() as first, hub.subscribe() as second:
        hub.start()
        try:
            for inbox in (first, second):
                seen = [inbox.get(timeout=10) for _ in range(3)]
                assert [n.event for n in seen] == ["lost", "resync", "changed"]
                assert seen[0] == Notice("lost", "changes", "connection refused")
                assert all(n.kind == "changes" for n in seen)
                assert inbox.empty()
            assert calls["lists"] == 3
        finally:
            hub.stop()
            released.set()
    assert isinstance(first, queue.Queue)


def test_a_job_shows_the_memory_named_injected_and_dropped_with_the_reason() -> None:
    job = _job(
        "j",
        assignment={"runner": "alpha-0", "memoryIds": ["style", "gone"]},
        result={
            "outcome": "Completed",
            "memory": {"injected": ["style"], "dropped": [{"name": "gone", "reason": "deleted"}]},
        },
    )
    page = view.build_job(job=job, explanation=None, routing_note="", events=[], snapshot_text="")
    assert (page.memory_ids, page.memory_injected) == (["style", "gone"], ["style"])
    assert "gone: deleted" in html.render_job(page)


def test_a_change_shows_each_stage_runner_and_the_reviews_findings() -> None:
    status = {
        "jobs": [{"stage": "implementation", "iteration": 1, "name": "c-impl-1", "provider": "alpha"}],
        "review": {
            "job": "c-review-1",
            "iteration": 1,
            "verdict": "request-changes",
            "findings": [{"severity": "major", "message": "not <idempotent>", "file": "app.py", "line": 3}],
        },
    }
    obj, parsed = _change("Automatic", **status)
    page = change_view.build_change(obj, parsed, {"c-impl-1": "alpha-0"})
    assert page.stages[0]["runner"] == "alpha-0"
    assert page.findings == [{"severity": "major", "where": "app.py:3", "message": "not <idempotent>"}]
    assert "not &lt;idempotent&gt;" in html.render_change(page, patch_html="", patch_note="")


def test_a_page_is_told_only_the_changes_that_concern_it() -> None:
    from helmhive.console.server import decide_watches, parse_watches

    job_page = parse_watches(decide_watches("/jobs/ns/opus"))
    assert job_page == {"agentjobs": "opus", "events": "opus", "runners": None, "runnerpools": None}
    assert Notice("changed", "agentjobs", name="opus").concerns(job_page)
    assert not Notice("changed", "agentjobs", name="other").concerns(job_page)
    assert not Notice("changed", "changes", name="opus").concerns(job_page)
    assert Notice("changed", "runners", name="alpha-0").concerns(job_page)
    assert Notice("lost", "changes", "connection refused").concerns(job_page)
    overview = parse_watches(decide_watches("/"))
    assert not Notice("changed", "events", name="opus").concerns(overview)
    assert Notice("changed", "changes", name="any").concerns(overview)
    assert parse_watches(decide_watches("/changes/ns/gated")) == {"changes": "gated", "agentjobs": None}


def test_a_memory_record_shows_scope_sensitivity_expiry_and_why_it_is_not_active_never_its_text() -> None:
    record = {
        "metadata": {"namespace": "ns", "name": "refund-rule"},
        "spec": {
            "workspace": "payments",
            "scope": {"type": "service", "service": "refunds"},
            "kind": "convention",
            "text": "canary-memory-text",
            "sensitivity": "internal",
            "expiresAt": "2026-01-01T00:00:00Z",
        },
        "status": {"conditions": [_cond("Active", "False", "Expired", "expired at 2026-01-01T00:00:00Z")]},
    }
    row = view.build_memory_row(record)
    assert (row["scope"], row["sensitivity"], row["expires"], row["active"]) == (
        "service:refunds",
        "internal",
        "2026-01-01T00:00:00Z",
        "False",
    )
    assert row["why"] == "Expired: expired at 2026-01-01T00:00:00Z"
    assert "canary-memory-text" not in html.render_memory("ns", [row], [])


def _profile(name: str, spec: dict[str, Any], *, valid: bool = True, **status: Any) -> dict[str, Any]:
    reason = "Valid" if valid else "WidensEnvelope"
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": spec,
        "status": {"conditions": [_cond("Valid", "True" if valid else "False", reason, "why")], **status},
    }


def test_a_profile_shows_what_it_narrows_of_its_envelope_its_revisions_newest_first_never_its_instructions() -> None:
    spec = {
        "envelope": "review-probe",
        "purpose": "reviews",
        "instructions": "canary-instructions",
        "tools": ["read"],
        "providerMappings": [{"provider": "alpha", "model": "claude-opus-4-1"}],
    }
    effective = {
        "envelope": "review-probe",
        "tools": ["read"],
        "filesystem": "read",
        "network": "disabled",
        "session": {"policy": "fresh", "scope": "workspace"},
        "memory": {"enabled": False},
        "providerMappings": [{"provider": "alpha", "model": "claude-opus-4-1"}],
        "instructions": "canary-instructions",
    }
    revisions = [
        {"metadata": {"name": f"p-{n}", "labels": {"helmhive.dev/profile": "p"}}, "revision": n, "data": {"x": "y"}}
        for n in (1, 3, 2)
    ]
    other = {"metadata": {"name": "q-1", "labels": {"helmhive.dev/profile": "q"}}, "revision": 1}
    page = profile_view.build_profiles(
        namespace="ns",
        profiles=[_profile("p", spec, effective=effective, currentRevision="p-3")],
        revisions=[*revisions, other],
        envelopes=[],
        envelopes_listed=True,
        now=NOW,
    )
    block = page.profiles[0]
    aspects = {r["aspect"]: r for r in block.aspects}
    assert aspects["tools"] == {
        "aspect": "tools",
        "envelope": "read, search, think",
        "profile": "read",
        "effective": "read",
        "narrowed": "yes",
    }
    assert (aspects["filesystem"]["profile"], aspects["filesystem"]["narrowed"]) == ("(as the envelope)", "no")
    assert aspects["provider mappings"]["effective"] == "alpha/claude-opus-4-1"
    assert aspects["memory"] == {**aspects["memory"], "envelope": "allowed", "effective": "disabled", "narrowed": "yes"}
    assert [r["name"] for r in block.revisions] == ["p-3", "p-2", "p-1"]
    assert [r["current"] for r in block.revisions] == ["current", "", ""]
    assert block.valid["reason"] == "Valid"
    assert block.envelope_note == "the Envelope review-probe is not published in the cluster"
    body = policy_html.render_profiles(page)
    assert "canary-instructions" not in body and "19 characters, not shown" in body
    assert "canary-instructions" not in json.dumps(dataclasses.asdict(page))
    assert 'id="profile-p-tools"' in body and 'id="profile-p-provider-mappings"' in body


def test_an_invalid_profile_shows_why_and_nothing_in_effect_and_a_refused_list_is_shown() -> None:
    refusal = "listing the profile revisions (ControllerRevisions) in ns: the API server refused: 403 forbidden"
    page = profile_view.build_profiles(
        namespace="ns",
        profiles=[_profile("wide", {"envelope": "change-review", "network": "enabled"}, valid=False)],
        revisions=[],
        envelopes=[{"metadata": {"name": "change-review"}, "spec": {"edited": True}}],
        envelopes_listed=True,
        now=NOW,
        problems=[refusal],
    )
    block = page.profiles[0]
    assert block.valid == {"status": "False", "reason": "WidensEnvelope", "message": "why"}
    network = next(r for r in block.aspects if r["aspect"] == "network")
    assert (network["envelope"], network["profile"], network["narrowed"]) == ("disabled", "enabled", "")
    assert network["effective"] == "(nothing: not valid, or not reconciled yet)"
    assert "differs from the code" in block.envelope_note
    body = policy_html.render_profiles(page)
    assert refusal in body and "Valid: False WidensEnvelope: why" in body


def _audit(name: str, action: str, time: str, kind: str, obj: str, actor: str = "helmhive-operator") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {
            "action": action,
            "actor": {"username": actor},
            "object": {"apiVersion": "helmhive.dev/v1alpha1", "kind": kind, "name": obj},
            "time": time,
            "before": {"revision": "p-1", "hash": "sha256:1"},
            "after": {"revision": "p-2", "hash": "sha256:2"},
            "message": f"{action} <{obj}>",
            "details": {"envelope": "review-probe"},
        },
    }


AUDIT = [
    _audit("a1", "ProfileRevisionCreated", "2026-12-06T10:00:00Z", "Profile", "wants-opus", "alice"),
    _audit("a2", "ChangeApproved", "2026-12-06T11:00:00Z", "Change", "gated", "bob"),
    _audit("a3", "ProfileRevisionCreated", "2026-12-06T11:30:00Z", "Profile", "reviewer", "alice"),
    _audit("a4", "MemoryCreated", "2026-12-06T09:00:00Z", "MemoryRecord", "cents"),
]


def _search(**params: str) -> audit_view.AuditPage:
    query, problems = audit_view.parse_audit_query({k: [v] for k, v in params.items()})
    return audit_view.build_audit(namespace="ns", records=AUDIT, query=query, problems=problems)


def test_the_audit_is_newest_first_and_searchable_by_action_object_actor_and_time() -> None:
    assert [r["name"] for r in _search().records] == ["a3", "a2", "a1", "a4"]
    assert [r["name"] for r in _search(action="ProfileRevisionCreated").records] == ["a3", "a1"]
    assert [r["name"] for r in _search(object="profile/wants").records] == ["a1"]
    assert [r["name"] for r in _search(actor="bob").records] == ["a2"]
    between = _search(since="2026-12-06T09:30", until="2026-12-06T11:15:00Z")
    assert [r["name"] for r in between.records] == ["a2", "a1"]
    assert (between.matched, between.total) == (2, 4)
    row = _search(object="gated").records[0]
    assert (row["before"], row["after"], row["details"]) == (
        "p-1 · sha256:1",
        "p-2 · sha256:2",
        "envelope=review-probe",
    )
    bounded = audit_view.build_audit(namespace="ns", records=AUDIT, query=audit_view.AuditQuery(), limit=2)
    assert ([r["name"] for r in bounded.records], bounded.matched) == (["a3", "a2"], 4)


def test_the_audit_search_form_keeps_the_query_says_what_it_cannot_use_and_escapes() -> None:
    page = _search(action="ChangeApproved", since="yesterday")
    assert [r["name"] for r in page.records] == ["a2"]  # a time it cannot read is not applied
    assert any("since 'yesterday' is not a time" in p for p in page.problems)
    body = policy_html.render_audit(page)
    assert '<option value="ChangeApproved" selected>' in body and 'method="get" action="/audit"' in body
    assert "ChangeApproved &lt;gated&gt;" in body and "<gated>" not in body
    assert "1 of 4 records match" in body
    assert any("no such action" in p for p in _search(action="Nope").problems)
    assert _search(action="Nope").records == []
    from helmhive.console.server import decide_watches

    assert (decide_watches("/audit"), decide_watches("/profiles")) == ("auditrecords", "profiles")

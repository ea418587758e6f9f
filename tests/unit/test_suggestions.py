"""Policy suggestions, pure: the output contract, the records they become, the files, the audit record.

The exported files are checked by the real ``helmhive validate`` command (typer's runner, no
cluster); the real-API-server half is ``tests/operator/test_suggestions_cluster.py``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from helmhive.api.common import JobKind, Sensitivity
from helmhive.api.memory import MemoryRecordSpec
from helmhive.api.profile import MemoryPolicy
from helmhive.api.reasons import Reason
from helmhive.api.suggestion import SuggestionOutput
from helmhive.cli.main import app
from helmhive.policy.agentjob.prompts import check_output
from helmhive.policy.envelopes import ENVELOPES
from helmhive.policy.memory.selection import NamedMemoryRecord, select_memory
from helmhive.policy.suggestions.audit import (
    build_suggestions_exported_audit,
    decide_job_digests,
    suggestion_export_audit_name,
)
from helmhive.policy.suggestions.export import (
    SuggestionError,
    build_record_file,
    build_stored_output,
    build_suggestion_export,
    decide_job_suggestions,
    decide_stored_output,
    suggestion_digest,
)

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
CANARY = "canary-suggestion-text-5f1e"  # the agent's words: never in an audit record
CONTRACT = ENVELOPES[JobKind.POLICY_SUGGESTION].output_contract


def _suggestion(**over: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "kind": "constraint",
        "scope": {"type": "service", "service": "ledger"},
        "text": f"Ledger entries are append-only. {CANARY}",
        "sensitivity": "internal",
        "rationale": "Three reviews this month reverted in-place edits of ledger rows.",
    }
    item.update(over)
    return {k: v for k, v in item.items() if v is not None}


def _job(items: list[Any] | None, *, kind: str = "policy-suggestion") -> dict[str, Any]:
    job: dict[str, Any] = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "metadata": {"name": "suggest-1", "namespace": "team-a", "uid": "6f1c2b9e-0d4a-4c55-9a57-2b6f0e8c1d3a"},
        "spec": {"workspace": "payments", "jobKind": kind, "request": {"title": "t", "prompt": "p"}},
    }
    if items is not None:
        job["status"] = {"result": {"outcome": "Completed", "output": {"suggestions": items}}}
    return job


WORKSPACE = {
    "apiVersion": "helmhive.dev/v1alpha1",
    "kind": "Workspace",
    "metadata": {"name": "payments", "namespace": "team-a"},
    "spec": {"repository": {"url": "https://git.example.com/acme/payments.git"}, "services": [{"name": "ledger"}]},
}


# --- the output contract -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "ok"),
    [
        pytest.param(_suggestion(), True, id="complete"),
        pytest.param(_suggestion(name="ledger-append-only", expiresAt="2027-01-15T00:00:00Z"), True, id="named"),
        pytest.param(_suggestion(sensitivity=None), False, id="no-sensitivity"),
        pytest.param(_suggestion(scope=None), False, id="no-scope"),
        pytest.param(_suggestion(sensitivity="secret"), False, id="unknown-sensitivity"),
        pytest.param(_suggestion(source={"type": "adr", "url": "x"}), False, id="agent-names-a-source"),
        pytest.param(_suggestion(text="x" * 2001), False, id="text-over-limit"),
        pytest.param(_suggestion(name="Not_A_Label"), False, id="bad-name"),
    ],
)
def test_the_envelope_contract_and_the_model_agree(item: dict[str, Any], ok: bool) -> None:
    answer = json.dumps({"suggestions": [item]})
    assert check_output(text=answer, contract=CONTRACT).ok is ok
    try:
        SuggestionOutput.model_validate({"suggestions": [item]})
        parsed = True
    except ValueError:
        parsed = False
    assert parsed is ok


def test_every_field_a_record_needs_but_its_source_is_required() -> None:
    items = (CONTRACT.json_schema or {})["properties"]["suggestions"]["items"]
    assert set(items["required"]) == {"kind", "scope", "text", "sensitivity", "rationale"}
    assert "source" not in items["properties"]  # the export sets it: the job, never the agent's word


# --- from a job to records ------------------------------------------------------------------------


def test_each_suggestion_becomes_a_record_whose_source_is_the_job() -> None:
    item = _suggestion()
    found = decide_job_suggestions(job=_job([item, _suggestion(name="money", scope={"type": "workspace"})]))
    first, second = found.views
    assert first.valid and second.valid
    assert first.digest == suggestion_digest(item) and first.digest.startswith("sha256:")
    assert first.record_name == "suggest-1-" + first.digest[7:17]
    assert second.record_name == "money"
    record = first.record
    assert record is not None
    assert record["spec"]["source"] == {
        "type": "policy-suggestion",
        "url": "/apis/helmhive.dev/v1alpha1/namespaces/team-a/agentjobs/suggest-1",
        "job": {"name": "suggest-1", "uid": "6f1c2b9e-0d4a-4c55-9a57-2b6f0e8c1d3a", "digest": first.digest},
    }
    spec = MemoryRecordSpec.model_validate(record["spec"])
    assert (spec.workspace, spec.sensitivity.value, spec.scope.service) == ("payments", "internal", "ledger")
    assert "namespace" not in record["metadata"]  # applied beside its Workspace


def test_the_digest_is_of_the_suggestion_as_written_whatever_the_key_order() -> None:
    item = _suggestion()
    assert suggestion_digest(item) == suggestion_digest(dict(reversed(list(item.items()))))
    assert suggestion_digest(item) != suggestion_digest(_suggestion(sensitivity="public"))


def test_a_suggestion_that_cannot_be_a_record_says_where_and_why() -> None:
    found = decide_job_suggestions(
        job=_job(
            [
                _suggestion(sensitivity=None),
                _suggestion(scope={"type": "service"}),
                _suggestion(scope={"type": "service", "service": "billing"}),
                _suggestion(name="twice"),
                _suggestion(name="twice", kind="decision"),
            ]
        ),
        workspace=WORKSPACE,
    )
    problems = [[(p.field_path, p.reason) for p in v.problems] for v in found.views]
    assert problems[0] == [("status.result.output.suggestions[0].sensitivity", Reason.INVALID_SUGGESTION)]
    assert problems[1] == [("spec.scope", Reason.INVALID_SPEC)]
    assert problems[2] == [("spec.scope.service", Reason.SERVICE_NOT_IN_WORKSPACE)]
    assert problems[3] == [] and problems[4] == [("metadata.name", Reason.DUPLICATE_OBJECT)]
    assert [v.record_name for v in found.valid] == ["twice"]


def test_an_output_kept_in_the_artifacts_config_map_is_read_and_checked() -> None:
    """Over 16 KiB the runner keeps the output in the job's ConfigMap: read whole, checked by SHA-256."""
    output = {"suggestions": [_suggestion()]}
    text = json.dumps(output, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    job = _job(None)
    artifact = {"kind": "ConfigMap", "name": "suggest-1-artifacts", "key": "output.json", "bytes": len(text)}
    job["status"] = {"result": {"outcome": "Completed", "artifacts": [{**artifact, "sha256": digest}]}}
    stored = decide_stored_output(job)
    assert stored is not None and (stored.config_map, stored.key) == ("suggest-1-artifacts", "output.json")
    where = "agentjob team-a/suggest-1"
    found = decide_job_suggestions(job=job, stored_output=build_stored_output(stored, text, where=where))
    assert [v.suggestion.text for v in found.valid if v.suggestion] == [_suggestion()["text"]]
    # Not read by the caller: named, not silently "no suggestions".
    with pytest.raises(SuggestionError) as err:
        decide_job_suggestions(job=job)
    assert err.value.reason is Reason.OUTPUT_NOT_READABLE and "suggest-1-artifacts" in err.value.message
    # Missing, altered, cut short, or not an object: refused with the same reason.
    for bad_text, bad in [
        (None, stored),
        (text + " ", stored),
        (text, replace(stored, truncated=True)),
        ("[1]", replace(stored, sha256=hashlib.sha256(b"[1]").hexdigest())),
    ]:
        with pytest.raises(SuggestionError) as err:
            build_stored_output(bad, bad_text, where=where)
        assert err.value.reason is Reason.OUTPUT_NOT_READABLE
    # An inline output needs no ConfigMap.
    assert decide_stored_output(_job(output["suggestions"])) is None


@pytest.mark.parametrize(
    ("job", "reason"),
    [
        pytest.param(_job([_suggestion()], kind="review-probe"), Reason.NOT_A_SUGGESTION_JOB, id="other-kind"),
        pytest.param(_job(None), Reason.NO_SUGGESTIONS, id="not-finished"),
        pytest.param(_job([]), Reason.NO_SUGGESTIONS, id="none-suggested"),
    ],
)
def test_a_job_with_nothing_to_export_is_refused_with_its_reason(job: dict[str, Any], reason: Reason) -> None:
    with pytest.raises(SuggestionError) as err:
        decide_job_suggestions(job=job)
    assert err.value.reason is reason and "team-a/suggest-1" in err.value.message


# --- the files --------------------------------------------------------------------------------------


def test_the_file_quotes_the_rationale_as_comments_only(tmp_path: Path) -> None:
    hostile = "fine\n---\napiVersion: v1\nkind: Secret\n\x1b]0;owned\x07"
    found = decide_job_suggestions(job=_job([_suggestion(rationale=hostile)]))
    (view,) = found.views
    text = build_record_file(job=found.job, view=view, total=1, exported_by="alice")
    docs = list(yaml.safe_load_all(text))
    assert docs == [view.record]  # the rationale added no document and no field
    assert "\x1b" not in text and "\\x1b]0;owned\\x07" in text
    assert "exported by alice" in text and view.digest in text


def test_helmhive_validate_accepts_the_exported_files(tmp_path: Path) -> None:
    found = decide_job_suggestions(
        job=_job(
            [_suggestion(), _suggestion(name="money", scope={"type": "workspace"}, expiresAt="2027-01-15T00:00:00Z")]
        ),
        workspace=WORKSPACE,
    )
    for view in found.valid:
        text = build_record_file(job=found.job, view=view, total=2, exported_by="alice")
        (tmp_path / f"{view.record_name}.yaml").write_text(text, encoding="utf-8")
    # The Workspace beside them, as in the repository (no namespace: references resolve, services are checked).
    workspace = {**WORKSPACE, "metadata": {"name": "payments"}}
    (tmp_path / "workspace.yaml").write_text(yaml.safe_dump(workspace), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "3 Helmhive objects in 3 files are valid" in result.output


def test_helmhive_validate_refuses_a_suggestion_source_without_its_job(tmp_path: Path) -> None:
    found = decide_job_suggestions(job=_job([_suggestion()]))
    record = found.views[0].record
    assert record is not None
    del record["spec"]["source"]["job"]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(record), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code != 0
    assert "spec.source: InvalidSpec: source.job is required for a policy-suggestion source" in result.output


# --- memory: a suggestion is never injected ---------------------------------------------------------


def test_memory_selection_is_told_records_only_never_a_jobs_suggestions() -> None:
    # select_memory takes MemoryRecords; a job's suggestions are not one until a human commits the file.
    found = decide_job_suggestions(job=_job([_suggestion(scope={"type": "workspace"})]))
    memory = MemoryPolicy(enabled=True, max_sensitivity=Sensitivity.CONFIDENTIAL)
    before = select_memory(
        records=[], workspace="payments", service=None, policy=memory, job_kind=JobKind.REVIEW_PROBE, now=NOW
    )
    assert before.ids == [] and CANARY not in before.context
    record = found.views[0].record
    assert record is not None
    committed = NamedMemoryRecord(name=record["metadata"]["name"], spec=MemoryRecordSpec.model_validate(record["spec"]))
    after = select_memory(
        records=[committed], workspace="payments", service=None, policy=memory, job_kind=JobKind.REVIEW_PROBE, now=NOW
    )
    assert after.ids == [record["metadata"]["name"]] and CANARY in after.context


# --- the export request and its audit record --------------------------------------------------------


def _export(found: Any, *, name: str = "suggest-1-x7k2p") -> dict[str, Any]:
    export = build_suggestion_export(job=found.job, views=found.valid, exported_by="alice")
    export["metadata"] |= {"name": name, "uid": "0b7e9f3c-aaaa-bbbb-cccc-000000000001", "generation": 1}
    return export


def test_the_audit_record_names_the_job_the_digests_and_the_actor_never_the_text() -> None:
    job = _job([_suggestion(), _suggestion(name="money", scope={"type": "workspace"})])
    found = decide_job_suggestions(job=job)
    export = _export(found)
    assert export["spec"]["exportedBy"] == "alice" and export["metadata"]["generateName"] == "suggest-1-"
    record = build_suggestions_exported_audit(export=export, job=job, now=NOW)
    spec = record["spec"]
    assert spec["action"] == "SuggestionsExported" and spec["actor"]["username"] == "alice"
    assert spec["object"] == {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "namespace": "team-a",
        "name": "suggest-1",
        "uid": "6f1c2b9e-0d4a-4c55-9a57-2b6f0e8c1d3a",
    }
    assert [s["digest"] for s in spec["suggestions"]] == [v.digest for v in found.views]
    assert all(s["matchesJob"] is True for s in spec["suggestions"])
    assert spec["details"]["matchingDigests"] == "2 of 2"
    assert record["metadata"]["name"] == suggestion_export_audit_name(
        "suggest-1-x7k2p", "0b7e9f3c-aaaa-bbbb-cccc-000000000001"
    )
    assert record["metadata"]["labels"]["job.audit.helmhive.dev/6f1c2b9e-0d4a-4c55-9a57-2b6f0e8c1d3a"] == (
        "SuggestionsExported"
    )
    assert CANARY not in json.dumps(record)


def test_a_digest_the_job_never_produced_or_a_job_gone_is_said_so() -> None:
    job = _job([_suggestion()])
    export = _export(decide_job_suggestions(job=job))
    export["spec"]["suggestions"].append({"digest": "sha256:" + "0" * 64, "record": "made-up"})
    spec = build_suggestions_exported_audit(export=export, job=job, now=NOW)["spec"]
    assert [s["matchesJob"] for s in spec["suggestions"]] == [True, False]
    assert spec["details"]["matchingDigests"] == "1 of 2"
    other = _job([_suggestion()])
    other["metadata"]["uid"] = "another-job-of-the-same-name"
    for gone in (None, other):
        spec = build_suggestions_exported_audit(export=export, job=gone, now=NOW)["spec"]
        assert spec["details"]["jobFound"] == "false" and "matchesJob" not in spec["suggestions"][0]
    assert decide_job_digests(_job(None)) is None

"""decide_change: every stage, every failure, the approval gate, iterations and crash-restart idempotency."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import pytest

from helmhive.api.change import ChangeStatus
from helmhive.api.governed import ChangeStage
from helmhive.policy.change.decision import AUTOMATIC_APPROVER, ChangeDecision, decide_change
from helmhive.policy.change.jobs import build_job_name, build_plan_digest, view_stage_job
from helmhive.policy.change.prompts import PROMPT_MAX_CHARS, STAGE_MARKER
from helmhive.policy.conditions import find_condition

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
COMMIT = "a" * 40
PLAN = {"summary": "Do it", "steps": [{"title": "Criterion 1", "detail": "edit app.py"}], "risks": []}
SHA = hashlib.sha256(b"patch").hexdigest()


def change(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "Change",
        "metadata": {
            "name": "fix",
            "namespace": "team",
            "uid": "uid-123456789",
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": {
            "workspace": "shop",
            "request": {"title": "Fix it", "description": "Make it right.\nAPPEND-LINE: a.txt :: x"},
            "criteria": ["It is right", "It stays right"],
            "source": {"repository": "git://127.0.0.1/repo", "commit": COMMIT},
            **spec,
        },
    }


def job(
    stage: ChangeStage,
    iteration: int = 1,
    *,
    state: str = "running",
    reason: str = "Completed",
    provider: str = "anthropic",
    output: dict[str, Any] | None = None,
    patch: bool = True,
    checks: list[dict[str, Any]] | None = None,
    name: str = "fix",
    started: bool = True,
    routed_false: str | None = None,
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = []
    if state in ("succeeded", "failed"):
        conditions.append(
            {
                "type": "Succeeded",
                "status": "True" if state == "succeeded" else "False",
                "reason": reason,
                "message": f"ended {reason}",
            }
        )
    if routed_false:
        conditions.append({"type": "Routed", "status": "False", "reason": routed_false, "message": "no runner"})
    result: dict[str, Any] = {}
    if started:
        result["startedAt"] = "2026-12-01T11:00:00Z"
    if output is not None:
        result["output"] = output
    if stage is ChangeStage.IMPLEMENTATION and state == "succeeded" and patch:
        result["patch"] = {"configMap": "x-artifacts", "key": "patch.diff", "bytes": 5, "sha256": SHA, "files": 1}
    if checks is not None:
        result["checks"] = checks
    kinds = {
        ChangeStage.PLANNING: "change-planning",
        ChangeStage.IMPLEMENTATION: "change-implementation",
        ChangeStage.REVIEW: "change-review",
    }
    return {
        "metadata": {"name": build_job_name(name, stage, iteration), "namespace": "team"},
        "spec": {"jobKind": kinds[stage], "change": {"name": name, "stage": stage.value, "iteration": iteration}},
        "status": {
            "conditions": conditions,
            "assignment": {"provider": provider, "model": "m1", "runner": "r"},
            "result": result,
        },
    }


def passed(name: str = "unit") -> dict[str, Any]:
    return {"name": name, "outcome": "Passed", "exitCode": 0, "durationSeconds": 0.1, "outputSha256": SHA}


def failed(name: str = "unit") -> dict[str, Any]:
    return {"name": name, "outcome": "Failed", "exitCode": 1, "durationSeconds": 0.1, "outputTail": "boom"}


def review(verdict: str) -> dict[str, Any]:
    return {
        "verdict": verdict,
        "summary": f"{verdict}!",
        "findings": [{"severity": "major", "message": "m"}],
        "criteria": [{"criterion": 0, "met": verdict == "approve"}],
    }


def decide(obj: dict[str, Any], *jobs: dict[str, Any], workspace: bool = True) -> ChangeDecision:
    return decide_change(change=obj, jobs={j["metadata"]["name"]: j for j in jobs}, workspace_exists=workspace, now=NOW)


def cond(decision: ChangeDecision, ctype: str) -> tuple[str, str]:
    found = find_condition(decision.status.get("conditions"), ctype)
    assert found is not None, f"no {ctype} condition in {decision.status.get('conditions')}"
    return found["status"], found["reason"]


def advance(obj: dict[str, Any], decision: ChangeDecision) -> dict[str, Any]:
    """The Change as the API server holds it after the handler wrote ``decision.status``."""
    return {**obj, "status": decision.status}


# -- planning -------------------------------------------------------------------------


def test_a_new_change_creates_its_planning_job_owned_by_it() -> None:
    d = decide(change())
    assert d.create is not None
    meta, spec = d.create["metadata"], d.create["spec"]
    assert meta["name"] == "fix-plan"
    assert meta["ownerReferences"][0] == {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "Change",
        "name": "fix",
        "uid": "uid-123456789",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert meta["labels"]["helmhive.dev/change"] == "fix"
    assert spec["jobKind"] == "change-planning"
    assert spec["change"] == {"name": "fix", "stage": "planning", "iteration": 1}
    assert spec["source"] == {"repository": "git://127.0.0.1/repo", "commit": COMMIT}
    assert "checks" not in spec and "patch" not in spec
    prompt = spec["request"]["prompt"]
    assert prompt.startswith(f"{STAGE_MARKER} planning\n")
    assert "1. It is right\n2. It stays right" in prompt
    assert f"Commit: {COMMIT}" in prompt and "## Plan" not in prompt
    assert cond(d, "Planned") == ("Unknown", "StageRunning")
    assert cond(d, "Ready") == ("False", "StageRunning")
    assert not d.finished and not d.audits


def test_a_change_whose_workspace_does_not_exist_yet_waits_for_it_visibly() -> None:
    d = decide(change(), workspace=False)
    assert d.create is None
    assert cond(d, "Ready") == ("False", "WaitingForWorkspace")
    assert "shop" in find_condition(d.status["conditions"], "Ready")["message"]  # type: ignore[index]
    assert not d.finished


def test_a_re_run_after_a_crash_never_creates_a_second_planning_job() -> None:
    obj = change()
    first = decide(obj)
    # The job exists (created before the crash) but the status write was lost: the same name, no new job.
    again = decide(obj, job(ChangeStage.PLANNING))
    assert first.create is not None and again.create is None
    assert cond(again, "Planned") == ("Unknown", "StageRunning")


@pytest.mark.parametrize("reason", ["NoEligibleRunner", "ProfileNotFound"])
def test_a_planning_job_that_failed_closed_at_queue_time_ends_the_change(reason: str) -> None:
    d = decide(change(), job(ChangeStage.PLANNING, routed_false=reason, started=False))
    assert cond(d, "Planned") == ("False", reason)
    assert cond(d, "Ready") == ("False", "PlanningFailed")
    message = find_condition(d.status["conditions"], "Ready")["message"]  # type: ignore[index]
    assert "fix-plan" in message and reason in message
    assert d.finished and d.create is None
    assert [a["spec"]["action"] for a in d.audits] == ["ChangeStageFailed"]


@pytest.mark.parametrize("reason", ["WaitingForCapacity", "WaitingForWorkspace", "WaitingForProfile"])
def test_a_job_that_waits_is_not_a_failure(reason: str) -> None:
    d = decide(change(), job(ChangeStage.PLANNING, routed_false=reason, started=False))
    assert cond(d, "Planned") == ("Unknown", "StageRunning") and not d.finished


@pytest.mark.parametrize("reason", ["RunnerLost", "AgentCrashed", "AgentUnresponsive", "Interrupted"])
def test_a_planning_job_that_failed_for_the_infrastructure_and_will_be_re_queued_still_runs(reason: str) -> None:
    lost = job(ChangeStage.PLANNING, state="failed", reason=reason)
    lost["status"]["profile"] = {"snapshot": {"filesystem": "read"}}
    d = decide(change(), lost)
    assert cond(d, "Planned") == ("Unknown", "StageRunning") and not d.finished
    # Once the operator recorded that it is not re-run (here: the re-run was spent), the stage failed.
    spent = job(ChangeStage.PLANNING, state="failed", reason=reason)
    spent["status"]["attempts"] = 1
    assert cond(decide(change(), spent), "Ready") == ("False", "PlanningFailed")
    spent["status"]["conditions"][0]["message"] += "; not re-run: already re-run 1 time(s)"
    assert cond(decide(change(), spent), "Ready") == ("False", "PlanningFailed")


def test_a_plan_without_steps_is_an_invalid_stage_output() -> None:
    d = decide(change(), job(ChangeStage.PLANNING, state="succeeded", output={"summary": "x", "steps": []}))
    assert cond(d, "Planned") == ("False", "InvalidStageOutput")
    assert cond(d, "Ready") == ("False", "PlanningFailed")


def test_a_plan_is_stored_with_its_digest_and_automatic_approval_starts_the_implementation() -> None:
    plan_job = job(ChangeStage.PLANNING, state="succeeded", output=PLAN)
    d = decide(change(checks=[{"name": "unit", "command": ["true"]}]), plan_job)
    status = ChangeStatus.model_validate(d.status)
    assert status.plan is not None and status.plan.digest == build_plan_digest(PLAN)
    assert status.approval is not None and status.approval.by == AUTOMATIC_APPROVER
    assert cond(d, "Planned") == ("True", "PlanReady")
    assert cond(d, "Approved") == ("True", "ApprovedAutomatically")
    assert cond(d, "Implemented") == ("Unknown", "StageRunning")
    assert d.create is not None and d.create["metadata"]["name"] == "fix-impl-1"
    spec = d.create["spec"]
    assert spec["jobKind"] == "change-implementation"
    assert spec["checks"] == [{"name": "unit", "command": ["true"], "timeoutSeconds": 300}]
    assert f"## Plan (digest {status.plan.digest})" in spec["request"]["prompt"]
    assert "## Review findings" not in spec["request"]["prompt"]
    assert {a["spec"]["action"] for a in d.audits} == {"ChangePlanned", "ChangeApproved"}
    planned = next(a for a in d.audits if a["spec"]["action"] == "ChangePlanned")
    assert planned["spec"]["details"]["planDigest"] == status.plan.digest
    # The same decision after the status was written records nothing again.
    again = decide(advance(change(), d), plan_job)
    assert again.audits == []


def test_the_plan_digest_depends_on_every_part_of_the_plan() -> None:
    base = build_plan_digest(PLAN)
    assert base.startswith("sha256:") and len(base) == 71
    assert build_plan_digest({**PLAN, "summary": "other"}) != base
    assert build_plan_digest({**PLAN, "risks": ["r"]}) != base
    assert build_plan_digest(dict(reversed(list(PLAN.items())))) == base


# -- the approval gate ----------------------------------------------------------------


def test_a_manual_change_stops_at_planned_until_its_plan_is_approved() -> None:
    plan_job = job(ChangeStage.PLANNING, state="succeeded", output=PLAN)
    d = decide(change(approval="Manual"), plan_job)
    assert cond(d, "Planned") == ("True", "PlanReady")
    assert cond(d, "Approved") == ("False", "AwaitingApproval")
    assert cond(d, "Ready") == ("False", "AwaitingApproval")
    assert "kubectl helmhive change approve fix" in find_condition(d.status["conditions"], "Ready")["message"]  # type: ignore[index]
    assert d.create is None and not d.finished


def test_an_approval_of_another_plan_digest_does_not_count() -> None:
    plan_job = job(ChangeStage.PLANNING, state="succeeded", output=PLAN)
    stale = {"digest": "sha256:" + "0" * 64, "by": "alice"}
    d = decide(change(approval="Manual", approvedPlan=stale), plan_job)
    assert cond(d, "Approved") == ("False", "ApprovalDigestMismatch")
    assert d.create is None and "approval" not in d.status


def test_an_approval_of_the_current_digest_starts_the_implementation_and_is_audited_with_the_approver() -> None:
    plan_job = job(ChangeStage.PLANNING, state="succeeded", output=PLAN)
    digest = build_plan_digest(PLAN)
    d = decide(change(approval="Manual", approvedPlan={"digest": digest, "by": "alice"}), plan_job)
    assert cond(d, "Approved") == ("True", "ApprovedManually")
    assert d.status["approval"]["by"] == "alice" and d.status["approval"]["digest"] == digest
    approved = next(a for a in d.audits if a["spec"]["action"] == "ChangeApproved")
    assert approved["spec"]["actor"]["username"] == "alice"
    assert approved["spec"]["details"]["planDigest"] == digest
    assert d.create is not None and d.create["metadata"]["name"] == "fix-impl-1"


# -- implementation and checks ----------------------------------------------------------


def planned(**spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    obj = change(**spec)
    plan_job = job(ChangeStage.PLANNING, state="succeeded", output=PLAN, provider="openai")
    return advance(obj, decide(obj, plan_job)), plan_job


@pytest.mark.parametrize("reason", ["NoChanges", "PatchTooLarge", "CommitNotFound", "SourceAuthFailed", "TimedOut"])
def test_a_failed_implementation_ends_the_change_with_the_jobs_reason_and_name(reason: str) -> None:
    obj, plan_job = planned()
    d = decide(obj, plan_job, job(ChangeStage.IMPLEMENTATION, state="failed", reason=reason))
    assert cond(d, "Implemented") == ("False", reason)
    assert cond(d, "Ready") == ("False", "ImplementationFailed")
    assert "fix-impl-1" in find_condition(d.status["conditions"], "Ready")["message"]  # type: ignore[index]
    assert d.finished and d.create is None


def test_an_implementation_that_succeeded_without_a_patch_is_refused() -> None:
    obj, plan_job = planned()
    d = decide(obj, plan_job, job(ChangeStage.IMPLEMENTATION, state="succeeded", patch=False))
    assert cond(d, "Implemented") == ("False", "InvalidStageOutput")


def test_a_finished_implementation_records_patch_and_evidence_and_queues_a_review_with_them() -> None:
    obj, plan_job = planned(checks=[{"name": "unit", "command": ["true"]}, {"name": "lint", "command": ["x"]}])
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[passed("unit"), failed("lint")])
    d = decide(obj, plan_job, impl)
    assert cond(d, "Implemented") == ("True", "PatchReady")
    assert cond(d, "Checked") == ("False", "ChecksFailed")
    assert d.status["patch"]["sha256"] == SHA
    assert [c["outcome"] for c in d.status["checkEvidence"]] == ["Passed", "Failed"]
    assert d.create is not None and d.create["metadata"]["name"] == "fix-review-1"
    spec = d.create["spec"]
    assert spec["jobKind"] == "change-review" and spec["patch"]["sha256"] == SHA
    assert spec["change"]["iteration"] == 1
    prompt = spec["request"]["prompt"]
    assert "- check unit: Passed exit=0" in prompt and "- check lint: Failed exit=1" in prompt and "  boom" in prompt
    implemented = next(a for a in d.audits if a["spec"]["action"] == "ChangeImplemented")
    assert implemented["spec"]["details"]["patchSha256"] == SHA
    assert implemented["spec"]["details"]["check.lint"] == "Failed"


def test_each_stage_records_the_job_pod_it_ran_in_and_a_malformed_one_is_left_out() -> None:
    obj, plan_job = planned()
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[passed("unit")])
    impl["status"]["result"]["jobPod"] = {"name": "helmhive-job-x7k2p", "warm": True}
    d = decide(obj, plan_job, impl)
    pods = {j["stage"]: j.get("pod") for j in d.status["jobs"]}
    assert pods == {"planning": None, "implementation": "helmhive-job-x7k2p"}
    impl["status"]["result"]["jobPod"] = {"name": "x" * 254}
    assert view_stage_job(impl) is not None and view_stage_job(impl).pod is None  # type: ignore[union-attr]


def test_no_declared_checks_is_its_own_reason() -> None:
    obj, plan_job = planned()
    d = decide(obj, plan_job, job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[]))
    assert cond(d, "Checked") == ("True", "NoChecks")
    assert "No checks were declared." in d.create["spec"]["request"]["prompt"]  # type: ignore[index]


# -- review and iterations --------------------------------------------------------------


def test_an_approving_review_on_another_provider_makes_the_change_ready() -> None:
    obj, plan_job = planned(checks=[{"name": "unit", "command": ["true"]}])
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[passed()], provider="anthropic")
    rev = job(ChangeStage.REVIEW, state="succeeded", output=review("approve"), provider="openai")
    d = decide(obj, plan_job, impl, rev)
    assert cond(d, "Reviewed") == ("True", "ReviewApproved")
    assert cond(d, "Ready") == ("True", "ReviewApproved")
    assert d.status["review"]["providerDiffers"] is True
    assert d.status["review"]["implementationProvider"] == "anthropic"
    assert d.status["review"]["criteria"] == [{"criterion": 0, "met": True, "note": ""}]
    assert d.finished and d.create is None
    assert [j["name"] for j in d.status["jobs"]] == ["fix-plan", "fix-impl-1", "fix-review-1"]
    assert [j.get("outcome") for j in d.status["jobs"]] == ["Completed"] * 3
    reviewed = next(a for a in d.audits if a["spec"]["action"] == "ChangeReviewed")
    assert reviewed["spec"]["details"]["verdict"] == "approve"
    assert reviewed["spec"]["details"]["providerDiffers"] == "true"


def test_a_review_on_the_same_provider_says_so() -> None:
    obj, plan_job = planned()
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[], provider="anthropic")
    rev = job(ChangeStage.REVIEW, state="succeeded", output=review("approve"), provider="anthropic")
    d = decide(obj, plan_job, impl, rev)
    assert d.status["review"]["providerDiffers"] is False
    assert cond(d, "Ready") == ("True", "ReviewApproved")


def test_an_approving_review_with_failing_checks_is_not_ready() -> None:
    obj, plan_job = planned(checks=[{"name": "unit", "command": ["false"]}])
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[failed()])
    rev = job(ChangeStage.REVIEW, state="succeeded", output=review("approve"))
    d = decide(obj, plan_job, impl, rev)
    assert cond(d, "Reviewed") == ("True", "ReviewApproved")
    assert cond(d, "Ready") == ("False", "ChecksFailed") and d.finished


def test_request_changes_with_no_iterations_left_ends_the_change() -> None:
    obj, plan_job = planned()
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[])
    rev = job(ChangeStage.REVIEW, state="succeeded", output=review("request-changes"))
    d = decide(obj, plan_job, impl, rev)
    assert cond(d, "Reviewed") == ("False", "ChangesRequested")
    assert cond(d, "Ready") == ("False", "ChangesRequested")
    assert d.finished and d.create is None


def test_request_changes_starts_a_fresh_iteration_with_the_findings_then_approve_finishes() -> None:
    obj, plan_job = planned(maxIterations=2)
    impl1 = job(ChangeStage.IMPLEMENTATION, 1, state="succeeded", checks=[])
    rev1 = job(ChangeStage.REVIEW, 1, state="succeeded", output=review("request-changes"))
    d = decide(obj, plan_job, impl1, rev1)
    assert cond(d, "Reviewed") == ("False", "ChangesRequested")
    assert cond(d, "Implemented") == ("Unknown", "StageRunning")
    assert d.status["iteration"] == 2 and not d.finished
    assert d.create is not None and d.create["metadata"]["name"] == "fix-impl-2"
    assert d.create["spec"]["change"]["iteration"] == 2
    prompt = d.create["spec"]["request"]["prompt"]
    assert "## Review findings to address (from the review of iteration 1)" in prompt
    assert "- [major] m" in prompt and "Criteria not met: 1" in prompt
    obj = advance(obj, d)
    impl2 = job(ChangeStage.IMPLEMENTATION, 2, state="succeeded", checks=[])
    d = decide(obj, plan_job, impl1, rev1, impl2)
    assert d.create is not None and d.create["metadata"]["name"] == "fix-review-2"
    obj = advance(obj, d)
    rev2 = job(ChangeStage.REVIEW, 2, state="succeeded", output=review("approve"))
    d = decide(obj, plan_job, impl1, rev1, impl2, rev2)
    assert cond(d, "Ready") == ("True", "ReviewApproved")
    assert d.status["review"]["iteration"] == 2
    assert len(d.status["jobs"]) == 5


def test_a_failed_review_ends_the_change() -> None:
    obj, plan_job = planned()
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[])
    rev = job(ChangeStage.REVIEW, state="failed", reason="PatchDigestMismatch")
    d = decide(obj, plan_job, impl, rev)
    assert cond(d, "Reviewed") == ("False", "PatchDigestMismatch")
    assert cond(d, "Ready") == ("False", "ReviewFailed")


def test_a_review_without_a_verdict_is_an_invalid_stage_output() -> None:
    obj, plan_job = planned()
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[])
    rev = job(ChangeStage.REVIEW, state="succeeded", output={"summary": "?"})
    assert cond(decide(obj, plan_job, impl, rev), "Reviewed") == ("False", "InvalidStageOutput")


# -- crash-restart and the end ------------------------------------------------------------


def test_every_step_decided_twice_gives_the_same_status_and_at_most_one_create() -> None:
    obj, plan_job = planned(checks=[{"name": "unit", "command": ["true"]}])
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[passed()])
    rev = job(ChangeStage.REVIEW, state="succeeded", output=review("approve"))
    steps = [(plan_job,), (plan_job, impl), (plan_job, impl, rev)]
    for jobs in steps:
        first = decide(obj, *jobs)
        again = decide(obj, *jobs)
        assert first.status == again.status and first.create == again.create
        written = decide(advance(obj, first), *jobs)
        assert written.audits == []  # recorded once, when the status first showed the step
        obj = advance(obj, first)


def test_a_finished_change_never_acts_again_even_if_its_jobs_disappear() -> None:
    obj, plan_job = planned()
    impl = job(ChangeStage.IMPLEMENTATION, state="succeeded", checks=[])
    rev = job(ChangeStage.REVIEW, state="succeeded", output=review("approve"))
    done = advance(obj, decide(obj, plan_job, impl, rev))
    after = decide(done)
    assert after.create is None and after.status == done["status"] and after.finished


def test_a_job_deleted_before_the_change_finished_ends_it_with_job_missing() -> None:
    obj, plan_job = planned()
    impl = job(ChangeStage.IMPLEMENTATION)
    obj = advance(obj, decide(obj, plan_job, impl))
    d = decide(obj, plan_job)
    assert cond(d, "Ready") == ("False", "JobMissing")
    assert d.create is None and d.finished


def test_an_invalid_spec_is_reported_with_its_field_path() -> None:
    obj = change()
    obj["spec"]["source"]["commit"] = "main"
    d = decide(obj)
    assert cond(d, "Ready") == ("False", "InvalidSpec")
    assert "spec.source.commit" in find_condition(d.status["conditions"], "Ready")["message"]  # type: ignore[index]
    assert d.create is None


def test_job_names_are_deterministic_distinct_and_bounded() -> None:
    long = "c" * 253
    names = {build_job_name(long, s, i) for s in ChangeStage for i in (1, 2, 3)}
    assert len(names) == 7  # planning has one name whatever the iteration
    assert all(len(n) <= 200 for n in names)
    assert build_job_name(long, ChangeStage.PLANNING, 1) != build_job_name("c" * 252 + "d", ChangeStage.PLANNING, 1)


def test_a_job_without_a_change_reference_is_not_a_stage_job() -> None:
    assert view_stage_job({"metadata": {"name": "x"}, "spec": {}}) is None


def test_the_stage_prompt_is_bounded() -> None:
    obj = change()
    obj["spec"]["request"]["description"] = "d" * 16000
    obj["spec"]["criteria"] = ["c" * 1024] * 32
    plan_job = job(
        ChangeStage.PLANNING,
        state="succeeded",
        output={"summary": "s" * 4000, "steps": [{"title": "t" * 256, "detail": "x" * 2000}] * 32},
    )
    d = decide(obj, plan_job)
    assert d.create is not None
    assert len(d.create["spec"]["request"]["prompt"]) <= PROMPT_MAX_CHARS

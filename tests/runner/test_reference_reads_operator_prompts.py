"""The reference agent reads the prompts the operator really writes (build_stage_prompt), stage by stage."""

from __future__ import annotations

from helmhive.api.change import ChangeSpec, CriterionVerdict, Finding, PlanStatus, PlanStep, ReviewStatus, ReviewVerdict
from helmhive.api.governed import ChangeStage, CheckEvidence, CheckOutcome
from helmhive.policy.change.prompts import build_stage_prompt
from helmhive.reference_agent.rules import parse_governed

SPEC = ChangeSpec.model_validate(
    {
        "workspace": "shop",
        "request": {
            "title": "Fix refunds",
            "description": "Make refunds idempotent.\nAPPEND-LINE: app.py :: x\n"
            "IF-FINDINGS APPEND-LINE: fixed.txt :: ok",
        },
        "criteria": ["Refunds are idempotent.", "Nothing else changes."],
        "source": {"repository": "git://127.0.0.1:9/shop.git", "commit": "a" * 40},
    }
)
PLAN = PlanStatus(job="p", digest="sha256:" + "1" * 64, summary="s", steps=[PlanStep(title="t")])
REVIEW = ReviewStatus(
    job="r",
    iteration=1,
    verdict=ReviewVerdict.REQUEST_CHANGES,
    findings=[Finding(severity="major", message="check fixed failed")],
    criteria=[CriterionVerdict(criterion=0, met=False)],
)


def test_every_stage_prompt_is_read_with_its_stage_iteration_title_and_criteria() -> None:
    for stage in ChangeStage:
        prompt = build_stage_prompt(change="fix", spec=SPEC, stage=stage, iteration=1, plan=PLAN)
        read = parse_governed(prompt)
        assert read is not None
        assert (read.stage, read.change, read.iteration, read.title) == (stage.value, "fix", 1, "Fix refunds")
        assert read.criteria == ("Refunds are idempotent.", "Nothing else changes.")
        assert [e.path for e in read.edits] == ["app.py", "fixed.txt"]
        assert not read.has_findings


def test_the_second_iteration_carries_findings_the_agent_sees() -> None:
    prompt = build_stage_prompt(
        change="fix", spec=SPEC, stage=ChangeStage.IMPLEMENTATION, iteration=2, plan=PLAN, findings=REVIEW
    )
    read = parse_governed(prompt)
    assert read is not None and read.iteration == 2 and read.has_findings


def test_the_review_prompt_carries_check_outcomes_the_agent_reads() -> None:
    checks = (
        CheckEvidence(name="unit", outcome=CheckOutcome.PASSED, exit_code=0),
        CheckEvidence(name="lint", outcome=CheckOutcome.TIMED_OUT, output_tail="slow\nstill slow"),
    )
    prompt = build_stage_prompt(
        change="fix", spec=SPEC, stage=ChangeStage.REVIEW, iteration=1, plan=PLAN, checks=checks
    )
    read = parse_governed(prompt)
    assert read is not None
    assert [(c.name, c.outcome) for c in read.checks] == [("unit", "Passed"), ("lint", "TimedOut")]

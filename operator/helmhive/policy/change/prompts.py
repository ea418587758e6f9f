"""The request text of a governed change's jobs: the immutable context of each stage. Pure.

A governed job gets no memory; its whole context is written here by the operator into the
job's ``spec.request.prompt`` (immutable once the job exists), in fixed labelled sections:

========================  ==========  ================  ==========
section                   planning    implementation    review
========================  ==========  ================  ==========
change request            yes         yes               yes
confirmed criteria        yes         yes               yes
exact source              yes         yes               yes
plan (with its digest)    --          yes               yes
review findings           --          iteration >= 2    --
check evidence            --          --                yes
========================  ==========  ================  ==========

The patch itself is appended by the reviewer's runner, which rebuilds the patched tree from the
stored patch after checking its digest. Every section is bounded; a section that had to be cut
says so in the text. The first line names the stage, so an agent (and the reference agent's
rules) can tell the stages apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from helmhive.api.change import ChangeSpec, PlanStatus, ReviewStatus
from helmhive.api.governed import ChangeStage, CheckEvidence

__all__ = ["PROMPT_MAX_CHARS", "STAGE_MARKER", "build_stage_prompt"]

PROMPT_MAX_CHARS = 131072
"""The most a governed job's request may hold (the AgentJob schema's bound)."""
STAGE_MARKER = "Governed change stage:"
_SECTION_MAX = {"findings": 16384, "evidence": 40960, "plan": 65536}
_CUT = "\n…[cut: this section was longer than {limit} characters]"


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = _CUT.format(limit=limit)
    return text[: limit - len(marker)] + marker


def _plan(plan: PlanStatus) -> str:
    lines = [f"## Plan (digest {plan.digest})", plan.summary.strip()]
    for index, step in enumerate(plan.steps, start=1):
        lines.append(f"{index}. {step.title}" + (f": {step.detail}" if step.detail else ""))
    lines += [f"Risk: {risk}" for risk in plan.risks]
    return _bounded("\n".join(lines), _SECTION_MAX["plan"])


def _findings(review: ReviewStatus) -> str:
    lines = [f"## Review findings to address (from the review of iteration {review.iteration})"]
    if review.summary:
        lines.append(review.summary.strip())
    for finding in review.findings:
        where = finding.file or ""
        if finding.file and finding.line is not None:
            where += f":{finding.line}"
        lines.append(f"- [{finding.severity}] {where} {finding.message}".replace("  ", " "))
    unmet = [str(c.criterion + 1) for c in review.criteria if not c.met]
    if unmet:
        lines.append(f"Criteria not met: {', '.join(unmet)}")
    return _bounded("\n".join(lines), _SECTION_MAX["findings"])


def _evidence(checks: Sequence[CheckEvidence]) -> str:
    lines = ["## Check evidence"]
    if not checks:
        lines.append("No checks were declared.")
    for check in checks:
        exit_code = "none" if check.exit_code is None else str(check.exit_code)
        lines.append(
            f"- check {check.name}: {check.outcome.value} exit={exit_code} "
            f"duration={check.duration_seconds:.1f}s output-sha256={check.output_sha256 or 'none'}"
        )
        lines += [f"  {line}" for line in check.output_tail.splitlines()[-60:]]
    return _bounded("\n".join(lines), _SECTION_MAX["evidence"])


def build_stage_prompt(
    *,
    change: str,
    spec: ChangeSpec,
    stage: ChangeStage,
    iteration: int,
    plan: PlanStatus | None = None,
    findings: ReviewStatus | None = None,
    checks: Sequence[CheckEvidence] = (),
) -> str:
    """The request text of one stage's job (see the module docstring for what each stage gets)."""
    parts = [
        f"{STAGE_MARKER} {stage.value}",
        f"Change: {change}   Iteration: {iteration}",
        "",
        "## Change request",
        f"Title: {spec.request.title}",
        spec.request.description.strip(),
        "",
        "## Confirmed criteria",
        *(f"{index}. {criterion}" for index, criterion in enumerate(spec.criteria, start=1)),
        "",
        "## Exact source",
        f"Repository: {spec.source.repository}",
        f"Commit: {spec.source.commit}",
        "The runner checked out exactly this commit into your working directory.",
    ]
    if stage is not ChangeStage.PLANNING and plan is not None:
        parts += ["", _plan(plan)]
    if stage is ChangeStage.IMPLEMENTATION and findings is not None:
        parts += ["", _findings(findings)]
    if stage is ChangeStage.REVIEW:
        parts += ["", _evidence(checks)]
        parts += ["", "The patch follows; judge it against each confirmed criterion."]
    return _bounded("\n".join(parts).strip() + "\n", PROMPT_MAX_CHARS)

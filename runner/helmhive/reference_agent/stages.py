"""The reference agent's governed-change stage documents: :func:`build_stage_document` answers a
stage prompt with a plan, an implementation report or a review verdict. Pure; the prompt is read
by :mod:`helmhive.reference_agent.governed`, and :mod:`helmhive.reference_agent.rules`
re-exports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from helmhive.reference_agent.directives import VERDICT_PREFIX
from helmhive.reference_agent.governed import (
    MAX_CRITERIA,
    MAX_EDITS,
    MAX_FINDINGS,
    MAX_STEPS,
    EditOutcome,
    GovernedPrompt,
    Verdict,
    bound_text,
    has_patch,
    patch_files,
    review_reasons,
    verdict_directives,
)

__all__ = ["build_stage_document"]


def build_stage_document(governed: GovernedPrompt, *, edit_results: Sequence[EditOutcome] = ()) -> dict[str, Any]:
    """The stage's answer: a plan, an implementation report or a review. Depends on nothing else,
    so the same prompt (and the same edit results) always gives the same document."""
    if governed.stage == "planning":
        return _plan(governed)
    if governed.stage == "implementation":
        return _implementation(governed, edit_results)
    return _review(governed)


def _title(governed: GovernedPrompt) -> str:
    return bound_text(governed.title or governed.change or "(untitled)", 256)


def _plan(governed: GovernedPrompt) -> dict[str, Any]:
    paths = sorted({e.path for e in governed.edits if not e.problem})
    files = (
        f"Files the request's edit directives touch: {', '.join(paths)}."
        if paths
        else "The request holds no edit directives naming files."
    )
    criteria = governed.criteria[:MAX_STEPS]
    steps = [
        {"title": f"Criterion {i}: {bound_text(text, 200)}", "detail": bound_text(f"Make it hold. {files}", 2000)}
        for i, text in enumerate(criteria, start=1)
    ] or [{"title": "Implement the change request", "detail": bound_text(files, 2000)}]
    concerns = []
    if not governed.criteria:
        concerns.append("no confirmed criteria, so the review has nothing to hold the change to")
    if len(governed.criteria) > MAX_STEPS:
        concerns.append(f"only the first {MAX_STEPS} of {len(governed.criteria)} criteria have a step")
    unsafe = sum(1 for e in governed.edits if e.problem)
    if unsafe:
        concerns.append(f"{unsafe} edit directive(s) in the request will be ignored")
    summary = (
        f'Plan for "{_title(governed)}" (change {governed.change or "-"}): '
        f"{len(steps)} step(s), one per confirmed criterion. {files}"
    )
    return {
        "summary": bound_text(summary, 4000),
        "steps": steps,
        "risks": [bound_text("Risk: " + "; ".join(concerns) + ".", 1000)] if concerns else [],
    }


def _implementation(governed: GovernedPrompt, edit_results: Sequence[EditOutcome]) -> dict[str, Any]:
    changed = sorted({o.edit.path for o in edit_results if o.changed})[:MAX_EDITS]
    applied = sum(1 for o in edit_results if o.changed)
    summary = (
        f'Implemented "{_title(governed)}" (change {governed.change or "-"}, iteration {governed.iteration}) '
        f"from the request's edit directives: {applied} of {len(edit_results)} changed a file; "
        f"{len(changed)} file(s) changed."
    )
    if governed.has_findings:
        summary += " Review findings were present."
    notes = [f"{o.label()}: {o.result}" for o in edit_results] or ["The request holds no edit directives."]
    return {"summary": bound_text(summary, 4000), "filesChanged": changed, "notes": bound_text("\n".join(notes), 4000)}


def _review(governed: GovernedPrompt) -> dict[str, Any]:
    reasons = review_reasons(governed)
    verdict: Verdict = "request-changes" if reasons else "approve"
    findings: list[dict[str, Any]] = [
        {"severity": "major", "message": bound_text(f"Check {c.name} ended {c.outcome}; it must pass.", 1000)}
        for c in governed.checks
        if not c.passed
    ]
    if not has_patch(governed):
        findings.append({"severity": "major", "message": "No patch to review: the patch is missing or empty."})
    findings.extend(
        {"severity": "major", "message": f"The request asks for changes ({VERDICT_PREFIX} {value})."}
        for value in verdict_directives(governed)
    )
    if governed.patch is not None and has_patch(governed):
        files = patch_files(governed.patch)
        listed = f": {', '.join(files)}" if files else ""
        findings.append(
            {"severity": "info", "message": bound_text(f"The patch changes {len(files)} file(s){listed}.", 1000)}
        )
    checks = f"{len(governed.checks)} check(s)" if governed.checks else "no checks were declared"
    summary = (
        f'Approve "{_title(governed)}" (iteration {governed.iteration}): {checks}, all passed.'
        if verdict == "approve"
        else f'Request changes to "{_title(governed)}" (iteration {governed.iteration}): {"; ".join(reasons)}.'
    )
    note = "met: approved" if verdict == "approve" else bound_text(f"not met: {'; '.join(reasons)}", 200)
    return {
        "verdict": verdict,
        "summary": bound_text(summary, 4000),
        "findings": findings[:MAX_FINDINGS],
        "criteria": [
            {"criterion": i, "met": verdict == "approve", "note": note}
            for i in range(min(len(governed.criteria), MAX_CRITERIA))
        ],
    }

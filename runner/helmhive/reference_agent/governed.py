"""The reference agent's governed-change stages (plan, implement, review). Pure.

:func:`parse_governed` reads a stage prompt the operator wrote; :func:`parse_edits` the edit
directives of its change request; :func:`review_reasons` why a review asks for changes. The
stage's document is :mod:`helmhive.reference_agent.stages`'. Applying an edit to disk is
:mod:`helmhive.reference_agent.actions`' job; :mod:`helmhive.reference_agent.rules` re-exports
this module and answers with the document.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from helmhive.reference_agent.directives import (
    EDIT_ACTIONS,
    IF_FINDINGS,
    UNLESS_FINDINGS,
    VERDICT_PREFIX,
    EditAction,
)

Stage = Literal["planning", "implementation", "review"]
Condition = Literal["always", "if-findings", "unless-findings"]
Verdict = Literal["approve", "request-changes"]

STAGES: Final[tuple[Stage, ...]] = ("planning", "implementation", "review")
MAX_EDITS: Final = 256
MAX_WRITE_BYTES: Final = 8 * 1024 * 1024
MAX_PATH: Final = 512
MAX_STEPS: Final = 32
MAX_FINDINGS: Final = 32
MAX_CRITERIA: Final = 32
REQUEST_CHANGES: Final = "request-changes"
REQUEST_CHANGES_ONCE: Final = "request-changes-once"
PASSED: Final = "Passed"

_STAGE_LINE: Final = re.compile(r"^Governed change stage: (planning|implementation|review)\s*$")
_CHANGE_LINE: Final = re.compile(r"^Change: (\S*)\s+Iteration: ([0-9]{1,3})\s*$")
_CRITERION_LINE: Final = re.compile(r"^\s*[0-9]{1,3}\.\s+(.*)$")
_CHECK_LINE: Final = re.compile(r"^- check ([^:\s]{1,63}): (\S+)")
_SIZE: Final = re.compile(r"^[0-9]{1,10}$")
_PATH_PART: Final = re.compile(r"^[A-Za-z0-9._-]{1,255}$")
_HEADINGS: Final = (
    ("request", re.compile(r"^## Change request\s*$")),
    ("criteria", re.compile(r"^## Confirmed criteria\s*$")),
    ("source", re.compile(r"^## Exact source\s*$")),
    ("plan", re.compile(r"^## Plan(?: \(.*\))?\s*$")),
    ("findings", re.compile(r"^## Review findings to address(?: \(.*\))?\s*$")),
    ("checks", re.compile(r"^## Check evidence\s*$")),
    ("patch", re.compile(r"^## Patch(?: \(.*\))?\s*$")),
    ("contract", re.compile(r"^## Output contract\s*$")),
)


@dataclass(frozen=True, slots=True)
class Edit:
    """One edit directive of a change request, as written. ``problem`` is why it is ignored ("" if valid)."""

    action: EditAction
    path: str
    text: str = ""
    """``APPEND-LINE``: the line; ``REPLACE-TEXT``: the old text."""
    new: str = ""
    size: int = 0
    condition: Condition = "always"
    problem: str = ""

    def label(self) -> str:
        prefix = {"always": "", "if-findings": f"{IF_FINDINGS} ", "unless-findings": f"{UNLESS_FINDINGS} "}
        return f"{prefix[self.condition]}{self.action} {bound_text(self.path, 100)}"


@dataclass(frozen=True, slots=True)
class EditOutcome:
    """What became of one edit: whether a file changed, and a short verdict (never file content)."""

    edit: Edit
    changed: bool
    result: str

    def label(self) -> str:
        return self.edit.label()


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    outcome: str

    @property
    def passed(self) -> bool:
        return self.outcome == PASSED


@dataclass(frozen=True, slots=True)
class GovernedPrompt:
    """What a governed-change prompt says, read from its fixed marker lines and sections."""

    stage: Stage
    change: str = ""
    iteration: int = 1
    title: str = ""
    criteria: tuple[str, ...] = ()
    has_findings: bool = False
    checks: tuple[CheckResult, ...] = ()
    patch: str | None = None
    """The patch's text (inside its fence); None without a ``## Patch`` section."""
    edits: tuple[Edit, ...] = ()
    verdicts: tuple[str, ...] = ()
    """The ``REVIEW-VERDICT`` values the request holds, in order."""


def parse_governed(prompt: str) -> GovernedPrompt | None:
    """Read a governed-change prompt; None when no line is ``Governed change stage: <stage>``.

    Directives (edits, ``REVIEW-VERDICT``) are read only from the ``## Change request`` section,
    the requester's immutable words; the plan, findings, check output and patch never count.
    """
    lines = prompt.splitlines()
    named = next((m.group(1) for m in map(_STAGE_LINE.match, lines) if m), None)
    stage = next((s for s in STAGES if s == named), None)
    if stage is None:
        return None
    sections = _sections(lines)
    change, iteration = "", 1
    for match in map(_CHANGE_LINE.match, lines):
        if match:
            change, iteration = match.group(1), max(1, int(match.group(2)))
            break
    request = sections.get("request", [])
    title = next((line.removeprefix("Title:").strip() for line in request if line.startswith("Title:")), "")
    return GovernedPrompt(
        stage=stage,
        change=change,
        iteration=iteration,
        title=title,
        criteria=_criteria(sections.get("criteria", [])),
        has_findings="findings" in sections,
        checks=tuple(
            CheckResult(name=m.group(1), outcome=m.group(2))
            for m in map(_CHECK_LINE.match, sections.get("checks", []))
            if m
        ),
        patch=_fenced(sections["patch"]) if "patch" in sections else None,
        edits=parse_edits(request),
        verdicts=tuple(
            line.strip().removeprefix(VERDICT_PREFIX).strip()
            for line in request
            if line.strip().startswith(VERDICT_PREFIX)
        ),
    )


def _sections(lines: Sequence[str]) -> dict[str, list[str]]:
    """The body lines under each known heading, which count only in the operator's order.

    Only ``## Change request`` opens the governed part (the profile's instructions before it may
    hold any heading), and only ``## Confirmed criteria`` ends it (the requester's description may
    hold any heading too). After that a known heading opens its section when it comes later in
    the order than the current one; ``## Output contract`` just closes the current section.
    Anything else, a heading out of order or seen again included, is body text.
    """
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in lines:
        key = next((name for name, pattern in _HEADINGS if pattern.match(line)), None)
        if key is not None and _opens(key, current=current, seen=sections):
            if key == "contract":
                current = None
                continue
            current = key
            sections[key] = []
        elif current is not None:
            sections[current].append(line)
    return sections


def _opens(key: str, *, current: str | None, seen: Mapping[str, object]) -> bool:
    if "request" not in seen:
        return key == "request"
    if current == "request":
        return key == "criteria"
    if key == "contract":
        return True
    order = [name for name, _ in _HEADINGS]
    return all(order.index(key) > order.index(name) for name in seen)


def _criteria(lines: Sequence[str]) -> tuple[str, ...]:
    """Numbered lines, in order; an unnumbered non-blank line continues the criterion above it."""
    found: list[str] = []
    for line in lines:
        match = _CRITERION_LINE.match(line)
        if match:
            found.append(match.group(1).strip())
        elif line.strip() and found:
            found[-1] = f"{found[-1]} {line.strip()}"
    return tuple(found)


def _fenced(lines: Sequence[str]) -> str:
    """The text inside the first fence of a section (the whole section when it has none)."""
    start = next((i for i, line in enumerate(lines) if line.startswith("```")), None)
    if start is None:
        return "\n".join(lines).strip()
    ticks = len(lines[start]) - len(lines[start].lstrip("`"))
    body: list[str] = []
    for line in lines[start + 1 :]:
        bare = line.strip()
        if bare and bare == "`" * len(bare) and len(bare) >= ticks:
            break
        body.append(line)
    return "\n".join(body)


def parse_edits(lines: Sequence[str]) -> tuple[Edit, ...]:
    """The edit directives among ``lines``, in order, each with the reason it is ignored, if any.

    Grammar (leading blanks ignored; an optional ``IF-FINDINGS `` or ``UNLESS-FINDINGS `` first):
    ``APPEND-LINE: <path> :: <text>``, ``REPLACE-TEXT: <path> :: <old> => <new>``,
    ``DELETE-FILE: <path>`` and ``WRITE-BYTES: <path> :: <n>``.
    """
    edits: list[Edit] = []
    for raw in lines:
        edit = _parse_edit(raw.strip())
        if edit is None:
            continue
        if len(edits) >= MAX_EDITS and not edit.problem:
            edit = _with_problem(edit, f"ignored (more than {MAX_EDITS} directives)")
        edits.append(edit)
    return tuple(edits)


def _parse_edit(line: str) -> Edit | None:
    condition: Condition = "always"
    if line.startswith(f"{IF_FINDINGS} "):
        line, condition = line.removeprefix(f"{IF_FINDINGS} ").lstrip(), "if-findings"
    elif line.startswith(f"{UNLESS_FINDINGS} "):
        line, condition = line.removeprefix(f"{UNLESS_FINDINGS} ").lstrip(), "unless-findings"
    action = next((a for a in EDIT_ACTIONS if line.startswith(f"{a}:")), None)
    if action is None:
        return None
    rest = line.removeprefix(f"{action}:")
    if action == "DELETE-FILE":
        return _checked(Edit(action=action, path=rest.strip(), condition=condition))
    raw_path, sep, argument = rest.partition("::")
    path, argument = raw_path.strip(), argument.strip()
    edit = Edit(action=action, path=path, condition=condition)
    if not sep:
        return _with_problem(edit, "ignored (malformed: no ' :: ')")
    if action == "APPEND-LINE":
        return _checked(Edit(action=action, path=path, text=argument, condition=condition))
    if action == "REPLACE-TEXT":
        old, arrow, new = argument.partition("=>")
        if not arrow or not old.strip():
            return _with_problem(edit, "ignored (malformed: expected '<old> => <new>')")
        return _checked(Edit(action=action, path=path, text=old.strip(), new=new.strip(), condition=condition))
    if not _SIZE.match(argument) or int(argument) > MAX_WRITE_BYTES:
        return _with_problem(edit, f"ignored (size must be 0 to {MAX_WRITE_BYTES})")
    return _checked(Edit(action=action, path=path, size=int(argument), condition=condition))


def _checked(edit: Edit) -> Edit:
    return edit if safe_relpath(edit.path) else _with_problem(edit, "ignored (unsafe path)")


def _with_problem(edit: Edit, problem: str) -> Edit:
    return Edit(action=edit.action, path=edit.path, condition=edit.condition, problem=problem)


def safe_relpath(path: str) -> bool:
    """A relative path of components ``[A-Za-z0-9._-]``: no ``.``, ``..`` or ``.git``, not absolute."""
    if not path or len(path) > MAX_PATH or path.startswith("/"):
        return False
    return all(
        _PATH_PART.match(part) and part not in (".", "..") and part.lower() != ".git" for part in path.split("/")
    )


def edit_skip_reason(edit: Edit, *, has_findings: bool) -> str | None:
    """Why an edit is not applied (its problem, or an unmet condition); None when it is to be applied."""
    if edit.problem:
        return edit.problem
    if edit.condition == "if-findings" and not has_findings:
        return "skipped (no review findings)"
    if edit.condition == "unless-findings" and has_findings:
        return "skipped (review findings present)"
    return None


def pseudo_random_bytes(path: str, size: int) -> bytes:
    """``WRITE-BYTES`` content: SHAKE-256 of ``helmhive-reference:<path>:<size>``, first byte NUL.

    The NUL makes git treat the file as binary whatever the rest holds.
    """
    data = hashlib.shake_256(f"helmhive-reference:{path}:{size}".encode()).digest(size)
    return b"\0" + data[1:] if size else b""


def review_reasons(governed: GovernedPrompt) -> tuple[str, ...]:
    """Why a review requests changes, in order; empty means approve.

    A check that did not pass, a missing or empty patch, and ``REVIEW-VERDICT: request-changes``
    (every review) or ``REVIEW-VERDICT: request-changes-once`` (iteration 1 only) each count.
    """
    reasons = [f"check {c.name} ended {c.outcome}" for c in governed.checks if not c.passed]
    if not has_patch(governed):
        reasons.append("there is no patch to review")
    reasons.extend(f"the request says {VERDICT_PREFIX} {value}" for value in verdict_directives(governed))
    return tuple(reasons)


def has_patch(governed: GovernedPrompt) -> bool:
    return governed.patch is not None and bool(governed.patch.strip())


def verdict_directives(governed: GovernedPrompt) -> tuple[str, ...]:
    """The request's ``REVIEW-VERDICT`` values that apply to this review, each once."""
    return tuple(
        value
        for value in dict.fromkeys(governed.verdicts)
        if value == REQUEST_CHANGES or (value == REQUEST_CHANGES_ONCE and governed.iteration == 1)
    )


def patch_files(patch: str) -> tuple[str, ...]:
    """The files a git patch changes (``diff --git`` headers, else ``+++``/``---`` lines), sorted."""
    names: set[str] = set()
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            rest = line.removeprefix("diff --git ").rstrip('"')
            cut = max(rest.rfind(" b/"), rest.rfind(' "b/'))
            if cut >= 0:
                names.add(rest[cut:].lstrip(' "')[2:])
    if not names:
        for line in patch.splitlines():
            for prefix in ("+++ b/", "--- a/"):
                if line.startswith(prefix):
                    names.add(line.removeprefix(prefix).split("\t")[0])
    return tuple(sorted(names))


def bound_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"

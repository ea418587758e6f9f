"""The reference agent's deterministic rules: the reply to a prompt, and the import path for all of them.

Everything here is a pure function of its arguments, so the rule documented in
``docs/reference-agent.md`` can be tested without spawning the agent. The rules live by family:
the catalogue and magic prompt lines in :mod:`helmhive.reference_agent.directives`, the output
contract in :mod:`helmhive.reference_agent.contract`, the governed-change stages (plan,
implement, review: which edits a request's directives ask for) in
:mod:`helmhive.reference_agent.governed` and their documents in
:mod:`helmhive.reference_agent.stages`; this module renders the reply (:func:`render_reply`)
and re-exports them. Applying an edit to disk is :mod:`reference_actions`' job.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Final, Literal

from helmhive.reference_agent.contract import (
    find_schema,
    governed_answer,
    minimal_instance,
    structured_answer,
    suggestion_items,
)
from helmhive.reference_agent.directives import (
    ACP_WRITE_PREFIX,
    AGENT_NAME,
    AGENT_TITLE,
    ALLOCATE_PREFIX,
    BEHAVIOURS,
    CONNECT_PREFIX,
    CONTRACT_PREFIX,
    DEFAULT_EFFORT,
    DEFAULT_MODEL,
    DIRECTIVE_PREFIX,
    EDIT_ACTIONS,
    EFFORT_LEVELS,
    EFFORT_OPTION_ID,
    HOME_WRITE_PREFIX,
    IF_FINDINGS,
    INVALID_OUTPUT,
    MAGIC_PREFIXES,
    MAX_ALLOCATE_MIB,
    MAX_OPEN_FILES,
    MAX_PAD,
    MAX_SPAWN,
    MAX_SPIN_SECONDS,
    MAX_SUGGESTION_TEXT,
    MODEL_OPTION_ID,
    MODELS,
    OPEN_FILES_PREFIX,
    PAD_PREFIX,
    READ_PREFIX,
    RESOURCE_ORDER,
    SPAWN_PREFIX,
    SPIN_PREFIX,
    SUGGEST,
    SUGGESTION_KINDS,
    SUGGESTION_SENSITIVITIES,
    TOOL_PREFIX,
    UNLESS_FINDINGS,
    VERDICT_PREFIX,
    WRITE_PREFIX,
    Behaviour,
    Directives,
    EditAction,
    SuggestLine,
    as_behaviour,
    parse_directives,
    parse_suggest_line,
)
from helmhive.reference_agent.governed import (
    MAX_CRITERIA,
    MAX_EDITS,
    MAX_FINDINGS,
    MAX_PATH,
    MAX_STEPS,
    MAX_WRITE_BYTES,
    PASSED,
    REQUEST_CHANGES,
    REQUEST_CHANGES_ONCE,
    STAGES,
    CheckResult,
    Condition,
    Edit,
    EditOutcome,
    GovernedPrompt,
    Stage,
    Verdict,
    edit_skip_reason,
    parse_edits,
    parse_governed,
    patch_files,
    pseudo_random_bytes,
    review_reasons,
    safe_relpath,
)
from helmhive.reference_agent.stages import build_stage_document

__all__ = [
    "ACP_TOOL_KINDS",
    "ACP_WRITE_PREFIX",
    "AGENT_NAME",
    "AGENT_TITLE",
    "ALLOCATE_PREFIX",
    "BEHAVIOURS",
    "CONNECT_PREFIX",
    "CONTRACT_PREFIX",
    "DEFAULT_EFFORT",
    "DEFAULT_MODEL",
    "DIRECTIVE_PREFIX",
    "EDIT_ACTIONS",
    "EFFORT_LEVELS",
    "EFFORT_OPTION_ID",
    "HOME_WRITE_PREFIX",
    "IF_FINDINGS",
    "INVALID_OUTPUT",
    "MAGIC_PREFIXES",
    "MAX_ALLOCATE_MIB",
    "MAX_CRITERIA",
    "MAX_EDITS",
    "MAX_FINDINGS",
    "MAX_OPEN_FILES",
    "MAX_PAD",
    "MAX_PATH",
    "MAX_SPAWN",
    "MAX_SPIN_SECONDS",
    "MAX_STEPS",
    "MAX_SUGGESTION_TEXT",
    "MAX_WRITE_BYTES",
    "MODELS",
    "MODEL_OPTION_ID",
    "OPEN_FILES_PREFIX",
    "PAD_PREFIX",
    "PASSED",
    "READ_PREFIX",
    "REQUEST_CHANGES",
    "REQUEST_CHANGES_ONCE",
    "RESOURCE_ORDER",
    "SPAWN_PREFIX",
    "SPIN_PREFIX",
    "STAGES",
    "SUGGEST",
    "SUGGESTION_KINDS",
    "SUGGESTION_SENSITIVITIES",
    "TOOL_PREFIX",
    "UNLESS_FINDINGS",
    "VERDICT_PREFIX",
    "WRITE_PREFIX",
    "Behaviour",
    "CheckResult",
    "Condition",
    "Directives",
    "Edit",
    "EditAction",
    "EditOutcome",
    "GovernedPrompt",
    "Stage",
    "SuggestLine",
    "ToolKindName",
    "Verdict",
    "as_behaviour",
    "build_stage_document",
    "edit_skip_reason",
    "filler",
    "find_schema",
    "first_content_line",
    "governed_answer",
    "minimal_instance",
    "parse_directives",
    "parse_edits",
    "parse_governed",
    "parse_suggest_line",
    "patch_files",
    "prompt_digest",
    "pseudo_random_bytes",
    "render_reply",
    "review_reasons",
    "safe_relpath",
    "structured_answer",
    "suggestion_items",
    "tool_kind",
]

ToolKindName = Literal["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"]
ACP_TOOL_KINDS: Final[tuple[ToolKindName, ...]] = (
    "read",
    "edit",
    "delete",
    "move",
    "search",
    "execute",
    "think",
    "fetch",
    "switch_mode",
    "other",
)


def tool_kind(tool: str) -> ToolKindName:
    """The ACP tool kind a ``USE-TOOL`` call is sent with: the name itself if it is a kind, else ``other``."""
    for kind in ACP_TOOL_KINDS:
        if kind == tool:
            return kind
    return "other"


def prompt_digest(prompt: str) -> str:
    """The first 16 hex digits of the SHA-256 of the prompt's UTF-8 bytes."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def _is_directive(line: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(MAGIC_PREFIXES)


def first_content_line(prompt: str, limit: int = 120) -> str:
    """The first non-blank, non-directive line of the prompt, cut to ``limit`` characters."""
    for line in prompt.splitlines():
        if line.strip() and not _is_directive(line):
            return line.strip()[:limit]
    return ""


def render_reply(
    prompt: str,
    *,
    turn: int,
    model: str,
    effort: str,
    tool_results: Mapping[str, bool],
    file_results: Mapping[str, str] | None = None,
    acp_file_results: Mapping[str, str] | None = None,
    connect_results: Mapping[int, str] | None = None,
    read_results: Mapping[str, str] | None = None,
    edit_results: Sequence[EditOutcome] = (),
    invalid_output: bool = False,
    home_file_results: Mapping[str, str] | None = None,
    resource_results: Mapping[str, str] | None = None,
    escape_results: Mapping[str, str] | None = None,
) -> str:
    """The reference agent's whole answer to one prompt.

    ``turn`` is the 1-based number of this turn in the session (completed turns so far plus one).
    ``tool_results`` maps each requested tool to whether the client granted it; the other
    results say what became of each file write and connection asked for, and ``edit_results``
    what became of each edit directive of a governed implementation prompt (``home_file_results``
    of each ``WRITE-HOME-FILE``, ``resource_results`` of each resource directive, ``escape_results``
    of each escape attempt: :mod:`helmhive.reference_agent.escapes`). ``invalid_output``
    (or ``REFERENCE-AGENT: invalid-output`` in the prompt) breaks the output contract on purpose.

    A governed-change prompt with a JSON contract is answered with its stage's document
    (:func:`build_stage_document`) instead of the facts.
    """
    directives = parse_directives(prompt)
    invalid = invalid_output or directives.invalid_output
    governed = parse_governed(prompt)
    if governed is not None and directives.json_output:
        document = build_stage_document(governed, edit_results=edit_results)
        answer = governed_answer(document, find_schema(prompt), invalid=invalid)
        return json.dumps(answer, sort_keys=True, separators=(",", ":"))
    lines = prompt.splitlines()
    facts: dict[str, object] = {
        "agent": AGENT_NAME,
        "turn": turn,
        "model": model,
        "effort": effort,
        "promptSha256": prompt_digest(prompt),
        "promptLines": len(lines),
        "promptWords": len(prompt.split()),
        "firstLine": first_content_line(prompt),
        "tools": {name: ("granted" if granted else "denied") for name, granted in tool_results.items()},
    }
    extras = {
        "files": dict(file_results or {}),
        "acpFiles": dict(acp_file_results or {}),
        "connects": {str(port): result for port, result in (connect_results or {}).items()},
        "reads": dict(read_results or {}),
        "homeFiles": dict(home_file_results or {}),
        "resources": dict(resource_results or {}),
        "escapes": dict(escape_results or {}),
        "padding": filler(directives.pad),
    }
    facts.update({key: value for key, value in extras.items() if value})
    if directives.json_output:
        return json.dumps(
            structured_answer(facts, find_schema(prompt), invalid=invalid, suggestions=directives.suggestions),
            sort_keys=True,
            separators=(",", ":"),
        )
    out = [
        f"{AGENT_NAME}: deterministic reference agent, not a model.",
        f"turn={turn} model={model} effort={effort}",
        f"prompt sha256={facts['promptSha256']} lines={facts['promptLines']} words={facts['promptWords']}",
        f"first line: {facts['firstLine']}",
    ]
    out.extend(f"tool {name}: {'granted' if granted else 'denied'}" for name, granted in tool_results.items())
    out.extend(f"file {name}: {result}" for name, result in (file_results or {}).items())
    out.extend(f"acp-file {name}: {result}" for name, result in (acp_file_results or {}).items())
    out.extend(f"connect {port}: {result}" for port, result in (connect_results or {}).items())
    out.extend(f"read {path}: {result}" for path, result in (read_results or {}).items())
    out.extend(f"home-file {name}: {result}" for name, result in (home_file_results or {}).items())
    out.extend(f"resource {key}: {result}" for key, result in (resource_results or {}).items())
    out.extend(f"escape {key}: {result}" for key, result in (escape_results or {}).items())
    out.extend(f"edit {outcome.label()}: {outcome.result}" for outcome in edit_results)
    if directives.pad:
        out.append(filler(directives.pad))
    return "\n".join(out)


def filler(count: int) -> str:
    """``count`` characters of deterministic filler (``PAD-REPLY``)."""
    unit = "helmhive reference padding. "
    return (unit * (count // len(unit) + 1))[:count]

"""What an agent is told, and how its answer is checked against the output contract. Pure.

The prompt has these labelled parts, always in this order:

1. the profile's instructions (the platform team's words);
2. the job's request (title and prompt);
3. the injected memory block, labelled as context and not authority (absent when none);
4. further context sections the runner adds, each starting with its own ``## `` heading
   (a review job's ``## Patch``; absent for other jobs);
5. the output contract: for structured output, the exact JSON Schema the answer must satisfy.

Structured output is one JSON document. The answer may wrap it in a fenced code block; the
first JSON object found is checked with ``jsonschema`` (draft 2020-12). A failed check
allows at most one repair turn (:func:`build_repair_prompt`); a second failure fails the job
with the validation errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from helmhive.api.envelope import OutputContract, OutputFormat
from helmhive.api.job import JobRequest

__all__ = [
    "MAX_REPAIR_TURNS",
    "OutputCheck",
    "build_agent_prompt",
    "build_repair_prompt",
    "check_output",
]

MAX_REPAIR_TURNS = 1
_MAX_ERRORS = 20
_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n```", re.DOTALL)


def build_agent_prompt(
    *,
    instructions: str,
    request: JobRequest,
    memory_context: str,
    contract: OutputContract,
    context_sections: Sequence[str] = (),
) -> str:
    """Return the full prompt for one job; ``context_sections`` go just before the output contract."""
    parts = [
        "## Instructions (from the platform team's profile)",
        instructions.strip() or "(none)",
        "",
        "## Request",
        f"Title: {request.title}" if request.title else "",
        request.prompt.strip(),
    ]
    if memory_context.strip():
        parts += ["", memory_context.strip()]
    for section in context_sections:
        if section.strip():
            parts += ["", section.strip("\n")]
    parts += ["", "## Output contract"]
    if contract.format is OutputFormat.STRUCTURED:
        parts += [
            "OUTPUT-CONTRACT: json",
            "Answer with exactly one JSON document that satisfies this JSON Schema (draft 2020-12).",
            "Put it in a ```json fenced block. Do not add other JSON.",
            "```json",
            json.dumps(contract.json_schema or {"type": "object"}, indent=2, sort_keys=True),
            "```",
        ]
    else:
        parts.append("Answer in plain text.")
    return "\n".join(p for p in parts if p is not None).strip() + "\n"


@dataclass(frozen=True, kw_only=True)
class OutputCheck:
    """The checked answer: the JSON document (structured) and every error found."""

    ok: bool
    document: dict[str, Any] | None
    errors: tuple[str, ...]


def _candidates(text: str) -> list[str]:
    fenced = [m.group(1) for m in _FENCE.finditer(text)]
    return [*fenced, text.strip()]


def check_output(*, text: str, contract: OutputContract) -> OutputCheck:
    """Check an answer against ``contract``; text contracts accept any non-empty answer."""
    if contract.format is OutputFormat.TEXT:
        ok = bool(text.strip())
        return OutputCheck(ok=ok, document=None, errors=() if ok else ("the answer is empty",))
    document: Any = None
    for candidate in _candidates(text):
        try:
            document = json.loads(candidate)
            break
        except ValueError:
            start, end = candidate.find("{"), candidate.rfind("}")
            if 0 <= start < end:
                try:
                    document = json.loads(candidate[start : end + 1])
                    break
                except ValueError:
                    continue
    if not isinstance(document, dict):
        return OutputCheck(ok=False, document=None, errors=("the answer holds no JSON object",))
    validator = Draft202012Validator(contract.json_schema or {"type": "object"})
    errors = sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path])
    messages = tuple(
        f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"[:500] for e in errors[:_MAX_ERRORS]
    )
    return OutputCheck(ok=not messages, document=document, errors=messages)


def build_repair_prompt(*, check: OutputCheck, contract: OutputContract) -> str:
    """The one repair turn: the errors, and the contract again."""
    lines = [
        "Your answer did not satisfy the output contract. Errors:",
        *(f"- {e}" for e in check.errors),
        "",
        "OUTPUT-CONTRACT: json",
        "Answer again with exactly one JSON document, in a ```json fenced block, that satisfies:",
        "```json",
        json.dumps(contract.json_schema or {"type": "object"}, indent=2, sort_keys=True),
        "```",
    ]
    return "\n".join(lines) + "\n"

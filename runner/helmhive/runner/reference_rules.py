"""The reference agent's deterministic rules: catalogue, prompt directives and the reply.

Everything here is a pure function of its arguments, so the rule documented in
``docs/reference-agent.md`` can be tested without spawning the agent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

AGENT_NAME: Final = "helmhive-reference-agent"
AGENT_TITLE: Final = "Helmhive reference agent (deterministic, not a model)"

MODEL_OPTION_ID: Final = "model"
EFFORT_OPTION_ID: Final = "effort"
MODELS: Final = ("reference-small", "reference-large")
DEFAULT_MODEL: Final = "reference-small"
EFFORT_LEVELS: Final = ("low", "medium", "high")
DEFAULT_EFFORT: Final = "medium"

DIRECTIVE_PREFIX: Final = "REFERENCE-AGENT:"
TOOL_PREFIX: Final = "USE-TOOL:"
CONTRACT_PREFIX: Final = "OUTPUT-CONTRACT:"

Behaviour = Literal["normal", "hang", "stall", "crash", "slow"]
BEHAVIOURS: Final[tuple[Behaviour, ...]] = ("normal", "hang", "stall", "crash", "slow")


@dataclass(frozen=True, slots=True)
class Directives:
    """What a prompt asks of the reference agent, read from its magic lines."""

    json_output: bool = False
    tools: tuple[str, ...] = ()
    behaviour: Behaviour | None = None


def as_behaviour(value: str) -> Behaviour | None:
    for behaviour in BEHAVIOURS:
        if behaviour == value:
            return behaviour
    return None


def parse_directives(prompt: str) -> Directives:
    """Read the magic lines of a prompt.

    * ``OUTPUT-CONTRACT: json`` asks for a JSON object reply;
    * ``USE-TOOL: <name>`` asks for a permission to use the tool ``<name>`` (in order, once each);
    * ``REFERENCE-AGENT: hang|stall|crash|slow|normal`` overrides the agent's behaviour for this prompt.

    Prefixes are case-sensitive and must start the line (leading blanks are ignored). Unknown
    behaviours are ignored.
    """
    json_output = False
    tools: list[str] = []
    behaviour: Behaviour | None = None
    for raw in prompt.splitlines():
        line = raw.strip()
        if line.startswith(CONTRACT_PREFIX):
            json_output = json_output or line.removeprefix(CONTRACT_PREFIX).strip().lower() == "json"
        elif line.startswith(TOOL_PREFIX):
            name = line.removeprefix(TOOL_PREFIX).strip()
            if name and name not in tools:
                tools.append(name)
        elif line.startswith(DIRECTIVE_PREFIX):
            behaviour = as_behaviour(line.removeprefix(DIRECTIVE_PREFIX).strip().lower()) or behaviour
    return Directives(json_output=json_output, tools=tuple(tools), behaviour=behaviour)


def prompt_digest(prompt: str) -> str:
    """The first 16 hex digits of the SHA-256 of the prompt's UTF-8 bytes."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def _is_directive(line: str) -> bool:
    stripped = line.strip()
    return stripped.startswith((DIRECTIVE_PREFIX, TOOL_PREFIX, CONTRACT_PREFIX))


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
) -> str:
    """The reference agent's whole answer to one prompt.

    ``turn`` is the 1-based number of this turn in the session (completed turns so far plus one).
    ``tool_results`` maps each requested tool to whether the client granted it.
    """
    directives = parse_directives(prompt)
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
    if directives.json_output:
        return json.dumps(facts, sort_keys=True, separators=(",", ":"))
    out = [
        f"{AGENT_NAME}: deterministic reference agent, not a model.",
        f"turn={turn} model={model} effort={effort}",
        f"prompt sha256={facts['promptSha256']} lines={facts['promptLines']} words={facts['promptWords']}",
        f"first line: {facts['firstLine']}",
    ]
    out.extend(f"tool {name}: {'granted' if granted else 'denied'}" for name, granted in tool_results.items())
    return "\n".join(out)

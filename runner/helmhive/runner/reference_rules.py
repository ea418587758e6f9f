"""The reference agent's deterministic rules: catalogue, prompt directives and the reply.

Everything here is a pure function of its arguments, so the rule documented in
``docs/reference-agent.md`` can be tested without spawning the agent.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

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
WRITE_PREFIX: Final = "WRITE-FILE:"
ACP_WRITE_PREFIX: Final = "ACP-WRITE-FILE:"
CONNECT_PREFIX: Final = "CONNECT:"
READ_PREFIX: Final = "READ-FILE:"
PAD_PREFIX: Final = "PAD-REPLY:"
MAX_PAD: Final = 1_000_000
INVALID_OUTPUT: Final = "invalid-output"
MAGIC_PREFIXES: Final = (
    DIRECTIVE_PREFIX,
    TOOL_PREFIX,
    CONTRACT_PREFIX,
    ACP_WRITE_PREFIX,
    WRITE_PREFIX,
    CONNECT_PREFIX,
    READ_PREFIX,
    PAD_PREFIX,
)
_FENCE: Final = re.compile(r"```json\s*\n(.*?)\n```", re.DOTALL)
_SAFE_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

Behaviour = Literal["normal", "hang", "stall", "crash", "slow"]
BEHAVIOURS: Final[tuple[Behaviour, ...]] = ("normal", "hang", "stall", "crash", "slow")


@dataclass(frozen=True, slots=True)
class Directives:
    """What a prompt asks of the reference agent, read from its magic lines."""

    json_output: bool = False
    tools: tuple[str, ...] = ()
    behaviour: Behaviour | None = None
    invalid_output: bool = False
    write_files: tuple[str, ...] = ()
    acp_write_files: tuple[str, ...] = ()
    connects: tuple[int, ...] = ()
    read_files: tuple[str, ...] = ()
    pad: int = 0


def as_behaviour(value: str) -> Behaviour | None:
    for behaviour in BEHAVIOURS:
        if behaviour == value:
            return behaviour
    return None


def parse_directives(prompt: str) -> Directives:
    """Read the magic lines of a prompt.

    * ``OUTPUT-CONTRACT: json`` asks for a JSON object reply;
    * ``USE-TOOL: <name>`` asks for a permission to use the tool ``<name>`` (in order, once each);
    * ``REFERENCE-AGENT: hang|stall|crash|slow|normal`` overrides the agent's behaviour for this prompt;
      ``REFERENCE-AGENT: invalid-output`` makes this prompt's answer break the output contract;
    * ``WRITE-FILE: <name>`` writes the file ``<name>`` in the session's cwd itself (a direct write);
    * ``ACP-WRITE-FILE: <name>`` asks the client to write it (ACP ``fs/write_text_file``);
    * ``CONNECT: <port>`` opens a TCP connection to ``127.0.0.1:<port>``;
    * ``READ-FILE: <absolute path>`` reads a file itself and says whether it could (never its content);
    * ``PAD-REPLY: <n>`` appends ``n`` characters of filler to the answer (at most 1,000,000).

    Prefixes are case-sensitive and must start the line (leading blanks are ignored). Unknown
    behaviours, unsafe file names (only ``[A-Za-z0-9._-]``, no path) and bad ports are ignored.
    """
    json_output = invalid = False
    tools: list[str] = []
    writes: list[str] = []
    acp_writes: list[str] = []
    connects: list[int] = []
    reads: list[str] = []
    pad = 0
    behaviour: Behaviour | None = None
    for raw in prompt.splitlines():
        line = raw.strip()
        if line.startswith(CONTRACT_PREFIX):
            json_output = json_output or line.removeprefix(CONTRACT_PREFIX).strip().lower() == "json"
        elif line.startswith(TOOL_PREFIX):
            _add(tools, line.removeprefix(TOOL_PREFIX).strip())
        elif line.startswith(ACP_WRITE_PREFIX):
            _add(acp_writes, _safe_name(line.removeprefix(ACP_WRITE_PREFIX)))
        elif line.startswith(WRITE_PREFIX):
            _add(writes, _safe_name(line.removeprefix(WRITE_PREFIX)))
        elif line.startswith(READ_PREFIX):
            path = line.removeprefix(READ_PREFIX).strip()
            _add(reads, path if path.startswith("/") else "")
        elif line.startswith(PAD_PREFIX):
            count = line.removeprefix(PAD_PREFIX).strip()
            pad = min(int(count), MAX_PAD) if count.isdigit() else pad
        elif line.startswith(CONNECT_PREFIX):
            port = line.removeprefix(CONNECT_PREFIX).strip()
            if port.isdigit() and 0 < int(port) < 65536 and int(port) not in connects:
                connects.append(int(port))
        elif line.startswith(DIRECTIVE_PREFIX):
            value = line.removeprefix(DIRECTIVE_PREFIX).strip().lower()
            invalid = invalid or value == INVALID_OUTPUT
            behaviour = as_behaviour(value) or behaviour
    return Directives(
        json_output=json_output,
        tools=tuple(tools),
        behaviour=behaviour,
        invalid_output=invalid,
        write_files=tuple(writes),
        acp_write_files=tuple(acp_writes),
        connects=tuple(connects),
        read_files=tuple(reads),
        pad=pad,
    )


def _add(items: list[str], value: str) -> None:
    if value and value not in items:
        items.append(value)


def _safe_name(value: str) -> str:
    name = value.strip()
    return name if _SAFE_NAME.match(name) and name not in (".", "..") else ""


def find_schema(prompt: str) -> dict[str, Any] | None:
    """The JSON Schema the prompt asks the answer to satisfy: the first fenced ```json block, after
    the ``OUTPUT-CONTRACT: json`` line, that holds a JSON object; None without one."""
    marker = prompt.find(f"{CONTRACT_PREFIX} json")
    if marker < 0:
        return None
    for match in _FENCE.finditer(prompt, marker):
        try:
            schema = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(schema, dict):
            return schema
    return None


def minimal_instance(schema: Any) -> Any:
    """The smallest deterministic document satisfying the common subset of JSON Schema the
    envelopes use: ``allOf``, ``const``, ``enum``, ``type``, ``required``, ``minItems``,
    ``minLength``/``maxLength`` and ``minimum``. Unknown shapes give ``None``."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            value = minimal_instance(part)
            if isinstance(value, dict):
                merged.update(value)
            elif value is not None:
                return value
        return merged
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    raw_properties = schema.get("properties")
    properties: dict[str, Any] = raw_properties if isinstance(raw_properties, dict) else {}
    if kind == "object" or (kind is None and ("properties" in schema or "required" in schema)):
        return {name: minimal_instance(properties.get(name, {})) for name in schema.get("required", [])}
    if kind == "array":
        return [minimal_instance(schema.get("items", {})) for _ in range(int(schema.get("minItems", 0)))]
    if kind == "string":
        text = "reference answer"
        text = text.ljust(int(schema.get("minLength", 0)), ".")
        return text[: int(schema["maxLength"])] if "maxLength" in schema else text
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return None


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
    invalid_output: bool = False,
) -> str:
    """The reference agent's whole answer to one prompt.

    ``turn`` is the 1-based number of this turn in the session (completed turns so far plus one).
    ``tool_results`` maps each requested tool to whether the client granted it; the other
    results say what became of each file write and connection asked for. ``invalid_output``
    (or ``REFERENCE-AGENT: invalid-output`` in the prompt) breaks the output contract on purpose.
    """
    directives = parse_directives(prompt)
    invalid = invalid_output or directives.invalid_output
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
        "padding": filler(directives.pad),
    }
    facts.update({key: value for key, value in extras.items() if value})
    if directives.json_output:
        return json.dumps(
            _structured(facts, find_schema(prompt), invalid=invalid), sort_keys=True, separators=(",", ":")
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
    if directives.pad:
        out.append(filler(directives.pad))
    return "\n".join(out)


def filler(count: int) -> str:
    """``count`` characters of deterministic filler (``PAD-REPLY``)."""
    unit = "helmhive reference padding. "
    return (unit * (count // len(unit) + 1))[:count]


def _structured(facts: dict[str, object], schema: dict[str, Any] | None, *, invalid: bool) -> object:
    """The JSON answer: the facts, plus the smallest document the prompt's schema accepts.

    With ``invalid``, the schema's required properties are left out (or, when it requires
    none, the answer is no JSON object at all), so a client's contract check must fail.
    """
    if schema is None:
        return facts
    if invalid:
        return facts if _requires_something(schema) else ["not", "an", "object"]
    instance = minimal_instance(schema)
    if not isinstance(instance, dict):
        return facts
    closed = any(part.get("additionalProperties") is False for part in _parts(schema))
    return instance if closed else {**facts, **instance}


def _parts(schema: dict[str, Any]) -> list[dict[str, Any]]:
    nested = schema.get("allOf")
    if isinstance(nested, list):
        return [schema, *(p for part in nested if isinstance(part, dict) for p in _parts(part))]
    return [schema]


def _requires_something(schema: dict[str, Any]) -> bool:
    return any(part.get("required") for part in _parts(schema))

"""The reference agent's deterministic rules: catalogue, prompt directives and the reply.

Everything here is a pure function of its arguments, so the rule documented in
``docs/reference-agent.md`` can be tested without spawning the agent. That includes the
governed-change stages (plan, implement, review): which edits a request's directives ask for
and the stage documents. Applying an edit to disk is :mod:`reference_actions`' job.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from helmhive.runner.reference_escapes import ESCAPE_PREFIXES

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
HOME_WRITE_PREFIX: Final = "WRITE-HOME-FILE:"
ALLOCATE_PREFIX: Final = "ALLOCATE:"
SPIN_PREFIX: Final = "SPIN:"
SPAWN_PREFIX: Final = "SPAWN:"
OPEN_FILES_PREFIX: Final = "OPEN-FILES:"
MAX_ALLOCATE_MIB: Final = 1_048_576
MAX_SPIN_SECONDS: Final = 3600
MAX_SPAWN: Final = 4096
MAX_OPEN_FILES: Final = 65536
RESOURCE_ORDER: Final = ("allocate", "spin", "spawn", "openFiles")
"""The resource directives' keys, in the order they are carried out and reported."""
INVALID_OUTPUT: Final = "invalid-output"
EditAction = Literal["APPEND-LINE", "REPLACE-TEXT", "DELETE-FILE", "WRITE-BYTES"]
EDIT_ACTIONS: Final[tuple[EditAction, ...]] = ("APPEND-LINE", "REPLACE-TEXT", "DELETE-FILE", "WRITE-BYTES")
IF_FINDINGS: Final = "IF-FINDINGS"
UNLESS_FINDINGS: Final = "UNLESS-FINDINGS"
VERDICT_PREFIX: Final = "REVIEW-VERDICT:"
MAGIC_PREFIXES: Final = (
    DIRECTIVE_PREFIX,
    TOOL_PREFIX,
    CONTRACT_PREFIX,
    ACP_WRITE_PREFIX,
    WRITE_PREFIX,
    CONNECT_PREFIX,
    READ_PREFIX,
    PAD_PREFIX,
    HOME_WRITE_PREFIX,
    ALLOCATE_PREFIX,
    SPIN_PREFIX,
    SPAWN_PREFIX,
    OPEN_FILES_PREFIX,
    *(f"{action}:" for action in EDIT_ACTIONS),
    f"{IF_FINDINGS} ",
    f"{UNLESS_FINDINGS} ",
    VERDICT_PREFIX,
    *ESCAPE_PREFIXES,
)
_FENCE: Final = re.compile(r"```json\s*\n(.*?)\n```", re.DOTALL)
_SAFE_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

Behaviour = Literal["normal", "hang", "stall", "crash", "crash-once", "slow"]
BEHAVIOURS: Final[tuple[Behaviour, ...]] = ("normal", "hang", "stall", "crash", "crash-once", "slow")


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
    home_files: tuple[str, ...] = ()
    allocate_mib: int = 0
    spin_seconds: int = 0
    spawn: int = 0
    open_files: int = 0

    def resources(self) -> dict[str, int]:
        """The resource directives asked for, by key in :data:`RESOURCE_ORDER` (0: not asked)."""
        asked = {
            "allocate": self.allocate_mib,
            "spin": self.spin_seconds,
            "spawn": self.spawn,
            "openFiles": self.open_files,
        }
        return {key: asked[key] for key in RESOURCE_ORDER if asked[key]}


def as_behaviour(value: str) -> Behaviour | None:
    for behaviour in BEHAVIOURS:
        if behaviour == value:
            return behaviour
    return None


def parse_directives(prompt: str) -> Directives:
    """Read the magic lines of a prompt.

    * ``OUTPUT-CONTRACT: json`` asks for a JSON object reply;
    * ``USE-TOOL: <name>`` asks for a permission to use the tool ``<name>`` (in order, once each);
    * ``REFERENCE-AGENT: hang|stall|crash|crash-once|slow|normal`` overrides the agent's behaviour for
      this prompt (``crash-once`` crashes only while no earlier crash-once left its mark in ``$HOME``);
      ``REFERENCE-AGENT: invalid-output`` makes this prompt's answer break the output contract;
    * ``WRITE-FILE: <name>`` writes the file ``<name>`` in the session's cwd itself (a direct write);
    * ``ACP-WRITE-FILE: <name>`` asks the client to write it (ACP ``fs/write_text_file``);
    * ``CONNECT: <port>`` opens a TCP connection to ``127.0.0.1:<port>``;
    * ``READ-FILE: <absolute path>`` reads a file itself and says whether it could (never its content);
    * ``PAD-REPLY: <n>`` appends ``n`` characters of filler to the answer (at most 1,000,000);
    * ``WRITE-HOME-FILE: <name>`` writes the file ``<name>`` in its ``$HOME`` itself;
    * ``ALLOCATE: <MiB>``, ``SPIN: <seconds>``, ``SPAWN: <n>``, ``OPEN-FILES: <n>`` use that much
      memory, CPU time, processes or open files (see :data:`RESOURCE_ORDER`; the last value wins).

    Prefixes are case-sensitive and must start the line (leading blanks are ignored). Unknown
    behaviours, unsafe file names (only ``[A-Za-z0-9._-]``, no path) and bad ports are ignored.
    """
    json_output = invalid = False
    tools: list[str] = []
    writes: list[str] = []
    acp_writes: list[str] = []
    connects: list[int] = []
    reads: list[str] = []
    homes: list[str] = []
    pad = 0
    amounts = {ALLOCATE_PREFIX: 0, SPIN_PREFIX: 0, SPAWN_PREFIX: 0, OPEN_FILES_PREFIX: 0}
    bounds = {
        ALLOCATE_PREFIX: MAX_ALLOCATE_MIB,
        SPIN_PREFIX: MAX_SPIN_SECONDS,
        SPAWN_PREFIX: MAX_SPAWN,
        OPEN_FILES_PREFIX: MAX_OPEN_FILES,
    }
    behaviour: Behaviour | None = None
    for raw in prompt.splitlines():
        line = raw.strip()
        amount = next((prefix for prefix in amounts if line.startswith(prefix)), None)
        if amount is not None:
            value = line.removeprefix(amount).strip()
            amounts[amount] = min(int(value), bounds[amount]) if value.isdigit() else amounts[amount]
        elif line.startswith(HOME_WRITE_PREFIX):
            _add(homes, _safe_name(line.removeprefix(HOME_WRITE_PREFIX)))
        elif line.startswith(CONTRACT_PREFIX):
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
        home_files=tuple(homes),
        allocate_mib=amounts[ALLOCATE_PREFIX],
        spin_seconds=amounts[SPIN_PREFIX],
        spawn=amounts[SPAWN_PREFIX],
        open_files=amounts[OPEN_FILES_PREFIX],
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
    of each escape attempt: :mod:`helmhive.runner.reference_escapes`). ``invalid_output``
    (or ``REFERENCE-AGENT: invalid-output`` in the prompt) breaks the output contract on purpose.

    A governed-change prompt with a JSON contract is answered with its stage's document
    (:func:`build_stage_document`) instead of the facts.
    """
    directives = parse_directives(prompt)
    invalid = invalid_output or directives.invalid_output
    governed = parse_governed(prompt)
    if governed is not None and directives.json_output:
        document = build_stage_document(governed, edit_results=edit_results)
        answer = _governed_answer(document, find_schema(prompt), invalid=invalid)
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


# -- governed change: plan, implement, review ----------------------------------------------------

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
        return f"{prefix[self.condition]}{self.action} {_bound(self.path, 100)}"


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
    if not _has_patch(governed):
        reasons.append("there is no patch to review")
    reasons.extend(f"the request says {VERDICT_PREFIX} {value}" for value in _verdict_directives(governed))
    return tuple(reasons)


def _has_patch(governed: GovernedPrompt) -> bool:
    return governed.patch is not None and bool(governed.patch.strip())


def _verdict_directives(governed: GovernedPrompt) -> tuple[str, ...]:
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


def build_stage_document(governed: GovernedPrompt, *, edit_results: Sequence[EditOutcome] = ()) -> dict[str, Any]:
    """The stage's answer: a plan, an implementation report or a review. Depends on nothing else,
    so the same prompt (and the same edit results) always gives the same document."""
    if governed.stage == "planning":
        return _plan(governed)
    if governed.stage == "implementation":
        return _implementation(governed, edit_results)
    return _review(governed)


def _title(governed: GovernedPrompt) -> str:
    return _bound(governed.title or governed.change or "(untitled)", 256)


def _plan(governed: GovernedPrompt) -> dict[str, Any]:
    paths = sorted({e.path for e in governed.edits if not e.problem})
    files = (
        f"Files the request's edit directives touch: {', '.join(paths)}."
        if paths
        else "The request holds no edit directives naming files."
    )
    criteria = governed.criteria[:MAX_STEPS]
    steps = [
        {"title": f"Criterion {i}: {_bound(text, 200)}", "detail": _bound(f"Make it hold. {files}", 2000)}
        for i, text in enumerate(criteria, start=1)
    ] or [{"title": "Implement the change request", "detail": _bound(files, 2000)}]
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
        "summary": _bound(summary, 4000),
        "steps": steps,
        "risks": [_bound("Risk: " + "; ".join(concerns) + ".", 1000)] if concerns else [],
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
    return {"summary": _bound(summary, 4000), "filesChanged": changed, "notes": _bound("\n".join(notes), 4000)}


def _review(governed: GovernedPrompt) -> dict[str, Any]:
    reasons = review_reasons(governed)
    verdict: Verdict = "request-changes" if reasons else "approve"
    findings: list[dict[str, Any]] = [
        {"severity": "major", "message": _bound(f"Check {c.name} ended {c.outcome}; it must pass.", 1000)}
        for c in governed.checks
        if not c.passed
    ]
    if not _has_patch(governed):
        findings.append({"severity": "major", "message": "No patch to review: the patch is missing or empty."})
    findings.extend(
        {"severity": "major", "message": f"The request asks for changes ({VERDICT_PREFIX} {value})."}
        for value in _verdict_directives(governed)
    )
    if governed.patch is not None and _has_patch(governed):
        files = patch_files(governed.patch)
        listed = f": {', '.join(files)}" if files else ""
        findings.append(
            {"severity": "info", "message": _bound(f"The patch changes {len(files)} file(s){listed}.", 1000)}
        )
    checks = f"{len(governed.checks)} check(s)" if governed.checks else "no checks were declared"
    summary = (
        f'Approve "{_title(governed)}" (iteration {governed.iteration}): {checks}, all passed.'
        if verdict == "approve"
        else f'Request changes to "{_title(governed)}" (iteration {governed.iteration}): {"; ".join(reasons)}.'
    )
    note = "met: approved" if verdict == "approve" else _bound(f"not met: {'; '.join(reasons)}", 200)
    return {
        "verdict": verdict,
        "summary": _bound(summary, 4000),
        "findings": findings[:MAX_FINDINGS],
        "criteria": [
            {"criterion": i, "met": verdict == "approve", "note": note}
            for i in range(min(len(governed.criteria), MAX_CRITERIA))
        ],
    }


def _governed_answer(document: dict[str, Any], schema: dict[str, Any] | None, *, invalid: bool) -> object:
    """A stage document plus ``agent``, over the smallest document the schema needs; a closed
    schema keeps only its own properties. ``invalid`` leaves the stage document out."""
    base: dict[str, Any] = {"agent": AGENT_NAME}
    if schema is None:
        return {**base, **document}
    if invalid:
        return base if _requires_something(schema) else ["not", "an", "object"]
    instance = minimal_instance(schema)
    answer = {**(instance if isinstance(instance, dict) else {}), **base, **document}
    parts = _parts(schema)
    if any(part.get("additionalProperties") is False for part in parts):
        allowed = {name for part in parts if isinstance(part.get("properties"), dict) for name in part["properties"]}
        answer = {key: value for key, value in answer.items() if key in allowed}
    return answer


def _bound(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""The reference agent's magic prompt lines: the catalogue's names, every directive prefix, and
:func:`parse_directives`, which reads a prompt's directives into :class:`Directives`. Pure.

The rule each line follows is documented in ``docs/reference-agent.md``; the output contract is
:mod:`helmhive.reference_agent.contract`'s, the governed-change stages
:mod:`helmhive.reference_agent.governed`'s, and the reply :mod:`helmhive.reference_agent.rules`',
which re-exports all of these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from helmhive.reference_agent.escapes import ESCAPE_PREFIXES

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
SUGGEST: Final = "suggest"
SUGGESTION_KINDS: Final = ("decision", "constraint")
SUGGESTION_SENSITIVITIES: Final = ("public", "internal", "confidential", "restricted")
MAX_SUGGESTION_TEXT: Final = 2000
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
_SAFE_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

Behaviour = Literal["normal", "hang", "stall", "crash", "crash-once", "slow"]
BEHAVIOURS: Final[tuple[Behaviour, ...]] = ("normal", "hang", "stall", "crash", "crash-once", "slow")


@dataclass(frozen=True, slots=True)
class SuggestLine:
    """One ``REFERENCE-AGENT: suggest`` line: a suggested memory record, as the prompt spelled it."""

    kind: str
    service: str | None
    """The scope: a service's name, or None for the workspace."""
    sensitivity: str
    text: str
    name: str | None = None


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
    suggestions: tuple[SuggestLine, ...] = ()

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
      memory, CPU time, processes or open files (see :data:`RESOURCE_ORDER`; the last value wins);
    * ``REFERENCE-AGENT: suggest <kind> <scope> <sensitivity> [name=<name>] <text>`` is one suggested
      memory record (:func:`parse_suggest_line`), in order; a malformed one is ignored.

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
    suggestions: list[SuggestLine] = []
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
        elif line.startswith(DIRECTIVE_PREFIX) and _is_suggest(line):
            suggestion = parse_suggest_line(line)
            if suggestion is not None:
                suggestions.append(suggestion)
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
        suggestions=tuple(suggestions),
    )


def _is_suggest(line: str) -> bool:
    words = line.removeprefix(DIRECTIVE_PREFIX).split(maxsplit=1)
    return bool(words) and words[0] == SUGGEST


def parse_suggest_line(line: str) -> SuggestLine | None:
    """Read ``REFERENCE-AGENT: suggest <kind> <scope> <sensitivity> [name=<name>] <text>``; None if malformed.

    ``<kind>`` is one of :data:`SUGGESTION_KINDS`, ``<scope>`` is ``workspace`` or
    ``service:<name>``, ``<sensitivity>`` one of :data:`SUGGESTION_SENSITIVITIES`; the optional
    ``name=<name>`` names the record (names are DNS labels); ``<text>`` is the rest of the line,
    trimmed: not empty, at most :data:`MAX_SUGGESTION_TEXT` characters. Words are separated by
    blanks and are case-sensitive.
    """
    words = line.strip().removeprefix(DIRECTIVE_PREFIX).split(maxsplit=4)
    if len(words) < 5 or words[0] != SUGGEST:
        return None
    _, kind, scope, sensitivity, rest = words
    name: str | None = None
    if rest.startswith("name="):
        first, _, rest = rest.partition(" ")
        name = first.removeprefix("name=")
        if not _DNS_LABEL.match(name):
            return None
    text = rest.strip()
    service = scope.removeprefix("service:") if scope.startswith("service:") else None
    if kind not in SUGGESTION_KINDS or sensitivity not in SUGGESTION_SENSITIVITIES:
        return None
    if scope != "workspace" and (service is None or not _DNS_LABEL.match(service)):
        return None
    if not text or len(text) > MAX_SUGGESTION_TEXT:
        return None
    return SuggestLine(kind=kind, service=service, sensitivity=sensitivity, text=text, name=name)


def _add(items: list[str], value: str) -> None:
    if value and value not in items:
        items.append(value)


def _safe_name(value: str) -> str:
    name = value.strip()
    return name if _SAFE_NAME.match(name) and name not in (".", "..") else ""

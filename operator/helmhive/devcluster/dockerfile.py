"""Reading the project's Dockerfiles: the subset of the syntax they use, parsed into stages.

:mod:`helmhive.devcluster.rootfs` builds an image's filesystem by carrying out these stages
without a Docker engine, so the Dockerfile stays the one description of the image. Only what
``images/*/Dockerfile`` use is understood; anything else is refused with the line number, so a
new instruction cannot be silently skipped by the proof (fail closed):

- ``ARG`` (before the first ``FROM``, and in a stage), ``FROM image [AS name]``;
- ``RUN`` in shell form (``--mount`` and other flags are refused);
- ``COPY [--from=stage] src... dest``; ``ENV``, ``USER``, ``WORKDIR``, ``ENTRYPOINT``/``CMD``
  in exec form, ``LABEL``. ``$VAR`` and ``${VAR}`` are substituted where Docker substitutes them.

It also matches ``.dockerignore`` patterns. This module does no I/O.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field

__all__ = [
    "DockerfileError",
    "Instruction",
    "Stage",
    "build_ignore_rules",
    "decide_ignored",
    "decide_stage_order",
    "parse_dockerfile",
    "substitute",
]

_KNOWN = {"ARG", "FROM", "RUN", "COPY", "ENV", "USER", "WORKDIR", "ENTRYPOINT", "CMD", "LABEL"}
_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


class DockerfileError(ValueError):
    """A Dockerfile this reader does not understand; the message names the line."""


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass
class Stage:
    """One ``FROM`` and its instructions; ``base`` has the global ARGs substituted."""

    index: int
    base: str
    name: str | None
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return self.name or str(self.index)


def substitute(text: str, values: dict[str, str]) -> str:
    """Docker's ``$VAR``/``${VAR}`` substitution (unknown names become empty, as in Docker)."""
    return _VAR.sub(lambda m: values.get(m.group("braced") or m.group("plain"), ""), text)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append((start, pending + stripped))
        pending = ""
    if pending:
        raise DockerfileError(f"line {start}: the file ends inside a continued instruction")
    return lines


def parse_dockerfile(text: str, build_args: dict[str, str] | None = None) -> tuple[dict[str, str], list[Stage]]:
    """Parse ``text``: (the global ARGs with their values, the stages in order)."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, line in _logical_lines(text):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = args.strip()
        if keyword not in _KNOWN:
            raise DockerfileError(f"line {number}: {keyword} is not supported by the rootfs builder")
        if keyword == "FROM":
            parts = args.split()
            if len(parts) not in (1, 3) or (len(parts) == 3 and parts[1].upper() != "AS"):
                raise DockerfileError(f"line {number}: expected FROM <image> [AS <name>], got {args!r}")
            base = substitute(parts[0], global_args)
            stages.append(Stage(len(stages), base, parts[2] if len(parts) == 3 else None, number))
        elif not stages:
            if keyword != "ARG":
                raise DockerfileError(f"line {number}: only ARG may come before the first FROM")
            name, _, default = args.partition("=")
            global_args[name] = (build_args or {}).get(name, default)
        else:
            if keyword == "RUN" and args.startswith("--"):
                raise DockerfileError(f"line {number}: RUN flags ({args.split()[0]}) are not supported")
            stages[-1].instructions.append(Instruction(number, keyword, args))
    if not stages:
        raise DockerfileError("the Dockerfile has no FROM")
    return global_args, stages


def parse_exec_form(instruction: Instruction) -> list[str]:
    """The JSON array of an ENTRYPOINT or CMD; the shell form is refused."""
    try:
        value = json.loads(instruction.args)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise DockerfileError(f"line {instruction.line}: {instruction.keyword} must be a JSON array of strings")
    return value


def parse_env(instruction: Instruction, values: dict[str, str]) -> dict[str, str]:
    """``ENV a=1 b=2`` (the ``ENV a 1`` form is refused), substituted with ``values``."""
    env: dict[str, str] = {}
    for word in shlex.split(instruction.args):
        name, sep, value = word.partition("=")
        if not sep:
            raise DockerfileError(f"line {instruction.line}: ENV must be written name=value")
        env[name] = substitute(value, {**values, **env})
    return env


def parse_copy(instruction: Instruction) -> tuple[str | None, list[str], str]:
    """``COPY [--from=x] src... dest`` -> (from, sources, dest)."""
    words = instruction.args.split()
    source_stage = None
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if flag.startswith("--from="):
            source_stage = flag.removeprefix("--from=")
        else:
            raise DockerfileError(f"line {instruction.line}: COPY {flag} is not supported")
    if len(words) < 2:
        raise DockerfileError(f"line {instruction.line}: COPY needs a source and a destination")
    return source_stage, words[:-1], words[-1]


def decide_stage_order(stages: list[Stage], target: str) -> list[Stage]:
    """The stages ``target`` needs (through FROM and COPY --from), each once, dependencies first."""
    by_ref = {stage.ref: stage for stage in stages} | {str(stage.index): stage for stage in stages}
    if target not in by_ref:
        raise DockerfileError(f"no stage named {target!r}; stages: {', '.join(s.ref for s in stages)}")
    order: list[Stage] = []

    def visit(stage: Stage, path: tuple[str, ...]) -> None:
        if stage in order:
            return
        if stage.ref in path:
            raise DockerfileError(f"stage {stage.ref!r} depends on itself")
        needs = [stage.base] + [src for src, _, _ in (parse_copy(i) for i in stage.instructions if i.keyword == "COPY")]
        for ref in needs:
            if ref is not None and ref in by_ref and by_ref[ref].index < stage.index:
                visit(by_ref[ref], (*path, stage.ref))
        order.append(stage)

    visit(by_ref[target], ())
    return order


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    exclude: bool


def build_ignore_rules(text: str) -> list[IgnoreRule]:
    """``.dockerignore``: one pattern a line, ``!`` re-includes, ``#`` comments."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        rules.append(IgnoreRule(pattern, exclude))
    return rules


def _matches(pattern: str, path: str) -> bool:
    if pattern.startswith("**/"):
        tail = pattern[3:]
        parts = path.split("/")
        return any(fnmatch.fnmatchcase("/".join(parts[i:]), tail) for i in range(len(parts)))
    return fnmatch.fnmatchcase(path, pattern)


def decide_ignored(rules: list[IgnoreRule], path: str) -> bool:
    """Whether ``path`` (relative, with ``/``) is left out of the build context.

    As in Docker, a rule applies when its pattern matches the path or one of its parent
    directories, and the last rule that applies wins.
    """
    parts = path.split("/")
    prefixes = ["/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
    ignored = False
    for rule in rules:
        if any(_matches(rule.pattern, prefix) for prefix in prefixes):
            ignored = rule.exclude
    return ignored

"""The Claude CLI's model catalogue: what a ``claude-cli`` runner advertises, and its default.

Sources, as Claude Code documents its model configuration (``--model`` over ``ANTHROPIC_MODEL``
over the settings file's ``model``; ``ANTHROPIC_DEFAULT_{OPUS,SONNET,HAIKU}_MODEL`` map aliases):

1. **The pool pins the catalogue** (``adapter.claudeCli.models``): exactly those ids, and
   ``defaultModel`` (or the first) as the default. Nothing is resolved.
2. **Otherwise the CLI says**: the aliases its ``--model`` help quotes, and the full id each
   resolves to. The alias -> id table is not ours: each entry is what the CLI itself announces
   in the ``system/init`` event of a *resolution run* -- ``claude --print --model <alias>`` with
   no credential, a scratch config directory and ``ANTHROPIC_BASE_URL`` on a closed loopback
   port, so it cannot reach a model (it answers "Not logged in") and costs nothing. The default
   is the resolution of the first of: the pool's ``defaultModel``, ``--model`` in ``extraArgs``,
   ``ANTHROPIC_MODEL``, the settings file's ``model``, or (none) the CLI's own choice.
3. **A finished turn** adds the model it reported, if the catalogue lacks it.

Everything here is pure except :func:`read_settings`, which reads one small JSON file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "MODEL_ENV",
    "NO_NETWORK_BASE_URL",
    "ClaudeSettings",
    "HelpFeatures",
    "ModelTable",
    "build_resolution_env",
    "decide_catalogue",
    "decide_default_request",
    "parse_help_features",
    "parse_init_model",
    "parse_model_aliases",
    "read_settings",
]

MODEL_ENV = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
)
"""The variables that decide what an alias or the default resolves to (full names or aliases)."""
NO_NETWORK_BASE_URL = "http://127.0.0.1:9"
"""The discard port, closed: a resolution run has nowhere to send a request even if it tried."""
MAX_SETTINGS_BYTES = 256 * 1024
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@\[\]-]{0,127}$")
_QUOTED = re.compile(r"'([a-z][a-z0-9.-]{1,40})'")


@dataclass(frozen=True, slots=True)
class ClaudeSettings:
    """What the CLI's settings file says about models: ``model`` and the model variables of ``env``."""

    model: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def read_settings(config_dir: Path | None) -> ClaudeSettings:
    """``<config_dir>/settings.json``'s model settings; nothing else (no key helper, no credential)."""
    if config_dir is None:
        return ClaudeSettings()
    try:
        raw = (config_dir / "settings.json").read_bytes()[:MAX_SETTINGS_BYTES]
        data = json.loads(raw)
    except (OSError, ValueError):
        return ClaudeSettings()
    if not isinstance(data, dict):
        return ClaudeSettings()
    model = data.get("model")
    raw_env = data.get("env")
    env: dict[str, object] = raw_env if isinstance(raw_env, dict) else {}
    return ClaudeSettings(
        model=model if isinstance(model, str) and _MODEL_ID.match(model) else None,
        env={k: v for k, v in env.items() if k in MODEL_ENV and isinstance(v, str) and _MODEL_ID.match(v)},
    )


def build_resolution_env(*, env: Mapping[str, str], settings: ClaudeSettings, scratch: Path) -> dict[str, str]:
    """The whole environment of a resolution run: no credential, a scratch home, no network.

    The model variables come from the settings file, then the agent's own environment (which
    wins, as it does for the CLI); the credential and every other variable stay out.
    """
    resolved = {
        "PATH": env.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": env.get("LANG", "C.UTF-8"),
        "HOME": str(scratch),
        "CLAUDE_CONFIG_DIR": str(scratch / "config"),
        "ANTHROPIC_BASE_URL": NO_NETWORK_BASE_URL,
    }
    resolved.update(settings.env)
    resolved.update({name: env[name] for name in MODEL_ENV if env.get(name)})
    return resolved


def decide_default_request(
    *, pinned_default: str | None, extra_args: Sequence[str], env: Mapping[str, str], settings: ClaudeSettings
) -> str | None:
    """What a job without a model would ask the CLI for, by Claude Code's precedence; None: its own choice."""
    if pinned_default:
        return pinned_default
    for index, arg in enumerate(extra_args):
        if arg == "--model" and index + 1 < len(extra_args):
            return extra_args[index + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return env.get("ANTHROPIC_MODEL") or settings.env.get("ANTHROPIC_MODEL") or settings.model


@dataclass(frozen=True, slots=True)
class HelpFeatures:
    """What the CLI's ``--help`` says it can do: session flags, MCP configuration, effort levels."""

    resume: bool = False
    fork: bool = False
    mcp: bool = False
    efforts: tuple[str, ...] = ()


_OPTION = re.compile(r"^ {2}(?:-\w, )?(--[a-z][a-z-]*)")  # the option column; descriptions sit deeper
_LEVELS = re.compile(r"\(([a-z]+(?:, [a-z]+)+)\)")


def _option_block(lines: Sequence[str], name: str) -> str | None:
    """The help text of option ``name``: its line and the indented lines that follow it."""
    for index, line in enumerate(lines):
        found = _OPTION.match(line)
        if found is None or found.group(1) != name:
            continue
        block = [line]
        for follow in lines[index + 1 : index + 8]:
            if _OPTION.match(follow):
                break
            block.append(follow)
        return " ".join(part.strip() for part in block)
    return None


def parse_help_features(help_text: str) -> HelpFeatures:
    """The options ``--resume``, ``--fork-session``, ``--mcp-config`` and ``--effort``'s levels, as listed."""
    lines = help_text.splitlines()
    effort = _option_block(lines, "--effort")
    levels = _LEVELS.search(effort) if effort else None
    return HelpFeatures(
        resume=_option_block(lines, "--resume") is not None,
        fork=_option_block(lines, "--fork-session") is not None,
        mcp=_option_block(lines, "--mcp-config") is not None,
        efforts=tuple(dict.fromkeys(levels.group(1).split(", ")))[:8] if levels else (),
    )


def parse_model_aliases(help_text: str) -> list[str]:
    """The aliases quoted in the ``--model`` option's help (``'opus'``, ``'sonnet'``...), in order."""
    lines = help_text.splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith("--model"):
            block = [line]
            for follow in lines[index + 1 : index + 8]:
                if follow.strip().startswith("-"):
                    break
                block.append(follow)
            return list(dict.fromkeys(_QUOTED.findall(" ".join(block))))[:64]
    return []


def parse_init_model(stdout: str) -> str | None:
    """The model the ``system/init`` event of a ``--output-format stream-json`` run announces."""
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("type") == "system" and event.get("subtype") == "init":
            model = event.get("model")
            return model if isinstance(model, str) and _MODEL_ID.match(model) else None
    return None


@dataclass(frozen=True, slots=True)
class ModelTable:
    """Aliases (in ``--help`` order) -> the full id the CLI resolved each to; and the resolved default."""

    aliases: dict[str, str | None] = field(default_factory=dict)
    default: str | None = None


def decide_catalogue(
    *,
    pinned: Sequence[str],
    pinned_default: str | None,
    table: ModelTable,
    seen: Iterable[str] = (),
    limit: int = 64,
) -> tuple[list[str], str | None]:
    """The advertised ids and the default.

    Pinned: exactly ``pinned``, default ``pinned_default`` or the first. Otherwise each alias and
    its resolved id (both are accepted by ``--model`` and run the same model), then any model a
    turn reported; the default is the resolved default.
    """
    if pinned:
        models = list(dict.fromkeys(pinned))[:limit]
        return models, pinned_default if pinned_default in models else models[0]
    ordered: list[str] = list(table.aliases)
    ordered += [full for full in table.aliases.values() if full]
    if table.default:
        ordered.append(table.default)
    ordered += list(seen)
    models = [m for m in dict.fromkeys(ordered) if _MODEL_ID.match(m)][:limit]
    return models, table.default if table.default in models else None

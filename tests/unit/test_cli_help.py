"""Every command's ``--help``: it answers, and a flag is shown as a flag (typer 0.29 showed ``<bool>``
beside each one, as if it took a value: pyproject keeps typer below 0.29)."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from helmhive.cli.main import app


def _paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    if hasattr(command, "commands"):  # a group
        for name, sub in sorted(command.commands.items()):
            found += _paths(sub, (*prefix, name))
    return found


PATHS = _paths(typer.main.get_command(app))


def test_the_walk_finds_the_commands() -> None:
    assert {("demo",), ("change", "approve"), ("dev", "kind", "up")} <= set(PATHS)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "helmhive")
def test_help_answers_and_shows_flags_as_flags(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "--help" in result.output
    assert "<bool>" not in result.output, result.output

"""Showing text the CLI did not write, and failing in one line: the cluster commands' rendering helpers.

Owns how ``change``, ``sessions`` and ``explain-routing`` show text read from objects (names,
messages, reasons, plan summaries: written by an agent, a runner or anyone allowed to write the
object) and from files they were given, and how they report a failure:

* :func:`printable` shows every terminal control or invisible formatting character escaped
  (``\\x1b``, ``\\u202e``): a reader sees that something was there, and no escape sequence, C1
  control or bidi override reaches the terminal;
* :func:`safe_text` wraps that in a rich ``Text``, which rich never parses as markup or emoji;
* :func:`describe_yaml_error` names a YAML error by its position and problem only, never quoting
  the text around it (a kubeconfig's line may hold a token, a manifest's a secret);
* :func:`fail` prints one line on stderr and returns the ``typer.Exit`` to raise.

Everything here is pure except :func:`fail`, which prints. No Kubernetes client, no Kopf.
"""

from __future__ import annotations

import unicodedata

import typer
import yaml
from rich.text import Text

__all__ = ["describe_yaml_error", "fail", "printable", "safe_text"]


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` safe for a terminal: every control or invisible formatting character is shown escaped.

    C0 (except tab and newline, unless ``one_line``), DEL, C1 -- so ESC and every escape sequence
    it would start -- line and paragraph separators and format characters (bidi overrides,
    zero-width ones) become their Python escape (``\\x1b``, ``\\u202e``), so a reader sees that
    something was there. Pure.
    """
    if text.isprintable():
        return text
    keep = "" if one_line else "\n\t"
    return "".join(
        ch if ch in keep or ch.isprintable() or unicodedata.category(ch) == "Zs" else _escaped(ch) for ch in text
    )


def _escaped(ch: str) -> str:
    return ch.encode("unicode_escape").decode("ascii")


def safe_text(value: object, style: str = "") -> Text:
    """A rich ``Text`` of ``value`` (``""`` for None) with :func:`printable`'s escaping; never parsed as markup."""
    return Text("" if value is None else printable(str(value)), style=style)


def describe_yaml_error(err: yaml.YAMLError) -> str:
    """One line for a YAML error: the position and the problem, never the text around it (it may be a secret). Pure."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    return f"{where}{problem}"


def fail(message: str, code: int = 1, *, colour: str | None = typer.colors.RED) -> typer.Exit:
    """Print ``message`` as one line on stderr (red unless ``colour`` says otherwise), control characters escaped.

    Returns the ``typer.Exit`` to raise.
    """
    typer.secho(printable(message, one_line=True), fg=colour, err=True)
    return typer.Exit(code)

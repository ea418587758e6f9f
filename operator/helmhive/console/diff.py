"""A unified diff as HTML, line by line: added, removed, context, hunk and file headers. Pure.

The patch is shown as it is stored: every line of it, in order, each escaped and wrapped in one
``<span>`` whose class says what kind of line it is, inside one ``<pre>``. So the element's text
is the patch's text, byte for byte once encoded (a test compares it with ``change patch``);
only the colours are added.
"""

from __future__ import annotations

from html import escape

__all__ = ["classify_line", "render_diff"]


def classify_line(line: str) -> str:
    """The kind of one line of a ``git diff``: file, hunk, add, del, meta or ctx."""
    if line.startswith("diff --git "):
        return "file"
    if line.startswith("@@"):
        return "hunk"
    if line.startswith(("+++ ", "--- ")):
        return "meta"
    if line.startswith("+"):
        return "add"
    if line.startswith("-"):
        return "del"
    if line.startswith(" ") or line == "":
        return "ctx"
    return "meta"


def render_diff(text: str) -> str:
    """``<pre>`` of the patch with one classed span per line; its text content is ``text`` exactly."""
    parts = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        parts.append(f'<span class="d-{classify_line(body)}">{escape(line, quote=False)}</span>')
    return '<pre class="diff" id="patch" tabindex="0" aria-label="the patch">' + "".join(parts) + "</pre>"

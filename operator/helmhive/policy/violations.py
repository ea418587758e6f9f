"""Violations and field paths: the shape every pure check returns its findings in.

A :class:`Violation` names the field it is about (``spec.providerMappings[1].model``), a
fixed :class:`~helmhive.api.reasons.Reason` and a human message. Checks gather every
violation and return them together; callers (the admission webhook, the reconciler,
``helmhive validate``) decide how to present them.

Field paths follow the Kubernetes convention: ``.name`` for a field or a map key that is
an identifier, ``[3]`` for a list index and ``[app.kubernetes.io/name]`` for any other
map key. :func:`split_field_path` turns a path back into its segments.

This module does no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from helmhive.api.reasons import Reason

__all__ = ["PathSegment", "Violation", "field_path", "split_field_path"]

PathSegment = str | int
_IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]*$")
_TOKEN = re.compile(r"\.?([A-Za-z_$][A-Za-z0-9_$-]*)|\[([^\]]*)\]")


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One broken rule: where, which named reason, and a message for a human."""

    field_path: str
    reason: Reason
    message: str


def field_path(*segments: object) -> str:
    """Join segments into ``spec.items[2].name``; non-identifier keys go in brackets.

    Any other segment (a YAML map may have a null or boolean key) is shown in brackets.
    """
    out: list[str] = []
    for seg in segments:
        if isinstance(seg, str) and _IDENT.match(seg):
            out.append(f".{seg}" if out else seg)
        else:
            out.append(f"[{seg}]")
    return "".join(out)


def split_field_path(path: str) -> list[PathSegment]:
    """Return the segments of a path made by :func:`field_path` (digits in brackets are ints)."""
    segments: list[PathSegment] = []
    for match in _TOKEN.finditer(path):
        name, bracketed = match.group(1), match.group(2)
        if name is not None:
            segments.append(name)
        elif bracketed.isascii() and bracketed.isdigit():  # not "²", which isdigit() but int() refuses
            segments.append(int(bracketed))
        else:
            segments.append(bracketed)
    return segments

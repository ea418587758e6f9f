"""What ``explain-routing`` is asked about: reading and checking the ``-f`` manifest, or a job's body.

Owns refusing bad input in one line that names what and where, as a :class:`UsageError` (exit 2):
a file that cannot be read or is not UTF-8; a stream that does not parse, read exactly as
``helmhive validate`` reads it (:func:`~helmhive.cli.validate.load_documents`: JSON when it starts
with ``{``, as kubectl reads it, else YAML; named by position and problem, never quoting the text),
is nested too deeply or holds a value that cannot be constructed (``!!int "y"``); not exactly one
AgentJob; top-level fields of the wrong type (``metadata: must be a mapping``); a ``-n`` that
contradicts the manifest's namespace (refused as kubectl refuses it); and the spec errors the
models raise, as ``spec.<field>: <message>`` in the wire's camelCase.

Pure but for :func:`read_manifest`, which reads the file. No API calls, no Kopf.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from helmhive.cli.validate import load_documents
from helmhive.policy.violations import field_path

__all__ = ["UsageError", "check_shape", "describe_spec_problems", "manifest_namespace", "read_manifest"]

_SPEC_PROBLEMS_SHOWN = 5
_REASON_CHARS = 200


class UsageError(Exception):
    """A problem with what was asked: printed without a traceback, exit status 2."""


def _a(value: object) -> str:
    """How a YAML value's type is named in a message."""
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def check_shape(body: dict[str, Any], where: str) -> None:
    """Refuse an AgentJob whose top-level fields have the wrong type, naming the field. Pure."""
    for key in ("metadata", "spec", "status"):
        value = body.get(key)
        if value is not None and not isinstance(value, dict):
            raise UsageError(f"{where}{key}: must be a mapping (found {_a(value)})")
    meta = body.get("metadata") or {}
    for key in ("name", "namespace"):
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{where}metadata.{key}: must be a string (found {_a(value)})")


def read_manifest(path: Path) -> dict[str, Any]:
    """The one AgentJob in the file at ``path``, its top-level shape checked; :class:`UsageError` says why not."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"cannot read {path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        documents, _ = load_documents(text=text, file=str(path))
    except Exception as err:  # a value the loader cannot construct, raised as whatever its constructor raises
        reason = (str(err).strip().splitlines() or [""])[0][:_REASON_CHARS] or type(err).__name__
        raise UsageError(f"cannot read {path}: a value cannot be read ({reason})") from None
    broken = next((d for d in documents if d.load_reason is not None), None)
    if broken is not None:
        raise UsageError(f"cannot read {path}: {broken.load_message}")
    jobs = [d.body for d in documents if isinstance(d.body, dict) and d.body.get("kind") == "AgentJob"]
    if len(jobs) != 1:
        raise UsageError(f"{path} must hold exactly one AgentJob (found {len(jobs)})")
    check_shape(jobs[0], f"{path}: ")
    return jobs[0]


def manifest_namespace(manifest: dict[str, Any] | None, namespace: str | None) -> str | None:
    """The namespace asked for: ``-n``, else the manifest's; refused when the two differ (as kubectl does). Pure."""
    ours = ((manifest or {}).get("metadata") or {}).get("namespace") or None
    if namespace and ours and namespace != ours:
        raise UsageError(
            f'the namespace from the provided object "{ours}" does not match the namespace "{namespace}". '
            f"You must pass '--namespace={ours}' to perform this operation."
        )
    return namespace or ours


def describe_spec_problems(err: ValidationError) -> str:
    """Every model error as ``spec.<field>: <message>`` (the wire's camelCase), the first few of them. Pure."""
    problems = []
    for error in err.errors():
        loc = [p for p in error["loc"] if isinstance(p, str | int)]
        message = error["msg"]
        if error["type"] == "value_error":
            message = str(error.get("ctx", {}).get("error", message))
        problems.append(f"{field_path('spec', *loc)}: {message}")
    text = "; ".join(problems[:_SPEC_PROBLEMS_SHOWN])
    if len(problems) > _SPEC_PROBLEMS_SHOWN:
        text += f" (and {len(problems) - _SPEC_PROBLEMS_SHOWN} more)"
    return text

"""The Claude CLI's own compaction, as the runner's compaction policy uses it. Pure.

The runner compacts a resumed chain by its own policy (:mod:`helmhive.policy.sessions.compaction`): past
the pool's watermark it sends the advertised ``compact`` command as a turn's prompt on the same
session. For the Claude CLI that is ``claude --print --resume <id>`` with ``/compact`` on stdin;
the CLI summarises the session with one model call and reports a ``compact_boundary`` with the
context before and after (:mod:`~helmhive.runner.adapters.claude_stream`).

Two CLI settings bear on it, both environment variables the CLI reads:

- ``DISABLE_AUTO_COMPACT``: the CLI's own automatic compaction is turned off for every turn
  (:func:`build_turn_env`), so a session is compacted only by the runner's policy, and so always
  counted in the binding's status and audited. A runner environment that sets it keeps its value.
- ``DISABLE_COMPACT``: the CLI still lists ``compact`` in ``slash_commands`` but answers
  ``/compact isn't available in this environment``; :func:`decide_commands` drops ``compact``
  then, so the policy archives the session at once instead of trying a command that cannot work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from helmhive.runner.adapters.claude_stream import COMPACT_COMMAND

__all__ = ["AUTO_COMPACT_ENV", "COMPACT_ENV", "build_turn_env", "decide_commands"]

AUTO_COMPACT_ENV = "DISABLE_AUTO_COMPACT"
COMPACT_ENV = "DISABLE_COMPACT"
_FALSE = ("", "0", "false", "no", "off")


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in _FALSE


def build_turn_env(env: Mapping[str, str]) -> dict[str, str]:
    """A turn's environment: ``env`` with the CLI's automatic compaction off unless ``env`` says otherwise."""
    return {AUTO_COMPACT_ENV: "1", **env}


def decide_commands(commands: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The commands the session really offers: ``compact`` only if the CLI may compact."""
    if _truthy(env.get(COMPACT_ENV)):
        return [name for name in commands if name != COMPACT_COMMAND]
    return list(commands)

"""The reference agent's settings (from its environment) and its sessions' state.

What :mod:`helmhive.reference_agent.agent` (the ACP peer) is configured by and keeps per
session: the environment variables its module docstring documents, read into :class:`Settings`;
a :class:`Session` (configuration and completed turns) and how it is saved; the configuration
options a session advertises; and the ``crash-once`` mark in ``$HOME``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import acp
from acp import schema

from helmhive.reference_agent import context, rules

__all__ = [
    "AUTH_METHOD_ID",
    "CRASH_EXIT_CODE",
    "CRASH_ONCE_MARK",
    "ENV_CONTEXT_SIZE",
    "ENV_EFFORTS",
    "ENV_LEAK_ON_CRASH",
    "ENV_MODE",
    "ENV_SESSION_PREFIX",
    "ENV_SLOW_INTERVAL",
    "ENV_SLOW_STEPS",
    "ENV_STATE_DIR",
    "ENV_TOKEN",
    "LIMIT_EXIT_CODE",
    "SESSION_ID",
    "AgentSessions",
    "AnyConfigOption",
    "Session",
    "Settings",
    "config_options",
    "first_crash",
]

ENV_STATE_DIR = "HELMHIVE_REFERENCE_AGENT_STATE_DIR"
ENV_MODE = "HELMHIVE_REFERENCE_AGENT_MODE"
ENV_SLOW_STEPS = "HELMHIVE_REFERENCE_AGENT_SLOW_STEPS"
ENV_SLOW_INTERVAL = "HELMHIVE_REFERENCE_AGENT_SLOW_INTERVAL"
ENV_TOKEN = "HELMHIVE_REFERENCE_AGENT_TOKEN"
ENV_LEAK_ON_CRASH = "HELMHIVE_REFERENCE_AGENT_LEAK_ON_CRASH"
ENV_SESSION_PREFIX = "HELMHIVE_REFERENCE_AGENT_SESSION_PREFIX"
ENV_CONTEXT_SIZE = "HELMHIVE_REFERENCE_AGENT_CONTEXT_SIZE"
ENV_EFFORTS = "HELMHIVE_REFERENCE_AGENT_EFFORTS"
CRASH_EXIT_CODE = 70
CRASH_ONCE_MARK = ".helmhive-reference-agent-crashed-once"
"""``REFERENCE-AGENT: crash-once`` crashes only while ``$HOME/<this>`` is absent, and writes it first."""
LIMIT_EXIT_CODE = 1
AUTH_METHOD_ID = "reference-token"

SESSION_ID = re.compile(r"^[a-z0-9-]{0,32}[0-9a-f]{32}$")
_PREFIX = re.compile(r"^[a-z0-9-]{0,32}$")
ConfigOption = schema.SessionConfigOptionSelect


@dataclass
class Settings:
    """What the environment asks of the agent (see the module docstring)."""

    state_dir: Path | None = None
    modes: frozenset[str] = frozenset()
    slow_steps: int = 5
    slow_interval: float = 0.2
    leak_on_crash: bool = False
    session_prefix: str = ""
    context_size: int = context.DEFAULT_CONTEXT_SIZE
    efforts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The efforts offered per model; a model absent here offers every level of :data:`rules.EFFORT_LEVELS`."""

    def efforts_for(self, model: str) -> tuple[str, ...]:
        return self.efforts.get(model, rules.EFFORT_LEVELS)

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Settings:
        state = env.get(ENV_STATE_DIR, "").strip()
        modes = frozenset(m.strip().lower() for m in env.get(ENV_MODE, "").split(",") if m.strip())
        prefix = env.get(ENV_SESSION_PREFIX, "").strip()
        if not _PREFIX.match(prefix):
            raise SystemExit(f"{ENV_SESSION_PREFIX} must match {_PREFIX.pattern}")
        try:
            size = context.parse_context_size(env.get(ENV_CONTEXT_SIZE, ""))
        except ValueError as exc:
            raise SystemExit(f"{ENV_CONTEXT_SIZE} {exc}") from None
        try:
            efforts = parse_efforts(env.get(ENV_EFFORTS, ""))
        except ValueError as exc:
            raise SystemExit(f"{ENV_EFFORTS} {exc}") from None
        return cls(
            efforts=efforts,
            state_dir=Path(state).expanduser() if state else None,
            modes=modes,
            slow_steps=int(env.get(ENV_SLOW_STEPS, "5")),
            slow_interval=float(env.get(ENV_SLOW_INTERVAL, "0.2")),
            leak_on_crash=env.get(ENV_LEAK_ON_CRASH, "") == "1",
            session_prefix=prefix,
            context_size=size,
        )

    @property
    def compact_advertised(self) -> bool:
        return "no-compact-command" not in self.modes

    def behaviour(self) -> rules.Behaviour:
        for behaviour in ("hang", "stall", "crash", "slow"):
            if behaviour in self.modes:
                return rules.as_behaviour(behaviour) or "normal"
        return "normal"


def parse_efforts(text: str) -> dict[str, tuple[str, ...]]:
    """``model=level,level;model=level``: the efforts each named model offers (others offer all)."""
    found: dict[str, tuple[str, ...]] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        model, sep, levels = part.partition("=")
        wanted = tuple(level.strip() for level in levels.split(",") if level.strip())
        if not sep or model.strip() not in rules.MODELS or not set(wanted) <= set(rules.EFFORT_LEVELS):
            raise ValueError(f"must be model=level,...;... with models {rules.MODELS} and levels {rules.EFFORT_LEVELS}")
        found[model.strip()] = wanted
    return found


@dataclass
class Session:
    """One conversation: its configuration and its completed turns."""

    cwd: str
    model: str = rules.DEFAULT_MODEL
    effort: str = rules.DEFAULT_EFFORT
    history: list[dict[str, str]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    def to_json(self) -> dict[str, Any]:
        return {"cwd": self.cwd, "model": self.model, "effort": self.effort, "history": self.history}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Session:
        return cls(
            cwd=str(data["cwd"]),
            model=str(data.get("model", rules.DEFAULT_MODEL)),
            effort=str(data.get("effort", rules.DEFAULT_EFFORT)),
            history=[dict(item) for item in data.get("history", [])],
        )


class AgentSessions:
    """The agent's sessions: in memory, and in ``<state dir>/sessions/<id>.json`` when it has one."""

    def __init__(self, state_dir: Path | None) -> None:
        self._state_dir = state_dir
        self._sessions: dict[str, Session] = {}

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def __getitem__(self, session_id: str) -> Session:
        return self._sessions[session_id]

    def __setitem__(self, session_id: str, session: Session) -> None:
        self._sessions[session_id] = session

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def _file(self, session_id: str) -> Path | None:
        return None if self._state_dir is None else self._state_dir / "sessions" / f"{session_id}.json"

    def save(self, session_id: str) -> None:
        """Write the session to its file (atomically), if there is a state dir."""
        path = self._file(session_id)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._sessions[session_id].to_json(), sort_keys=True), encoding="utf-8")
        tmp.replace(path)

    def restore(self, session_id: str) -> Session:
        """The session, read back from its file if this process has not seen it; ACP's not-found if none."""
        if session_id in self._sessions:
            return self._sessions[session_id]
        path = self._file(session_id) if SESSION_ID.match(session_id) else None
        if path is None or not path.is_file():
            raise acp.RequestError.resource_not_found(f"session:{session_id}")
        session = Session.from_json(json.loads(path.read_text(encoding="utf-8")))
        self._sessions[session_id] = session
        return session


AnyConfigOption = schema.SessionConfigOptionSelect | schema.SessionConfigOptionBoolean


def first_crash() -> bool:
    """True the first time (no mark in ``$HOME`` yet, or no HOME at all): leave the mark, then crash.

    A job re-run with the same HOME (a session binding's, kept on its runner) then runs normally.
    """
    home = os.environ.get("HOME", "")
    if not os.path.isabs(home):
        return True
    mark = Path(home) / CRASH_ONCE_MARK
    if mark.exists():
        return False
    with contextlib.suppress(OSError):  # cannot remember: crash anyway
        mark.write_text("crashed once\n", encoding="utf-8")
    return True


def config_options(session: Session, efforts: tuple[str, ...] = rules.EFFORT_LEVELS) -> list[AnyConfigOption]:
    """The session's configuration options: the model catalogue and the reasoning-effort levels.

    ``efforts`` are those the session's model offers (:meth:`Settings.efforts_for`); without any,
    the session has no effort option at all.
    """
    model = ConfigOption(
        id=rules.MODEL_OPTION_ID,
        name="Model",
        category="model",
        type="select",
        current_value=session.model,
        options=[schema.SessionConfigSelectOption(value=m, name=m) for m in rules.MODELS],
    )
    effort = ConfigOption(
        id=rules.EFFORT_OPTION_ID,
        name="Reasoning effort",
        category="thought_level",
        type="select",
        current_value=session.effort,
        options=[schema.SessionConfigSelectOption(value=e, name=e) for e in efforts],
    )
    return [model, effort] if efforts else [model]

"""An ACP agent process: spawned with an explicit environment, connected over stdio.

This module holds the mechanics the ACP adapter builds on: the adapter's configuration, the
client side of the connection (session updates, permission requests), the bounded stderr tail,
and spawning, killing and closing the agent's process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import acp
from acp import schema
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from helmhive.runner.adapters.acp_auth import AuthRefused
from helmhive.runner.adapters.base import MAX_LIST, MAX_NAME, ToolPermissionRecord
from helmhive.runner.adapters.decisions import (
    ConfigOptionView,
    PermissionOptionView,
    decide_permission,
)

log = logging.getLogger(__name__)

STREAM_LIMIT = 50 * 1024 * 1024
CLOSE_WAIT_S = 2.0
FS_READ_MAX_CHARS = 1_000_000

FsAccess = Literal["none", "read", "write"]


@dataclass(frozen=True, slots=True)
class FsVerdict:
    allowed: bool
    path: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class FsPolicy:
    """Which paths the ``fs/*`` client methods may touch: below ``root``, read or read-write."""

    root: str | None
    access: FsAccess

    def check(self, path: str, *, write: bool) -> FsVerdict:
        """Resolve ``path`` (symlinks included) and judge it. Pure but for reading the file system."""
        if self.root is None or self.access == "none":
            return FsVerdict(False, None, "this job has no file system access")
        if write and self.access != "write":
            return FsVerdict(False, None, "this job's file system access is read-only")
        if not os.path.isabs(path):
            return FsVerdict(False, None, "the path must be absolute")
        root = os.path.realpath(self.root)
        real = os.path.realpath(path)
        if os.path.commonpath([root, real]) != root:
            return FsVerdict(False, None, "the path is outside the job's working directory")
        return FsVerdict(True, real, "")


class AcpAdapterConfig(BaseModel):
    """How to run one ACP agent.

    ``env`` is the agent's whole environment: nothing is inherited from the runner's own
    environment. ``secret_env`` is merged into it at spawn time; its values are redacted from
    every message and diagnostic the adapter returns or logs.
    """

    model_config = ConfigDict(frozen=True)

    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, SecretStr] = Field(default_factory=dict)
    cwd: str | None = None
    """Working directory of the agent process (the session cwd is per turn)."""
    probe_cwd: str = "/"
    """The cwd of the throwaway session the probe opens to read the model catalogue."""
    idle_timeout_s: float = Field(default=300.0, gt=0)
    """No session update for this long during a prompt: send session/cancel."""
    cancel_grace_s: float = Field(default=10.0, gt=0)
    """Prompt still unanswered this long after session/cancel: kill the agent."""
    request_timeout_s: float = Field(default=60.0, gt=0)
    """Limit for initialize, session/new, session/load and session/set_config_option."""
    stderr_tail_chars: int = Field(default=4000, ge=0, le=8000)
    client_name: str = Field(default="helmhive-runner", max_length=MAX_NAME)
    wrapper: tuple[str, ...] = ()
    """A launcher the command runs under (the job sandbox: ``python -m helmhive.runner.sandbox.landlock ... --``)."""
    fs_root: str | None = None
    """The directory the ACP ``fs/*`` client methods may touch; None offers no file system."""
    fs_access: FsAccess = "none"
    """``read`` offers ``fs/read_text_file`` below ``fs_root``; ``write`` also ``fs/write_text_file``."""
    credential_env: str | None = None
    """The variable holding the runner's API key (or the proxy's placeholder): an agent that requires
    ACP ``authenticate`` gets the ``env_var`` method naming it (:mod:`~helmhive.runner.adapters.acp_auth`)."""

    def spawn_env(self) -> dict[str, str]:
        merged = dict(self.env)
        merged.update({key: value.get_secret_value() for key, value in self.secret_env.items()})
        return merged

    def secret_values(self) -> list[str]:
        return [value.get_secret_value() for value in self.secret_env.values()]


def options_from_acp(
    options: Sequence[schema.SessionConfigOptionSelect | schema.SessionConfigOptionBoolean] | None,
) -> tuple[ConfigOptionView, ...]:
    """The select options of a session, flattened (grouped values become one list)."""
    views: list[ConfigOptionView] = []
    for option in options or ():
        if not isinstance(option, schema.SessionConfigOptionSelect):
            continue
        values: list[str] = []
        for item in option.options:
            if isinstance(item, schema.SessionConfigSelectGroup):
                values.extend(choice.value for choice in item.options)
            else:
                values.append(item.value)
        category = option.category if isinstance(option.category, str) else None
        views.append(ConfigOptionView(option.id, category, option.current_value, tuple(values)))
    return tuple(views)


def tool_name(tool_call: schema.ToolCallUpdate) -> str:
    """The name a tool call is judged by: ``_meta.toolName`` if the agent sets it, else its title."""
    meta = tool_call.field_meta or {}
    name = meta.get("toolName")
    if isinstance(name, str) and name:
        return name[:MAX_NAME]
    return (tool_call.title or "")[:MAX_NAME]


@dataclass
class TurnTracker:
    """What the client side records while one prompt is in flight."""

    session_id: str
    allowed_tools: frozenset[str]
    last_activity: float
    cancelling: bool = False
    updates: int = 0
    text: list[str] = field(default_factory=list)
    tools: list[ToolPermissionRecord] = field(default_factory=list)
    usage: tuple[int, int] | None = None
    """(used, size) from the last ``usage_update`` of this turn's session during the turn."""

    def touch(self) -> None:
        self.last_activity = asyncio.get_running_loop().time()
        self.updates += 1


class HelmhiveClient:
    """The client side of the connection. Implements the parts of :class:`acp.Client` we offer:
    session updates, permission requests and -- only below the job's ``fs_root``, and only as far
    as its ``fs_access`` allows -- the ``fs/*`` methods. No terminals."""

    def __init__(self, fs: FsPolicy | None = None) -> None:
        self.turn: TurnTracker | None = None
        self.options: dict[str, tuple[ConfigOptionView, ...]] = {}
        self.commands: dict[str, tuple[str, ...]] = {}
        """Per session: the command names of its last ``available_commands_update`` (they may come at any time)."""
        self.fs = fs or FsPolicy(root=None, access="none")

    def _fs_check(self, session_id: str, path: str, *, write: bool) -> str:
        """The real path to act on, or raise: wrong session, no file system, outside the root, read-only."""
        turn = self.turn
        kind = "edit" if write else "read"
        verdict = self.fs.check(path, write=write)
        if turn is not None and turn.session_id == session_id:
            turn.touch()
            method = "fs/write_text_file" if write else "fs/read_text_file"
            turn.tools.append(ToolPermissionRecord(tool=method, kind=kind, allowed=verdict.allowed))
        else:
            verdict = FsVerdict(allowed=False, path=None, reason="no turn of this session is in flight")
        log.info("fs %s %s", "write" if write else "read", "allowed" if verdict.allowed else "refused")
        if not verdict.allowed or verdict.path is None:
            raise acp.RequestError.invalid_params({"path": path[:512], "reason": verdict.reason})
        return verdict.path

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None, **kwargs: Any
    ) -> schema.ReadTextFileResponse:
        real = self._fs_check(session_id, path, write=False)
        try:
            text = await asyncio.to_thread(_read_text, real, line, limit)
        except OSError as exc:
            raise acp.RequestError.resource_not_found(path[:512]) from exc
        return schema.ReadTextFileResponse(content=text)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> schema.WriteTextFileResponse | None:
        real = self._fs_check(session_id, path, write=True)
        try:
            await asyncio.to_thread(_write_text, real, content)
        except OSError as exc:
            reason = exc.strerror or "write failed"
            raise acp.RequestError.invalid_params({"path": path[:512], "reason": reason}) from exc
        return schema.WriteTextFileResponse()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, schema.ConfigOptionUpdate):
            self.options[session_id] = options_from_acp(update.config_options)
        if isinstance(update, schema.AvailableCommandsUpdate):
            names = (command.name[:MAX_NAME] for command in update.available_commands[:MAX_LIST])
            self.commands[session_id] = tuple(names)
        turn = self.turn
        if turn is None or turn.session_id != session_id:
            return  # e.g. the history replayed by session/load
        turn.touch()
        if isinstance(update, schema.UsageUpdate):
            turn.usage = (update.used, update.size)
        content = update.content if isinstance(update, schema.AgentMessageChunk) else None
        if isinstance(content, schema.TextContentBlock):
            turn.text.append(content.text)

    async def request_permission(
        self,
        session_id: str,
        tool_call: schema.ToolCallUpdate,
        options: list[schema.PermissionOption],
        **kwargs: Any,
    ) -> schema.RequestPermissionResponse:
        turn = self.turn
        name = tool_name(tool_call)
        views = [PermissionOptionView(option.option_id, option.kind) for option in options]
        if turn is None or turn.session_id != session_id:
            decision = decide_permission(name, tool_call.kind, views, (), cancelling=True)
        else:
            turn.touch()
            decision = decide_permission(name, tool_call.kind, views, turn.allowed_tools, cancelling=turn.cancelling)
            turn.tools.append(ToolPermissionRecord(tool=name, kind=tool_call.kind, allowed=decision.allowed))
        log.info("tool permission %s for %r", "granted" if decision.allowed else "denied", name)
        if decision.option_id is None:
            return schema.RequestPermissionResponse(outcome=schema.DeniedOutcome(outcome="cancelled"))
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id=decision.option_id)
        )


def _read_text(path: str, line: int | None, limit: int | None) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read(FS_READ_MAX_CHARS)
    if line is None and limit is None:
        return text
    lines = text.splitlines(keepends=True)
    start = max(0, (line or 1) - 1)
    return "".join(lines[start : start + limit] if limit is not None else lines[start:])


def _write_text(path: str, content: str) -> None:
    # O_NOFOLLOW: a symlink planted after the check cannot redirect the write outside the root.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(content)


class StderrTail:
    """Keeps the last characters of the agent's stderr; never logs them."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = ""

    async def pump(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self._buffer = (self._buffer + chunk.decode("utf-8", errors="replace"))[-self._limit :]

    def text(self) -> str:
        return self._buffer


class SpawnError(Exception):
    """The agent command could not be started."""


class AgentProcess:
    """One running agent: its process group, connection, client and the sessions it has open."""

    def __init__(self, proc: asyncio.subprocess.Process, config: AcpAdapterConfig) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.client = HelmhiveClient(FsPolicy(root=config.fs_root, access=config.fs_access))
        self.conn = acp.connect_to_agent(cast(acp.Client, self.client), proc.stdin, proc.stdout)
        self.stderr = StderrTail(config.stderr_tail_chars)
        self.stderr_task = asyncio.create_task(self.stderr.pump(proc.stderr))
        self.exit_task: asyncio.Task[int] = asyncio.create_task(proc.wait())
        self.init: schema.InitializeResponse | None = None
        self.sessions: dict[str, str] = {}
        """Sessions opened in this process (by session/new or session/load), with their cwd."""
        self.auth_refusal: AuthRefused | None = None
        """Why this process's one ``authenticate`` attempt failed (never retried: a refusal is final)."""
        self.auth_method: str | None = None
        """The method ``authenticate`` succeeded with."""

    @classmethod
    async def spawn(cls, config: AcpAdapterConfig) -> AgentProcess:
        try:
            proc = await asyncio.create_subprocess_exec(
                *config.wrapper,
                config.command,
                *config.args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=config.spawn_env(),
                cwd=config.cwd,
                limit=STREAM_LIMIT,
                start_new_session=True,  # its own process group, so a kill takes its children too
            )
        except OSError as exc:
            name = os.path.basename(config.command)
            raise SpawnError(f"cannot start {name!r}: {exc.strerror or exc}") from None
        log.info("started ACP agent %s (pid %d)", os.path.basename(config.command), proc.pid)
        return cls(proc, config)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return not self.exit_task.done()

    def load_session_supported(self) -> bool:
        caps = self.init.agent_capabilities if self.init else None
        return bool(caps and caps.load_session)

    def fork_session_supported(self) -> bool:
        caps = self.init.agent_capabilities if self.init else None
        sessions = caps.session_capabilities if caps else None
        return sessions is not None and sessions.fork is not None

    async def wait_exit(self, seconds: float) -> int | None:
        """The exit code, if the process exits within ``seconds``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.exit_task), seconds)
        return self.proc.returncode

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def kill(self) -> int | None:
        """SIGKILL the agent's process group and release the connection."""
        if self.alive:
            log.warning("killing ACP agent (pid %d)", self.proc.pid)
            self._signal(signal.SIGKILL)
        code = await self.wait_exit(CLOSE_WAIT_S)
        await self._release()
        return code

    async def close(self) -> int | None:
        """Close stdin and let the agent exit; escalate to SIGTERM, then SIGKILL."""
        await self.conn.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        code = await self.wait_exit(CLOSE_WAIT_S)
        if code is None:
            self._signal(signal.SIGTERM)
            code = await self.wait_exit(CLOSE_WAIT_S)
        if code is None:
            return await self.kill()
        await self._release()
        return code

    async def _release(self) -> None:
        with contextlib.suppress(Exception):
            await self.conn.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self.stderr_task, CLOSE_WAIT_S)
        self.stderr_task.cancel()
        if not self.exit_task.done():
            self.exit_task.cancel()

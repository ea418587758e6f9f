"""The Claude CLI adapter: drives ``claude --print`` with ``--output-format stream-json``.

Probe (no model call, so it costs nothing and needs no network):

- ``claude --version`` -> the CLI's version (``2.1.332 (Claude Code)``);
- ``claude auth status --json`` -> ``loggedIn``: ``false`` is ``Unauthenticated``/``NotLoggedIn``;
  ``true`` is ``Authenticated``/``LoggedIn`` (the CLI has a login; no call verified it) unless
  the last turn was refused for authentication, which is ``Unauthenticated``/``AuthRequired``
  until a turn completes;
- the model catalogue and default (:mod:`~helmhive.runner.adapters.claude_models`): pinned by
  the pool, or the aliases ``claude --help`` quotes for ``--model`` plus the full id the CLI
  resolves each one (and the default) to in a credential-free, network-free resolution run;
  once per adapter. A turn without a model runs with ``--model <default>``, so the advertised
  default is the model that runs.

A turn runs ``claude --print --output-format stream-json --verbose [--model M] [--effort E]
[--resume ID] [--allowedTools ...]`` with the prompt on stdin (never in argv), in its own
process group with an explicit environment. Each stdout line is one JSON event: ``system/init``
(session ID, model), ``assistant`` messages (text), and one ``result`` (``is_error``, the answer).
An idle watchdog (no line for ``idle_timeout_s``) or the caller's cancel sends SIGINT, then
SIGKILL after ``cancel_grace_s``. Secrets and the session ID are redacted from every message,
text and diagnostic; the session ID is returned only as a ``SecretStr``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from helmhive.runner.adapters.base import (
    MAX_LIST,
    MAX_MESSAGE,
    MAX_TEXT,
    AdapterReport,
    AuthReason,
    AuthState,
    CancelOrigin,
    TurnOutcome,
    TurnRequest,
    TurnResult,
)
from helmhive.runner.adapters.claude_models import (
    ModelTable,
    build_resolution_env,
    decide_catalogue,
    decide_default_request,
    parse_init_model,
    parse_model_aliases,
    read_settings,
)
from helmhive.runner.adapters.decisions import bounded, redact, tail
from helmhive.runner.version import helmhive_version

__all__ = [
    "ClaudeCliAdapter",
    "ClaudeCliConfig",
    "decide_auth_status",
    "parse_model_aliases",
    "parse_version",
]

log = logging.getLogger(__name__)

AGENT_NAME = "claude-code"
STREAM_LIMIT = 50 * 1024 * 1024
_VERSION = re.compile(r"(\d+\.\d+\.\d+[0-9A-Za-z.+-]*)")


class ClaudeCliConfig(BaseModel):
    """How to run the CLI. ``env`` is its whole environment; ``secret_env`` is merged in and redacted."""

    model_config = ConfigDict(frozen=True)

    path: str = Field(default="claude", min_length=1)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, SecretStr] = Field(default_factory=dict)
    cwd: str | None = None
    idle_timeout_s: float = Field(default=300.0, gt=0)
    cancel_grace_s: float = Field(default=10.0, gt=0)
    request_timeout_s: float = Field(default=60.0, gt=0)
    """Limit for ``--version``, ``auth status`` and ``--help``."""
    stderr_tail_chars: int = Field(default=4000, ge=0, le=8000)
    wrapper: tuple[str, ...] = ()
    """A launcher each turn runs under (the job sandbox); the probe's short commands do not use it."""
    models: tuple[str, ...] = ()
    """The pool's pinned catalogue (``adapter.claudeCli.models``); empty: ask the CLI."""
    default_model: str | None = None
    """The pool's ``adapter.claudeCli.defaultModel``."""

    def config_dir(self) -> Path | None:
        """Where the CLI keeps its settings: ``CLAUDE_CONFIG_DIR``, else ``$HOME/.claude``."""
        if self.env.get("CLAUDE_CONFIG_DIR"):
            return Path(self.env["CLAUDE_CONFIG_DIR"])
        return Path(self.env["HOME"]) / ".claude" if self.env.get("HOME") else None

    def spawn_env(self) -> dict[str, str]:
        merged = dict(self.env)
        merged.update({key: value.get_secret_value() for key, value in self.secret_env.items()})
        return merged

    def secret_values(self) -> list[str]:
        return [value.get_secret_value() for value in self.secret_env.values()]


def parse_version(text: str) -> str | None:
    """``2.1.332 (Claude Code)`` -> ``2.1.332``."""
    match = _VERSION.search(text)
    return match.group(1)[:64] if match else None


def decide_auth_status(
    status: dict[str, Any] | None, *, last_turn_refused: str | None
) -> tuple[AuthState, AuthReason, str]:
    """The auth verdict from ``claude auth status --json`` and the last turn's authentication refusal."""
    if status is None:
        return AuthState.UNKNOWN, AuthReason.NOT_PROBED, "claude auth status gave no JSON answer"
    method = str(status.get("authMethod", "unknown"))[:64]
    if not status.get("loggedIn"):
        return (
            AuthState.UNAUTHENTICATED,
            AuthReason.NOT_LOGGED_IN,
            f"claude auth status: not logged in (authMethod {method})",
        )
    if last_turn_refused:
        return AuthState.UNAUTHENTICATED, AuthReason.AUTH_REQUIRED, f"the last turn was refused: {last_turn_refused}"
    return (
        AuthState.AUTHENTICATED,
        AuthReason.LOGGED_IN,
        f"claude auth status: logged in (authMethod {method}); not verified by a model call",
    )


@dataclass
class _Stream:
    """What a turn's stdout said so far."""

    session_id: str | None = None
    model: str | None = None
    text: list[str] = field(default_factory=list)
    result: dict[str, Any] | None = None
    auth_error: str | None = None
    events: int = 0


class ClaudeCliAdapter:
    """The :class:`~helmhive.runner.adapters.base.AgentAdapter` for the Claude CLI."""

    def __init__(self, config: ClaudeCliConfig) -> None:
        self._config = config
        self._lock = asyncio.Lock()
        self._aliases: list[str] | None = None
        self._table: ModelTable | None = None
        self._default: str | None = None
        self._last_model: str | None = None
        self._auth_refused: str | None = None

    @property
    def name(self) -> str:
        return "claude-cli"

    async def close(self) -> None:
        return None

    def _redact(self, text: str, *extra: str | None) -> str:
        return redact(text, [*self._config.secret_values(), *(e for e in extra if e)])

    async def _run_short(
        self, *args: str, env: dict[str, str] | None = None, cwd: str | None = None
    ) -> tuple[int, str, str]:
        """Run the CLI with ``args`` (no stdin), bounded by ``request_timeout_s``; killed on timeout."""
        proc = await asyncio.create_subprocess_exec(
            self._config.path,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._config.spawn_env() if env is None else env,
            cwd=cwd or self._config.cwd,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._config.request_timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    # -- probe ---------------------------------------------------------------------------
    async def probe(self) -> AdapterReport:
        async with self._lock:
            report = AdapterReport(adapter=self.name, adapter_version=helmhive_version(), agent_name=AGENT_NAME)
            try:
                code, out, err = await self._run_short("--version")
            except OSError as exc:
                message = f"cannot start {os.path.basename(self._config.path)!r}: {exc.strerror or exc}"
                return report.model_copy(
                    update={"auth": AuthState.FAILING, "auth_reason": AuthReason.SPAWN_FAILED, "auth_message": message}
                )
            except TimeoutError:
                message = f"claude --version did not answer within {self._config.request_timeout_s:g}s"
                return report.model_copy(
                    update={
                        "auth": AuthState.FAILING,
                        "auth_reason": AuthReason.AGENT_UNRESPONSIVE,
                        "auth_message": message,
                    }
                )
            version = parse_version(out)
            if code != 0 or version is None:
                message = self._redact(f"claude --version exited {code}: {tail(err or out, 300)}")
                return report.model_copy(
                    update={
                        "auth": AuthState.FAILING,
                        "auth_reason": AuthReason.INITIALIZE_FAILED,
                        "auth_message": message[:MAX_MESSAGE],
                    }
                )
            report = report.model_copy(update={"agent_version": version, "agent_title": "Claude Code"})
            status: dict[str, Any] | None = None
            with contextlib.suppress(TimeoutError, OSError, ValueError):
                _, out, _ = await self._run_short("auth", "status", "--json")
                parsed = json.loads(out)
                status = parsed if isinstance(parsed, dict) else None
            if self._table is None and not self._config.models:
                self._table = await self._resolve_models()
            auth, reason, message = decide_auth_status(status, last_turn_refused=self._auth_refused)
            models, self._default = decide_catalogue(
                pinned=self._config.models,
                pinned_default=self._config.default_model,
                table=self._table or ModelTable(),
                seen=[self._last_model] if self._last_model else [],
                limit=MAX_LIST,
            )
            return report.model_copy(
                update={
                    "auth": auth,
                    "auth_reason": reason,
                    "auth_message": self._redact(message)[:MAX_MESSAGE],
                    "models": models,
                    "default_model": self._default,
                }
            )

    async def _resolve_models(self) -> ModelTable:
        """The aliases ``--help`` quotes, and what the CLI resolves each (and the default) to, offline."""
        aliases: list[str] = []
        with contextlib.suppress(TimeoutError, OSError):
            _, help_text, _ = await self._run_short("--help")
            aliases = parse_model_aliases(help_text)
        self._aliases = aliases
        settings = read_settings(self._config.config_dir())
        wanted = decide_default_request(
            pinned_default=self._config.default_model,
            extra_args=self._config.extra_args,
            env=self._config.env,
            settings=settings,
        )
        with tempfile.TemporaryDirectory(prefix="helmhive-claude-models-") as scratch:
            env = build_resolution_env(env=self._config.env, settings=settings, scratch=Path(scratch))
            resolved = {alias: await self._resolve_one(alias, env, scratch) for alias in aliases}
            default = resolved.get(wanted) if wanted in resolved else await self._resolve_one(wanted, env, scratch)
        log.info("claude CLI models: %s; default %s", resolved, default)
        return ModelTable(aliases=resolved, default=default)

    async def _resolve_one(self, model: str | None, env: dict[str, str], cwd: str) -> str | None:
        """What ``--model model`` (None: no ``--model``) resolves to, from a run that cannot reach a model."""
        args = ["--print", "--output-format", "stream-json", "--verbose"]
        if model:
            args += ["--model", model]
        try:
            _, out, _ = await self._run_short(*args, "Which model are you?", env=env, cwd=cwd)
        except (TimeoutError, OSError):
            return None
        return parse_init_model(out)

    # -- turn ----------------------------------------------------------------------------
    def _argv(self, request: TurnRequest) -> list[str]:
        argv = [
            *self._config.wrapper,
            self._config.path,
            "--print",
            "--output-format",
            "stream-json",
            "--verbose",
            *self._config.extra_args,
        ]
        model = request.model or self._default
        if model and not any(a == "--model" or a.startswith("--model=") for a in self._config.extra_args):
            argv += ["--model", model]
        if request.effort:
            argv += ["--effort", request.effort]
        if request.session_id is not None:
            argv += ["--resume", request.session_id.get_secret_value()]
            if request.fork:
                argv.append("--fork-session")  # a new session id, seeded from the resumed one
        tools = sorted(t for t in request.allowed_tools if not t.startswith("kind:"))
        if tools:
            argv += ["--allowedTools", ",".join(tools)]
        return argv

    async def run_turn(self, request: TurnRequest, cancel: asyncio.Event | None = None) -> TurnResult:
        async with self._lock:
            started = time.monotonic()
            resumed_id = request.session_id.get_secret_value() if request.session_id else None
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self._argv(request),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env=self._config.spawn_env(),
                    cwd=request.cwd,
                    limit=STREAM_LIMIT,
                    start_new_session=True,
                )
            except OSError as exc:
                message = f"cannot start {os.path.basename(self._config.path)!r}: {exc.strerror or exc}"
                return TurnResult(outcome=TurnOutcome.SPAWN_FAILED, message=self._redact(message))
            log.info("started claude CLI turn (pid %d)", proc.pid)
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            proc.stdin.write(request.prompt.encode("utf-8"))
            with contextlib.suppress(ConnectionError):
                await proc.stdin.drain()
            proc.stdin.close()
            stderr_task = asyncio.create_task(proc.stderr.read(1024 * 1024))
            stream = _Stream()
            origin, killed = await self._read(proc, stream, cancel)
            code = await proc.wait()
            stderr = (await stderr_task).decode("utf-8", "replace")
            session = stream.session_id if request.fork else (stream.session_id or resumed_id)
            result = self._outcome(stream, origin, killed, code)
            if stream.model:
                self._last_model = stream.model
            if result[0] is TurnOutcome.AUTH_REQUIRED:
                self._auth_refused = (stream.auth_error or "authentication failed")[:200]
            elif result[0] is TurnOutcome.COMPLETED:
                self._auth_refused = None
            outcome, message = result
            text, truncated = bounded(self._redact("".join(stream.text), session, resumed_id), MAX_TEXT)
            diagnostics = (
                ""
                if outcome is TurnOutcome.COMPLETED
                else self._redact(tail(stderr, self._config.stderr_tail_chars), session, resumed_id)
            )
            log.info("turn finished: outcome=%s events=%d", outcome.value, stream.events)
            return TurnResult(
                outcome=outcome,
                message=bounded(self._redact(message, session, resumed_id), MAX_MESSAGE)[0],
                native_session_id=SecretStr(session) if session else None,
                session_resumed=resumed_id is not None and not request.fork,
                session_forked=request.fork and session is not None,
                stop_reason=str((stream.result or {}).get("stop_reason") or "")[:64] or None,
                text=text,
                text_truncated=truncated,
                model=stream.model,
                effort=request.effort,
                cancel_origin=origin,
                agent_exit_code=code,
                diagnostics=diagnostics[: MAX_MESSAGE * 4],
                session_updates=stream.events,
                duration_s=round(time.monotonic() - started, 3),
            )

    async def _read(
        self, proc: asyncio.subprocess.Process, stream: _Stream, cancel: asyncio.Event | None
    ) -> tuple[CancelOrigin | None, bool]:
        """Consume stdout under the idle watchdog; return who cancelled (if anyone) and whether it was killed."""
        assert proc.stdout is not None
        loop = asyncio.get_running_loop()
        origin: CancelOrigin | None = None
        interrupted_at: float | None = None
        last = loop.time()
        cancel_wait = asyncio.create_task(cancel.wait()) if cancel is not None else None
        try:
            while True:
                if interrupted_at is None:
                    deadline = last + self._config.idle_timeout_s
                else:
                    deadline = interrupted_at + self._config.cancel_grace_s
                line_task = asyncio.create_task(proc.stdout.readline())
                waiting: set[asyncio.Future[Any]] = {line_task}
                if cancel_wait is not None and interrupted_at is None:
                    waiting.add(cancel_wait)
                done, _ = await asyncio.wait(
                    waiting, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
                )
                if line_task in done:
                    line = line_task.result()
                    if not line:
                        return origin, False
                    last = loop.time()
                    self._consume(line, stream)
                    continue
                line_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await line_task
                if interrupted_at is None:
                    origin = (
                        CancelOrigin.CALLER
                        if cancel_wait is not None and cancel_wait in done
                        else CancelOrigin.WATCHDOG
                    )
                    interrupted_at = loop.time()
                    self._signal(proc, signal.SIGINT)
                    continue
                self._signal(proc, signal.SIGKILL)
                return origin, True
        finally:
            if cancel_wait is not None:
                cancel_wait.cancel()

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    @staticmethod
    def _consume(line: bytes, stream: _Stream) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        stream.events += 1
        kind = event.get("type")
        if isinstance(event.get("session_id"), str):
            stream.session_id = event["session_id"]
        if kind == "system" and event.get("subtype") == "init":
            model = event.get("model")
            stream.model = model[:128] if isinstance(model, str) else None
        elif kind == "assistant":
            message = event.get("message") or {}
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                    stream.text.append(block["text"])
            if event.get("error") == "authentication_failed":
                stream.auth_error = "".join(stream.text)[-200:] or "authentication_failed"
        elif kind == "result":
            stream.result = event

    @staticmethod
    def _outcome(stream: _Stream, origin: CancelOrigin | None, killed: bool, code: int) -> tuple[TurnOutcome, str]:
        if killed:
            return TurnOutcome.KILLED, f"no exit after SIGINT ({origin}); killed"
        if origin is not None:
            return (
                TurnOutcome.IDLE_TIMEOUT if origin is CancelOrigin.WATCHDOG else TurnOutcome.CANCELLED
            ), f"interrupted ({origin})"
        result = stream.result
        if result is None:
            return TurnOutcome.AGENT_CRASHED, f"the CLI exited (code {code}) without a result"
        answer = str(result.get("result") or "")[:500]
        if not result.get("is_error"):
            return TurnOutcome.COMPLETED, f"result {result.get('subtype', 'success')}"
        if stream.auth_error is not None:
            return TurnOutcome.AUTH_REQUIRED, answer or "authentication failed"
        if str(result.get("subtype", "")).startswith("error_max_turns"):
            return TurnOutcome.TRUNCATED, answer or "maximum turns reached"
        return TurnOutcome.PROTOCOL_ERROR, answer or f"the CLI reported an error ({result.get('subtype')})"

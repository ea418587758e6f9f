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
(session ID, model, commands), ``assistant`` messages (text, usage), and one ``result``
(``is_error``, the answer, each model's context window): :mod:`~helmhive.runner.adapters.claude_stream`.
The turn reports the context it left and the session's commands, so the runner's compaction
policy applies to the CLI as to an ACP agent; ``/compact`` as a prompt is the CLI's own
compaction (:mod:`~helmhive.runner.adapters.claude_compact`). An idle watchdog (no line for
``idle_timeout_s``, or the request's shorter window) or the caller's cancel sends SIGINT, then
SIGKILL after ``cancel_grace_s`` (:mod:`~helmhive.runner.adapters.claude_process`). Secrets and
the session ID are redacted from every message, text and diagnostic; the session ID is returned
only as a ``SecretStr``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from helmhive.runner.adapters.base import (
    MAX_LIST,
    MAX_MESSAGE,
    MAX_TEXT,
    AdapterReport,
    AgentCapabilities,
    AuthReason,
    AuthState,
    TurnOutcome,
    TurnRequest,
    TurnResult,
)
from helmhive.runner.adapters.claude_compact import build_turn_env, decide_commands
from helmhive.runner.adapters.claude_models import (
    HelpFeatures,
    ModelTable,
    build_resolution_env,
    decide_catalogue,
    decide_default_request,
    parse_help_features,
    parse_init_model,
    parse_model_aliases,
    read_settings,
)
from helmhive.runner.adapters.claude_process import ClaudeCliConfig, read_turn, run_short
from helmhive.runner.adapters.claude_stream import ClaudeStream, decide_context, decide_outcome, is_compact_prompt
from helmhive.runner.adapters.decisions import bounded, redact, tail
from helmhive.version import helmhive_version

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


class ClaudeCliAdapter:
    """The :class:`~helmhive.runner.adapters.base.AgentAdapter` for the Claude CLI."""

    def __init__(self, config: ClaudeCliConfig) -> None:
        self._config = config
        self._lock = asyncio.Lock()
        self._aliases: list[str] | None = None
        self._help: HelpFeatures | None = None
        self._table: ModelTable | None = None
        self._default: str | None = None
        self._last_model: str | None = None
        self._auth_refused: str | None = None
        self._turn: asyncio.subprocess.Process | None = None

    @property
    def name(self) -> str:
        return "claude-cli"

    @property
    def process_id(self) -> int | None:
        """The pid of the running turn's process (the sandbox launcher when there is one), if any."""
        return self._turn.pid if self._turn is not None and self._turn.returncode is None else None

    async def close(self) -> None:
        return None

    def _redact(self, text: str, *extra: str | None) -> str:
        return redact(text, [*self._config.secret_values(), *(e for e in extra if e)])

    async def _run_short(
        self, *args: str, env: dict[str, str] | None = None, cwd: str | None = None
    ) -> tuple[int, str, str]:
        return await run_short(self._config, *args, env=env, cwd=cwd)

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
            features = await self._features()
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
                    "effort_levels": list(features.efforts),
                    # --effort's levels apply to every model; unknown (none learnt) when --help did not answer.
                    "model_efforts": {m: list(features.efforts) for m in models} if self._help is not None else {},
                    "capabilities": AgentCapabilities(
                        load_session=features.resume,
                        fork_session=features.resume and features.fork,
                        mcp_http=features.mcp,
                        mcp_sse=features.mcp,
                    ),
                    "capabilities_known": self._help is not None,
                }
            )

    async def _features(self) -> HelpFeatures:
        """What ``--help`` lists (asked once; an unanswered ``--help`` is asked again at the next probe)."""
        if self._help is not None:
            return self._help
        try:
            code, help_text, _ = await self._run_short("--help")
        except (TimeoutError, OSError):
            return HelpFeatures()
        if code != 0:
            return HelpFeatures()
        self._help = parse_help_features(help_text)
        self._aliases = parse_model_aliases(help_text)
        return self._help

    async def _resolve_models(self) -> ModelTable:
        """The aliases ``--help`` quotes, and what the CLI resolves each (and the default) to, offline."""
        await self._features()
        aliases = self._aliases or []
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
                    env=build_turn_env(self._config.spawn_env()),
                    cwd=request.cwd,
                    limit=STREAM_LIMIT,
                    start_new_session=True,
                )
            except OSError as exc:
                message = f"cannot start {os.path.basename(self._config.path)!r}: {exc.strerror or exc}"
                return TurnResult(outcome=TurnOutcome.SPAWN_FAILED, message=self._redact(message))
            log.info("started claude CLI turn (pid %d)", proc.pid)
            self._turn = proc
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            proc.stdin.write(request.prompt.encode("utf-8"))
            with contextlib.suppress(ConnectionError):
                await proc.stdin.drain()
            proc.stdin.close()
            stderr_task = asyncio.create_task(proc.stderr.read(1024 * 1024))
            stream = ClaudeStream()
            idle_s = min(self._config.idle_timeout_s, request.idle_timeout_s or self._config.idle_timeout_s)
            origin, killed = await read_turn(proc, stream, cancel, idle_s=idle_s, grace_s=self._config.cancel_grace_s)
            code = await proc.wait()
            stderr = (await stderr_task).decode("utf-8", "replace")
            session = stream.session_id if request.fork else (stream.session_id or resumed_id)
            result = decide_outcome(stream, origin, killed, code, compacting=is_compact_prompt(request.prompt))
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
            used, size = decide_context(stream)
            log.info("turn finished: outcome=%s events=%d context=%s/%s", outcome.value, stream.events, used, size)
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
                context_used=used,
                context_size=size,
                commands=decide_commands(stream.commands, self._config.env),
                duration_s=round(time.monotonic() - started, 3),
            )

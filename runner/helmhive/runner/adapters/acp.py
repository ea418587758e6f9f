"""The ACP adapter: drives any Agent Client Protocol agent over stdio with the ``acp`` package.

One adapter keeps one agent process and drives one turn at a time:

1. spawn the configured command with an explicit environment, then ``initialize``;
2. ``session/new``, or ``session/load`` for a session ID the caller kept (skipped when this
   process already has the session open); an agent that answers it with the auth-required error
   gets one ``authenticate`` with the method that takes the runner's API key
   (:mod:`~helmhive.runner.adapters.acp_auth`), then the request again;
3. model, then effort, with ``session/set_config_option`` -- only when the session offers the
   value and does not hold it already; an unoffered value fails the turn with a named reason;
4. ``session/prompt`` under an idle watchdog: no session update for ``idle_timeout_s`` sends
   ``session/cancel``; a prompt still unanswered ``cancel_grace_s`` later gets the agent killed,
   and the next turn respawns it. Permission requests are answered from the turn's allow-list.

The native session ID goes back to the caller in :class:`TurnResult` (as a ``SecretStr``) and is
never logged; it and every ``secret_env`` value are redacted from messages and diagnostics.

Steps 1 to 3 (the process, authentication, the session and its options) are the base class's,
:class:`~helmhive.runner.adapters.acp_session.AcpSession`; this module owns the probe and the
turn: step 4 and the :class:`TurnResult`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial
from typing import Any

import acp
from acp import schema
from pydantic import SecretStr

from helmhive.runner.adapters.acp_auth import AuthRefused
from helmhive.runner.adapters.acp_process import (
    AcpAdapterConfig,
    AgentProcess,
    TurnTracker,
    options_from_acp,
)
from helmhive.runner.adapters.acp_report import (
    AUTH_REQUIRED_CODE,
    AdapterFailure,
    TurnState,
    describe_agent,
    error_outcome,
    with_catalogue,
)
from helmhive.runner.adapters.acp_session import CRASH_SETTLE_S, AcpSession
from helmhive.runner.adapters.base import (
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
from helmhive.runner.adapters.decisions import bounded
from helmhive.version import helmhive_version

__all__ = ["AcpAdapter", "AcpAdapterConfig"]

log = logging.getLogger(__name__)
PromptBlock = (
    schema.TextContentBlock
    | schema.ImageContentBlock
    | schema.AudioContentBlock
    | schema.ResourceContentBlock
    | schema.EmbeddedResourceContentBlock
)


_EffortsKey = tuple[object, ...]
_LEARNT_EFFORTS: dict[_EffortsKey, dict[str, list[str]]] = {}
"""Efforts per model, learnt once per (agent program and environment, agent, version, models) in this process and
shared by every adapter instance, so a spare adapter probing while a job holds the main one does
not set each model again."""
_LEARNT_KEPT = 4  # agent versions remembered (an upgrade in place adds one)


class AcpAdapter(AcpSession):
    """The :class:`~helmhive.runner.adapters.base.AgentAdapter` for ACP agents."""

    def __init__(self, config: AcpAdapterConfig) -> None:
        self._config = config
        self._proc = None
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return "acp"

    @property
    def process_id(self) -> int | None:
        """The running agent's pid, if one is running."""
        return self._proc.pid if self._proc is not None and self._proc.alive else None

    async def __aenter__(self) -> AcpAdapter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        async with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None:
                await proc.close()

    # -- probe -------------------------------------------------------------------------------
    async def probe(self) -> AdapterReport:
        async with self._lock:
            report = AdapterReport(adapter=self.name, adapter_version=helmhive_version())
            try:
                proc = await self._ensure()
            except AdapterFailure as failure:
                reason = {
                    "spawn": AuthReason.SPAWN_FAILED,
                    "protocol": AuthReason.PROTOCOL_MISMATCH,
                }.get(failure.stage, AuthReason.INITIALIZE_FAILED)
                return report.model_copy(
                    update={"auth": AuthState.FAILING, "auth_reason": reason, "auth_message": failure.message}
                )
            report = describe_agent(report, proc.init)
            cwd = self._config.probe_cwd
            try:
                response = await self._open(
                    proc, partial(proc.conn.new_session, cwd=cwd, mcp_servers=[]), "session/new"
                )
            except AdapterFailure as failure:
                killed = failure.outcome is TurnOutcome.KILLED
                reason = AuthReason.AGENT_UNRESPONSIVE if killed else AuthReason.AGENT_CRASHED
                return report.model_copy(
                    update={"auth": AuthState.FAILING, "auth_reason": reason, "auth_message": failure.message}
                )
            except acp.RequestError as exc:
                if exc.code == AUTH_REQUIRED_CODE:
                    update = {"auth": AuthState.UNAUTHENTICATED, "auth_reason": AuthReason.AUTH_REQUIRED}
                else:
                    update = {"auth": AuthState.FAILING, "auth_reason": AuthReason.SESSION_FAILED}
                return report.model_copy(update={**update, "auth_message": self._error_text(exc)})
            except AuthRefused as refused:
                return report.model_copy(
                    update={
                        "auth": AuthState.UNAUTHENTICATED,
                        "auth_reason": refused.reason,
                        "auth_message": refused.message,
                    }
                )
            proc.sessions[response.session_id] = self._config.probe_cwd
            via = f" after authenticate (method {proc.auth_method})" if proc.auth_method else ""
            report = with_catalogue(report, response.config_options)
            try:
                efforts = await self._efforts_known(proc, response.session_id, response.config_options, report)
            except AdapterFailure as failure:
                # The session opened, so the login is fine; the efforts stay unlearnt this time (the
                # runner keeps the last ones learnt) and the next turn finds out whether the agent is well.
                log.warning("the efforts per model were not learnt: %s", failure.message)
                efforts = {}
            return report.model_copy(
                update={
                    "model_efforts": efforts,
                    "auth": AuthState.AUTHENTICATED,
                    "auth_reason": AuthReason.SESSION_CREATED,
                    "auth_message": f"the agent opened a session{via}",
                    "auth_method": proc.auth_method,
                }
            )

    async def _efforts_known(
        self,
        proc: AgentProcess,
        session_id: str,
        options: list[schema.SessionConfigOptionSelect | schema.SessionConfigOptionBoolean] | None,
        report: AdapterReport,
    ) -> dict[str, list[str]]:
        """The efforts per model: learnt once per agent version and model list, then remembered."""
        config = self._config  # the same program with the same (non-secret) environment: the same answer
        key = (config.command, config.args, tuple(sorted(config.env.items())), report.agent_name,
               report.agent_version, tuple(report.models))  # fmt: skip
        found = _LEARNT_EFFORTS.get(key)
        if found is None:
            found = await self._efforts_per_model(proc, session_id, options_from_acp(options))
            while len(_LEARNT_EFFORTS) >= _LEARNT_KEPT:
                _LEARNT_EFFORTS.pop(next(iter(_LEARNT_EFFORTS)))
            _LEARNT_EFFORTS[key] = found
        return {model: list(levels) for model, levels in found.items()}

    # -- turn --------------------------------------------------------------------------------
    async def run_turn(self, request: TurnRequest, cancel: asyncio.Event | None = None) -> TurnResult:
        async with self._lock:
            started = time.monotonic()
            state = TurnState()
            base = request.session_id.get_secret_value() if request.session_id else None
            try:
                result = await self._run(request, cancel, state)
            except AdapterFailure as failure:
                message = self._redact(failure.message, state.session_id, base)
                result = TurnResult(outcome=failure.outcome, message=message)
                state.diagnostics = state.diagnostics or failure.diagnostics
                if failure.exit_code is not None:
                    state.exit_code = failure.exit_code
            except acp.RequestError as exc:
                message = self._error_text(exc, state.session_id, base)
                result = TurnResult(outcome=error_outcome(exc.code), message=message)
            except AuthRefused as refused:
                result = TurnResult(outcome=TurnOutcome.AUTH_REQUIRED, message=f"{refused.reason}: {refused.message}")
            log.info(
                "turn finished: outcome=%s resumed=%s forked=%s updates=%d",
                result.outcome.value,
                state.resumed,
                state.forked,
                result.session_updates,
            )
            diagnostics = "" if result.ok else self._redact(state.diagnostics, state.session_id, base)[-8000:]
            return result.model_copy(
                update={
                    "native_session_id": SecretStr(state.session_id) if state.session_id else None,
                    "session_resumed": state.resumed,
                    "session_forked": state.forked,
                    # A fork's base id is redacted too (the turn's own id already is).
                    "text": self._redact(result.text, base) if base and state.forked else result.text,
                    "message": self._redact(result.message, base) if base else result.message,
                    "model": state.model,
                    "effort": state.effort,
                    "config_changes": list(state.changes),
                    "agent_exit_code": state.exit_code,
                    "diagnostics": diagnostics,
                    "duration_s": round(time.monotonic() - started, 3),
                    "context_used": state.usage[0] if state.usage else None,
                    "context_size": state.usage[1] if state.usage else None,
                    "commands": list(state.commands),
                }
            )

    async def _run(self, request: TurnRequest, cancel: asyncio.Event | None, state: TurnState) -> TurnResult:
        proc = await self._ensure()
        session_id = await self._attach(proc, request, state)
        await self._configure(proc, session_id, request, state)
        return await self._prompt(proc, session_id, request, cancel, state)

    async def _prompt(
        self,
        proc: AgentProcess,
        session_id: str,
        request: TurnRequest,
        cancel: asyncio.Event | None,
        state: TurnState,
    ) -> TurnResult:
        loop = asyncio.get_running_loop()
        turn = TurnTracker(session_id, request.allowed_tools, loop.time())
        idle_s = min(self._config.idle_timeout_s, request.idle_timeout_s or self._config.idle_timeout_s)
        proc.client.turn = turn
        blocks: list[PromptBlock] = [acp.text_block(request.prompt)]
        prompt = asyncio.create_task(proc.conn.prompt(session_id=session_id, prompt=blocks))
        cancel_wait = asyncio.create_task(cancel.wait()) if cancel is not None else None
        origin: CancelOrigin | None = None
        cancel_sent_at: float | None = None
        try:
            while not prompt.done():
                if cancel_sent_at is None:
                    deadline = turn.last_activity + idle_s
                else:
                    deadline = cancel_sent_at + self._config.cancel_grace_s
                waiting: set[asyncio.Future[Any]] = {prompt, proc.exit_task}
                if cancel_wait is not None and cancel_sent_at is None:
                    waiting.add(cancel_wait)
                done, _ = await asyncio.wait(
                    waiting, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
                )
                if prompt in done:
                    break
                if proc.exit_task in done:
                    await asyncio.wait({prompt}, timeout=CRASH_SETTLE_S)
                    break
                now = loop.time()
                if cancel_sent_at is None and (
                    (cancel_wait is not None and cancel_wait in done) or now - turn.last_activity >= idle_s
                ):
                    origin = CancelOrigin.CALLER if cancel_wait in done else CancelOrigin.WATCHDOG
                    if origin is CancelOrigin.WATCHDOG:
                        log.warning("idle watchdog: no session update for %gs; cancelling", idle_s)
                    turn.cancelling, cancel_sent_at = True, now
                    with contextlib.suppress(ConnectionError):
                        await proc.conn.cancel(session_id=session_id)
                elif cancel_sent_at is not None and now >= deadline:
                    state.exit_code = await self._discard(proc, kill=True)
                    state.diagnostics = proc.stderr.text()
                    grace = self._config.cancel_grace_s
                    message = f"no answer {grace:g}s after session/cancel ({origin}); killed"
                    return self._result(TurnOutcome.KILLED, message, turn, None, origin)
            return await self._finish(proc, prompt, turn, origin, state)
        finally:
            proc.client.turn = None
            state.usage, state.commands = turn.usage, proc.client.commands.get(session_id, ())
            abandoned = not prompt.done() and self._proc is proc
            for task in (prompt, cancel_wait):
                if task is not None and not task.done():
                    task.cancel()
                elif task is not None and not task.cancelled():
                    task.exception()  # retrieved: a ConnectionError after a kill is expected
            if abandoned:  # the caller gave up mid-turn: the agent's state is unknown
                await self._discard(proc, kill=True)

    async def _finish(
        self,
        proc: AgentProcess,
        prompt: asyncio.Task[schema.PromptResponse],
        turn: TurnTracker,
        origin: CancelOrigin | None,
        state: TurnState,
    ) -> TurnResult:
        if not prompt.done() or isinstance(prompt.exception(), ConnectionError):
            state.exit_code = await proc.wait_exit(CRASH_SETTLE_S)
            await self._discard(proc, kill=True)
            state.diagnostics = proc.stderr.text()
            message = f"the agent exited mid-turn (exit code {state.exit_code})"
            return self._result(TurnOutcome.AGENT_CRASHED, message, turn, None, origin)
        exc = prompt.exception()
        if isinstance(exc, acp.RequestError):
            state.diagnostics = proc.stderr.text()
            return self._result(error_outcome(exc.code), self._error_text(exc, turn.session_id), turn, None, origin)
        if exc is not None:
            raise exc
        stop = prompt.result().stop_reason
        if stop == "cancelled":
            outcome = TurnOutcome.IDLE_TIMEOUT if origin is CancelOrigin.WATCHDOG else TurnOutcome.CANCELLED
        else:
            outcome = {
                "end_turn": TurnOutcome.COMPLETED,
                "refusal": TurnOutcome.AGENT_REFUSED,
            }.get(stop, TurnOutcome.TRUNCATED)
        return self._result(outcome, f"stop reason {stop}", turn, stop, origin)

    def _result(
        self,
        outcome: TurnOutcome,
        message: str,
        turn: TurnTracker,
        stop_reason: str | None,
        origin: CancelOrigin | None,
    ) -> TurnResult:
        text, truncated = bounded(self._redact("".join(turn.text), turn.session_id), MAX_TEXT)
        return TurnResult(
            outcome=outcome,
            message=bounded(self._redact(message, turn.session_id), MAX_MESSAGE)[0],
            stop_reason=stop_reason,
            text=text,
            text_truncated=truncated,
            tool_requests=list(turn.tools[:64]),
            cancel_origin=origin,
            session_updates=turn.updates,
        )

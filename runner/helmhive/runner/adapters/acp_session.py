"""The ACP adapter's session half: the agent process, authentication and opening the turn's session.

:class:`AcpSession` is the base of :class:`~helmhive.runner.adapters.acp.AcpAdapter` and owns
steps 1 to 3 of its turn: spawn and ``initialize`` (``_ensure``); every setup request under
``request_timeout_s`` (``_call``); ``session/new``, ``session/load`` and ``session/fork`` with one
``authenticate`` on the auth-required error (``_open``, ``_authenticate``, ``_attach``,
``_fork``); model and effort (``_configure``); and, for the probe, the efforts each model offers
(``_efforts_per_model``). The prompt itself is the adapter's.
Secrets and session ids are redacted here as there (``_redact``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import acp
import pydantic
from acp import schema

from helmhive.runner.adapters.acp_auth import AuthRefused, decide_auth_method
from helmhive.runner.adapters.acp_process import (
    AcpAdapterConfig,
    AgentProcess,
    SpawnError,
    options_from_acp,
)
from helmhive.runner.adapters.acp_report import (
    AUTH_REQUIRED_CODE,
    RESOURCE_NOT_FOUND_CODE,
    AdapterFailure,
    TurnState,
)
from helmhive.runner.adapters.base import (
    MAX_MESSAGE,
    AuthReason,
    ConfigChange,
    TurnOutcome,
    TurnRequest,
)
from helmhive.runner.adapters.decisions import (
    ConfigKind,
    ConfigOptionView,
    bounded,
    decide_config_change,
    find_option,
    redact,
)
from helmhive.version import helmhive_version

__all__ = ["CRASH_SETTLE_S", "AcpSession"]

# The adapter's logger: these lines were always the ACP adapter's, and stay under its name.
log = logging.getLogger("helmhive.runner.adapters.acp")

T = TypeVar("T")
CRASH_SETTLE_S = 1.0
MAX_EFFORT_PROBES = 16
"""Models whose efforts one probe learns (each costs one ``session/set_config_option``; learnt once)."""


class AcpSession:
    """The agent process and the turn's session: what :class:`~helmhive.runner.adapters.acp.AcpAdapter` builds on."""

    _config: AcpAdapterConfig
    _proc: AgentProcess | None

    # -- helpers -----------------------------------------------------------------------------
    def _redact(self, text: str, *extra: str | None) -> str:
        return redact(text, [*self._config.secret_values(), *(e for e in extra if e)])

    def _error_text(self, exc: acp.RequestError, *extra: str | None) -> str:
        detail = f"{exc} (code {exc.code})" + (f": {exc.data}" if exc.data else "")
        return bounded(self._redact(detail, *extra), MAX_MESSAGE)[0]

    async def _discard(self, proc: AgentProcess, *, kill: bool) -> int | None:
        if self._proc is proc:
            self._proc = None
        return await (proc.kill() if kill else proc.close())

    async def _call(self, proc: AgentProcess, request: Awaitable[T], what: str, *, stage: str = "turn") -> T:
        """A setup request, limited to ``request_timeout_s``; a silent agent is killed."""
        try:
            return await asyncio.wait_for(request, self._config.request_timeout_s)
        except TimeoutError:
            code = await self._discard(proc, kill=True)
            message = f"the agent did not answer {what} within {self._config.request_timeout_s:g}s; killed"
            outcome = TurnOutcome.KILLED
        except ConnectionError:
            code = await proc.wait_exit(CRASH_SETTLE_S)
            await self._discard(proc, kill=True)
            message = f"the agent exited (code {code}) during {what}"
            outcome = TurnOutcome.AGENT_CRASHED
        except pydantic.ValidationError as exc:
            # An answer of the wrong shape breaks the protocol; where and how, never the values.
            code = await self._discard(proc, kill=True)
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "result"
            message = f"the agent answered {what} with a malformed result ({where}: {first['type']}); killed"
            outcome = TurnOutcome.PROTOCOL_ERROR
        diagnostics = proc.stderr.text()
        raise AdapterFailure(outcome, message, stage=stage, diagnostics=diagnostics, exit_code=code) from None

    async def _open(self, proc: AgentProcess, request: Callable[[], Awaitable[T]], what: str) -> T:
        """A session request; on the auth-required error, ``authenticate`` once and ask again."""
        try:
            return await self._call(proc, request(), what)
        except acp.RequestError as exc:
            if exc.code != AUTH_REQUIRED_CODE:
                raise
            if proc.auth_refusal is not None:  # this process's one attempt already failed: say why again
                raise AuthRefused(proc.auth_refusal.reason, proc.auth_refusal.message) from None
            if proc.auth_method is not None:  # authenticated, and still refused
                raise
        await self._authenticate(proc)
        return await self._call(proc, request(), what)

    async def _authenticate(self, proc: AgentProcess) -> None:
        try:
            await self._authenticate_once(proc)
        except AuthRefused as refused:
            proc.auth_refusal = refused
            raise

    async def _authenticate_once(self, proc: AgentProcess) -> None:
        choice = decide_auth_method(
            proc.init.auth_methods if proc.init is not None else None,
            credential_env=self._config.credential_env,
            env_names={*self._config.env, *self._config.secret_env},
        )
        if choice.method_id is None:
            log.warning("the agent requires authentication: %s", choice.message)
            raise AuthRefused(AuthReason.NO_AUTH_METHOD, choice.message)
        try:
            await self._call(proc, proc.conn.authenticate(method_id=choice.method_id), "authenticate")
        except acp.RequestError as exc:
            message = f"the agent refused authenticate with {choice.message}: {self._error_text(exc)}"
            log.warning("%s", message)
            raise AuthRefused(AuthReason.AUTHENTICATE_FAILED, message) from None
        proc.auth_method = choice.method_id
        log.info("authenticated: method=%s", choice.method_id)

    async def _ensure(self) -> AgentProcess:
        if self._proc is not None and self._proc.alive:
            return self._proc
        if self._proc is not None:
            await self._discard(self._proc, kill=True)
        try:
            proc = await AgentProcess.spawn(self._config)
        except SpawnError as exc:
            raise AdapterFailure(TurnOutcome.SPAWN_FAILED, self._redact(str(exc)), stage="spawn") from None
        self._proc = proc
        init_request = proc.conn.initialize(
            protocol_version=acp.PROTOCOL_VERSION,
            client_capabilities=schema.ClientCapabilities(
                fs=schema.FileSystemCapabilities(
                    read_text_file=self._config.fs_root is not None and self._config.fs_access != "none",
                    write_text_file=self._config.fs_root is not None and self._config.fs_access == "write",
                )
            ),
            client_info=schema.Implementation(name=self._config.client_name, version=helmhive_version()),
        )
        try:
            proc.init = await self._call(proc, init_request, "initialize", stage="initialize")
        except acp.RequestError as exc:
            await self._discard(proc, kill=True)
            raise AdapterFailure(TurnOutcome.PROTOCOL_ERROR, self._error_text(exc), stage="initialize") from None
        if proc.init.protocol_version != acp.PROTOCOL_VERSION:
            await self._discard(proc, kill=True)
            message = f"the agent speaks ACP version {proc.init.protocol_version}, not {acp.PROTOCOL_VERSION}"
            raise AdapterFailure(TurnOutcome.PROTOCOL_ERROR, message, stage="protocol")
        return proc

    # -- the turn's session ------------------------------------------------------------------
    async def _attach(self, proc: AgentProcess, request: TurnRequest, state: TurnState) -> str:
        if request.session_id is None:
            new = partial(proc.conn.new_session, cwd=request.cwd, mcp_servers=[])
            response = await self._open(proc, new, "session/new")
            state.session_id = response.session_id
            proc.client.options[response.session_id] = options_from_acp(response.config_options)
            proc.sessions[response.session_id] = request.cwd
            return response.session_id
        session_id = request.session_id.get_secret_value()
        if request.fork:
            return await self._fork(proc, request, session_id, state)
        state.session_id, state.resumed = session_id, True
        if proc.sessions.get(session_id) == request.cwd:
            return session_id  # already open in this process
        if not proc.load_session_supported():
            raise AdapterFailure(TurnOutcome.RESUME_UNSUPPORTED, "the agent does not advertise loadSession")
        load = partial(proc.conn.load_session, cwd=request.cwd, session_id=session_id, mcp_servers=[])
        try:
            loaded = await self._open(proc, load, "session/load")
        except acp.RequestError as exc:
            if exc.code == RESOURCE_NOT_FOUND_CODE:
                raise AdapterFailure(TurnOutcome.SESSION_NOT_FOUND, self._error_text(exc, session_id)) from None
            raise
        if loaded.config_options is not None:
            proc.client.options[session_id] = options_from_acp(loaded.config_options)
        proc.sessions[session_id] = request.cwd
        return session_id

    async def _fork(self, proc: AgentProcess, request: TurnRequest, base_id: str, state: TurnState) -> str:
        """A new session seeded from ``base_id`` (ACP ``session/fork``); never a silent fresh start."""
        if not proc.fork_session_supported():
            raise AdapterFailure(TurnOutcome.FORK_UNSUPPORTED, "the agent does not advertise session forking")
        fork = partial(proc.conn.fork_session, session_id=base_id, cwd=request.cwd, mcp_servers=[])
        try:
            forked = await self._open(proc, fork, "session/fork")
        except acp.RequestError as exc:
            if exc.code == RESOURCE_NOT_FOUND_CODE:
                raise AdapterFailure(TurnOutcome.SESSION_NOT_FOUND, self._error_text(exc, base_id)) from None
            raise
        state.session_id, state.forked = forked.session_id, True
        proc.client.options[forked.session_id] = options_from_acp(forked.config_options)
        proc.sessions[forked.session_id] = request.cwd
        return forked.session_id

    async def _configure(self, proc: AgentProcess, session_id: str, request: TurnRequest, state: TurnState) -> None:
        # Model first: the effort levels on offer may depend on the model.
        for kind, wanted in ((ConfigKind.MODEL, request.model), (ConfigKind.EFFORT, request.effort)):
            decision = decide_config_change(proc.client.options.get(session_id, ()), kind, wanted)
            if decision.action == "refuse":
                assert decision.outcome is not None
                raise AdapterFailure(decision.outcome, decision.message)
            if decision.action != "set" or decision.config_id is None or decision.value is None:
                continue
            change = proc.conn.set_config_option(
                config_id=decision.config_id, session_id=session_id, value=decision.value
            )
            try:
                response = await self._call(proc, change, "session/set_config_option")
            except acp.RequestError as exc:
                if exc.code == AUTH_REQUIRED_CODE:
                    raise
                detail = self._error_text(exc, session_id)
                message = f"the agent refused {kind.value} {decision.value!r}: {detail}"
                raise AdapterFailure(TurnOutcome.CONFIG_REFUSED, message) from None
            proc.client.options[session_id] = options_from_acp(response.config_options)
            state.changes.append(ConfigChange(config_id=decision.config_id, value=decision.value))
        options = proc.client.options.get(session_id, ())
        model, effort = find_option(options, ConfigKind.MODEL), find_option(options, ConfigKind.EFFORT)
        state.model = model.current_value if model else None
        state.effort = effort.current_value if effort else None

    async def _efforts_per_model(
        self, proc: AgentProcess, session_id: str, options: tuple[ConfigOptionView, ...]
    ) -> dict[str, list[str]]:
        """The effort option's values with each model set, read off the probe's own session.

        The efforts on offer depend on the model (the seed's "model goes first"), so each other
        model is set once on this throwaway session and its effort option read from the answer.
        A model without an effort option offers none (``[]``); a model the agent refuses to set, or
        one past :data:`MAX_EFFORT_PROBES`, is left out: its efforts are not learnt (the catalogue
        then names none, and routing leaves the check to the turn).
        """
        model, effort = find_option(options, ConfigKind.MODEL), find_option(options, ConfigKind.EFFORT)
        if model is None:
            return {}
        found = {model.current_value: list(effort.values) if effort is not None else []}
        for value in model.values[:MAX_EFFORT_PROBES]:
            if value in found:
                continue
            change = proc.conn.set_config_option(config_id=model.id, session_id=session_id, value=value)
            try:
                response = await self._call(proc, change, "session/set_config_option", stage="probe")
            except acp.RequestError:
                continue
            now = find_option(options_from_acp(response.config_options), ConfigKind.EFFORT)
            found[value] = list(now.values) if now is not None else []
        return found

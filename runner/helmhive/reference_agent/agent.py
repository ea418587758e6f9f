"""helmhive-reference-agent: a small deterministic ACP agent over stdio, for tests and the demo.

It is a real Agent Client Protocol peer built on the ``acp`` package, and it is a reference
agent, not a model: its answers follow the fixed rule in :mod:`helmhive.reference_agent.rules`
(documented in ``docs/reference-agent.md``), including a governed change's plan, implementation
(edit directives in the request, applied to its cwd) and review. Environment variables select failure behaviours so
every path of a runner's adapter can be exercised:

``HELMHIVE_REFERENCE_AGENT_STATE_DIR``
    Directory for session state (``sessions/<id>.json``) and the received-method log
    (``methods.jsonl``). Without it, sessions live in memory only. A leading ``~/`` is the agent's
    ``$HOME`` (a binding's HOME, which its runner keeps between jobs).
``HELMHIVE_REFERENCE_AGENT_MODE``
    Comma-separated: ``hang`` (never answers a prompt, ignores cancel), ``stall`` (sends nothing,
    honours cancel), ``crash`` (exits with code 70 mid-turn), ``slow`` (a progress update every
    ``HELMHIVE_REFERENCE_AGENT_SLOW_INTERVAL`` seconds, ``HELMHIVE_REFERENCE_AGENT_SLOW_STEPS``
    times, before answering), ``refuse-config`` (refuses every session/set_config_option),
    ``unauthenticated`` (session/new and session/load fail with the ACP auth-required error),
    ``invalid-output`` (every JSON answer breaks the prompt's output contract), ``no-fork``
    (session forking is not advertised), ``no-load-session`` (``loadSession`` is not advertised, and
    session/load fails), ``no-compact-command`` (no ``compact`` command is
    advertised), ``compact-fails``, ``compact-silent``, ``compact-no-shrink`` (a broken
    ``/compact``: see :mod:`helmhive.reference_agent.context`).
``HELMHIVE_REFERENCE_AGENT_EFFORTS``
    The reasoning efforts each model offers, ``model=level,level;model=level`` (for example
    ``reference-small=low,medium``); a model not named offers ``low``, ``medium`` and ``high``. The
    session's effort option lists its current model's, and is absent for a model named with none.
``HELMHIVE_REFERENCE_AGENT_CONTEXT_SIZE``
    The context window the agent reports in its ``usage_update`` (default 10000 tokens).
``HELMHIVE_REFERENCE_AGENT_SESSION_PREFIX``
    Up to 32 characters ``[a-z0-9-]`` put in front of every session id, so a test can plant a
    canary in the native session id and search for it where it must never appear.
``HELMHIVE_REFERENCE_AGENT_TOKEN``
    A stand-in credential. The agent never prints it, unless
    ``HELMHIVE_REFERENCE_AGENT_LEAK_ON_CRASH=1`` makes a crash write it to stderr, to imitate a
    careless agent so that a client's redaction can be tested.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from typing import Any, NoReturn, cast

import acp
from acp import schema

from helmhive.reference_agent import actions, context, escapes, rules
from helmhive.reference_agent.session import (
    AUTH_METHOD_ID,
    CRASH_EXIT_CODE,
    ENV_TOKEN,
    LIMIT_EXIT_CODE,
    AgentSessions,
    Session,
    Settings,
    config_options,
    first_crash,
)
from helmhive.version import helmhive_version

__all__ = ["ReferenceAgent", "main", "serve"]


class ReferenceAgent:
    """The ACP agent. Method names and keyword arguments follow :class:`acp.Agent`."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._sessions = AgentSessions(settings.state_dir)
        self._conn: Any = None

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    # -- bookkeeping -----------------------------------------------------------------------
    def _log(self, method: str, **fields: object) -> None:
        state = self._settings.state_dir
        if state is None:
            return
        state.mkdir(parents=True, exist_ok=True)
        with (state / "methods.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"method": method, "pid": os.getpid(), **fields}, sort_keys=True) + "\n")

    async def _advertise(self, session_id: str) -> None:
        """Send the session's commands (``compact``, unless mode ``no-compact-command``)."""
        if not self._settings.compact_advertised:
            return
        command = schema.AvailableCommand(name=context.COMPACT_COMMAND, description=context.COMPACT_DESCRIPTION)
        update = schema.AvailableCommandsUpdate(
            session_update="available_commands_update", available_commands=[command]
        )
        await self._conn.session_update(session_id, update)

    async def _report_usage(self, session_id: str) -> None:
        """Send the session's context usage (:func:`~helmhive.reference_agent.context.context_used`)."""
        used = context.context_used(len(self._sessions[session_id].history))
        update = schema.UsageUpdate(session_update="usage_update", used=used, size=self._settings.context_size)
        await self._conn.session_update(session_id, update)

    def _options(self, session: Session) -> list[Any]:
        """The session's config options: its model's efforts (``HELMHIVE_REFERENCE_AGENT_EFFORTS``)."""
        efforts = self._settings.efforts_for(session.model)
        if efforts and session.effort not in efforts:  # a model that does not offer the held effort
            session.effort = rules.DEFAULT_EFFORT if rules.DEFAULT_EFFORT in efforts else efforts[0]
        return config_options(session, efforts)

    def _require_auth(self) -> None:
        if "unauthenticated" in self._settings.modes:
            raise acp.RequestError.auth_required({"authMethods": [AUTH_METHOD_ID]})

    # -- protocol --------------------------------------------------------------------------
    async def initialize(
        self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None, **kwargs: Any
    ) -> schema.InitializeResponse:
        # Names only, never values: lets a test check that the client passed an explicit environment.
        self._log("initialize", protocolVersion=protocol_version, envKeys=sorted(os.environ))
        return schema.InitializeResponse(
            protocol_version=min(protocol_version, acp.PROTOCOL_VERSION),
            agent_capabilities=schema.AgentCapabilities(
                load_session="no-load-session" not in self._settings.modes,
                session_capabilities=schema.SessionCapabilities(
                    resume=schema.SessionResumeCapabilities(),
                    fork=None if "no-fork" in self._settings.modes else schema.SessionForkCapabilities(),
                ),
            ),
            auth_methods=[
                schema.EnvVarAuthMethod(
                    type="env_var",
                    id=AUTH_METHOD_ID,
                    name="Reference token",
                    description="A stand-in credential; the reference agent never checks it.",
                    vars=[schema.AuthEnvVar(name=ENV_TOKEN, label="Reference token")],
                )
            ],
            agent_info=schema.Implementation(
                name=rules.AGENT_NAME, title=rules.AGENT_TITLE, version=helmhive_version()
            ),
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> schema.AuthenticateResponse:
        self._log("authenticate", methodId=method_id)
        self._require_auth()
        return schema.AuthenticateResponse()

    async def new_session(
        self, cwd: str, additional_directories: Any = None, mcp_servers: Any = None, **kwargs: Any
    ) -> schema.NewSessionResponse:
        self._log("session/new", cwd=cwd)
        self._require_auth()
        session_id = self._settings.session_prefix + uuid.uuid4().hex
        self._sessions[session_id] = Session(cwd=cwd)
        self._sessions.save(session_id)
        await self._advertise(session_id)
        options = self._options(self._sessions[session_id])
        return schema.NewSessionResponse(session_id=session_id, config_options=options)

    async def load_session(
        self,
        cwd: str,
        session_id: str,
        mcp_servers: Any = None,
        additional_directories: Any = None,
        **kwargs: Any,
    ) -> schema.LoadSessionResponse:
        self._log("session/load")
        self._require_auth()
        if "no-load-session" in self._settings.modes:
            raise acp.RequestError.method_not_found("session/load")
        session = self._sessions.restore(session_id)
        for turn in session.history:  # the protocol replays the conversation before answering
            await self._conn.session_update(session_id, acp.update_user_message_text(turn["prompt"]))
            await self._conn.session_update(session_id, acp.update_agent_message_text(turn["reply"]))
        await self._advertise(session_id)
        await self._report_usage(session_id)
        return schema.LoadSessionResponse(config_options=self._options(session))

    async def fork_session(
        self,
        session_id: str,
        cwd: str,
        additional_directories: Any = None,
        mcp_servers: Any = None,
        **kwargs: Any,
    ) -> schema.ForkSessionResponse:
        self._log("session/fork")
        self._require_auth()
        if "no-fork" in self._settings.modes:
            raise acp.RequestError.method_not_found("session/fork")
        base = self._sessions.restore(session_id)
        forked_id = self._settings.session_prefix + uuid.uuid4().hex
        self._sessions[forked_id] = Session(
            cwd=cwd, model=base.model, effort=base.effort, history=[dict(turn) for turn in base.history]
        )
        self._sessions.save(forked_id)
        await self._advertise(forked_id)
        return schema.ForkSessionResponse(session_id=forked_id, config_options=self._options(self._sessions[forked_id]))

    async def resume_session(
        self,
        session_id: str,
        cwd: str,
        additional_directories: Any = None,
        mcp_servers: Any = None,
        **kwargs: Any,
    ) -> schema.ResumeSessionResponse:
        self._log("session/resume")
        self._require_auth()
        session = self._sessions.restore(session_id)
        await self._advertise(session_id)
        return schema.ResumeSessionResponse(config_options=self._options(session))

    async def set_config_option(
        self, config_id: str, session_id: str, value: str | bool, **kwargs: Any
    ) -> schema.SetSessionConfigOptionResponse:
        self._log("session/set_config_option", configId=config_id, value=value)
        session = self._sessions.restore(session_id)
        offered = {
            rules.MODEL_OPTION_ID: rules.MODELS,
            rules.EFFORT_OPTION_ID: self._settings.efforts_for(session.model),
        }
        if config_id not in offered:
            raise acp.RequestError.invalid_params({"configId": config_id, "reason": "unknown config option"})
        if not isinstance(value, str) or value not in offered[config_id]:
            raise acp.RequestError.invalid_params({"configId": config_id, "reason": "value not offered"})
        if "refuse-config" in self._settings.modes:
            refusal = {"configId": config_id, "reason": "refused (refuse-config)"}
            raise acp.RequestError.invalid_params(refusal)
        if config_id == rules.MODEL_OPTION_ID:
            session.model = value
        else:
            session.effort = value
        self._sessions.save(session_id)
        return schema.SetSessionConfigOptionResponse(config_options=self._options(session))

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self._log("session/cancel")
        session = self._sessions.get(session_id)
        if session is not None:
            session.cancelled.set()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> schema.PromptResponse:
        self._log("session/prompt")
        if session_id not in self._sessions:
            reason = "unknown session; use session/new or session/load first"
            raise acp.RequestError.invalid_params({"reason": reason})
        session = self._sessions[session_id]
        session.cancelled = asyncio.Event()
        text = "\n".join(block.text for block in prompt if isinstance(block, schema.TextContentBlock))
        if context.is_compact_prompt(text, advertised=self._settings.compact_advertised):
            return await self._compact(session_id, session)
        directives = rules.parse_directives(text)
        # A DAEMON starts before the behaviour: a hanging agent leaves it running, as a hostile one would.
        early = {e.key: escapes.attempt(e, cwd=session.cwd) for e in escapes.parse_escapes(text) if e.early}
        behaviour = directives.behaviour or self._settings.behaviour()
        cancelled = schema.PromptResponse(stop_reason="cancelled")
        if behaviour == "hang":
            await asyncio.Event().wait()  # never answers, ignores session/cancel
        if behaviour == "stall":
            await session.cancelled.wait()
            return cancelled
        if behaviour == "crash" or (behaviour == "crash-once" and first_crash()):
            self._crash(session_id)
        if behaviour == "slow" and await self._slow(session_id, session):
            return cancelled
        tool_results: dict[str, bool] = {}
        for index, tool in enumerate(directives.tools):
            tool_results[tool] = await self._ask_permission(session_id, f"tool-{index}", tool)
            if session.cancelled.is_set():
                return cancelled
        turn = len(session.history) + 1
        self._record_prompt(text, turn)
        governed = rules.parse_governed(text)
        # Edit directives are applied in the implementation stage only, never in planning or review.
        implementing = governed is not None and governed.stage == "implementation"
        edits = actions.apply_edits(session.cwd, governed) if governed is not None and implementing else ()
        home_files = {name: actions.write_home(name) for name in directives.home_files}
        try:
            resources = actions.use_resources(directives.resources())
        except (MemoryError, OSError) as exc:
            self._die(exc)
        reply = rules.render_reply(
            text,
            turn=turn,
            model=session.model,
            effort=session.effort,
            tool_results=tool_results,
            file_results={name: actions.write_direct(session.cwd, name) for name in directives.write_files},
            acp_file_results={
                n: await self._write_via_client(session_id, session.cwd, n) for n in directives.acp_write_files
            },
            connect_results={port: actions.connect(port) for port in directives.connects},
            read_results={path: actions.read_direct(path) for path in directives.read_files},
            edit_results=edits,
            invalid_output="invalid-output" in self._settings.modes,
            home_file_results=home_files,
            resource_results=resources,
            escape_results={
                e.key: early[e.key] if e.key in early else escapes.attempt(e, cwd=session.cwd)
                for e in escapes.parse_escapes(text)
            },
        )
        await self._conn.session_update(session_id, acp.update_agent_message_text(reply))
        session.history.append({"prompt": text, "reply": reply})
        self._sessions.save(session_id)
        await self._report_usage(session_id)
        return schema.PromptResponse(stop_reason="end_turn")

    async def _compact(self, session_id: str, session: Session) -> schema.PromptResponse:
        """Run the advertised ``/compact`` (or break it, as the modes ask)."""
        behaviour = context.compact_behaviour(self._settings.modes)
        self._log("compact", behaviour=behaviour)
        if behaviour == "fails":
            raise acp.RequestError.internal_error({"reason": "compaction failed (compact-fails)"})
        if behaviour == "silent":
            await session.cancelled.wait()
            return schema.PromptResponse(stop_reason="cancelled")
        turns = len(session.history)
        summary = context.summary_turn(turns)
        if behaviour != "no-shrink":
            session.history = [dict(summary.as_history())]
            self._sessions.save(session_id)
        await self._conn.session_update(session_id, acp.update_agent_message_text(summary.reply))
        await self._report_usage(session_id)
        return schema.PromptResponse(stop_reason="end_turn")

    # -- behaviours --------------------------------------------------------------------------
    def _record_prompt(self, text: str, turn: int) -> None:
        """Keep every prompt in ``prompts.jsonl`` (state dir only), so a test can read what the agent was told."""
        state = self._settings.state_dir
        if state is None:
            return
        with (state / "prompts.jsonl").open("a", encoding="utf-8") as fh:
            entry = {"pid": os.getpid(), "turn": turn, "sha256": rules.prompt_digest(text), "prompt": text}
            fh.write(json.dumps(entry, sort_keys=True) + "\n")

    async def _write_via_client(self, session_id: str, cwd: str, name: str) -> str:
        try:
            await self._conn.write_text_file(
                session_id=session_id, path=os.path.join(cwd, name), content=f"{rules.AGENT_NAME} wrote this\n"
            )
        except acp.RequestError:
            return "refused"
        return "written"

    def _die(self, exc: BaseException) -> NoReturn:
        """Die of a resource limit as a runtime would: its error on stderr, exit code 1."""
        sys.stderr.write(f"{rules.AGENT_NAME}: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(LIMIT_EXIT_CODE)

    def _crash(self, session_id: str) -> None:
        token = os.environ.get(ENV_TOKEN, "")
        detail = f" (token {token})" if self._settings.leak_on_crash and token else ""
        sys.stderr.write(f"{rules.AGENT_NAME}: crashing mid-turn on request{detail}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)

    async def _slow(self, session_id: str, session: Session) -> bool:
        """Send progress updates at a steady pace; True if cancelled meanwhile."""
        for step in range(1, self._settings.slow_steps + 1):
            update = acp.update_agent_thought_text(f"working ({step}/{self._settings.slow_steps})")
            await self._conn.session_update(session_id, update)
            try:
                await asyncio.wait_for(session.cancelled.wait(), timeout=self._settings.slow_interval)
            except TimeoutError:
                continue
            return True
        return False

    async def _ask_permission(self, session_id: str, call_id: str, tool: str) -> bool:
        kind = rules.tool_kind(tool)
        start = acp.start_tool_call(call_id, tool, kind=kind, status="pending")
        start.field_meta = {"toolName": tool}
        await self._conn.session_update(session_id, start)
        response = await self._conn.request_permission(
            session_id=session_id,
            tool_call=schema.ToolCallUpdate(tool_call_id=call_id, title=tool, kind=kind, field_meta={"toolName": tool}),
            options=[
                schema.PermissionOption(option_id="allow", name="Allow once", kind="allow_once"),
                schema.PermissionOption(option_id="reject", name="Reject once", kind="reject_once"),
            ],
        )
        outcome = response.outcome
        granted = isinstance(outcome, schema.AllowedOutcome) and outcome.option_id == "allow"
        done = acp.update_tool_call(call_id, status="completed" if granted else "failed")
        await self._conn.session_update(session_id, done)
        return granted


async def serve(settings: Settings) -> None:
    """Serve one client over this process's stdin and stdout until it disconnects."""
    await acp.run_agent(cast(acp.Agent, ReferenceAgent(settings)), use_unstable_protocol=True)


def main() -> None:
    """Console entry point: ``helmhive-reference-agent``."""
    asyncio.run(serve(Settings.from_env(dict(os.environ))))


if __name__ == "__main__":
    main()

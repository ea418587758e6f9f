"""Running the Claude CLI: its configuration, short bounded commands, and a turn's stdout under a watchdog.

:func:`run_short` runs ``claude <args>`` with no stdin for the probe (``--version``, ``auth
status``, ``--help``, the model resolution runs), killed (and reaped) when ``request_timeout_s``
passes or the call is cancelled.
:func:`read_turn` consumes a turn's stdout line by line into a
:class:`~helmhive.runner.adapters.claude_stream.ClaudeStream`; no line for the idle window, or
the caller's cancel, sends SIGINT to the turn's process group, then SIGKILL after
``cancel_grace_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from helmhive.runner.adapters.base import CancelOrigin
from helmhive.runner.adapters.claude_stream import ClaudeStream, consume_line

__all__ = ["ClaudeCliConfig", "read_turn", "run_short", "send_signal"]


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


async def run_short(
    config: ClaudeCliConfig, *args: str, env: dict[str, str] | None = None, cwd: str | None = None
) -> tuple[int, str, str]:
    """Run the CLI with ``args`` (no stdin), bounded by ``request_timeout_s``; killed on timeout or cancel."""
    proc = await asyncio.create_subprocess_exec(
        config.path,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=config.spawn_env() if env is None else env,
        cwd=cwd or config.cwd,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), config.request_timeout_s)
    except BaseException:
        # Timed out, or cancelled (the probe's own timeout, the runner stopping): never leave the
        # CLI running, nor a thread of the child watcher waiting for it while the process exits.
        send_signal(proc, signal.SIGKILL)
        await asyncio.shield(proc.wait())
        raise
    return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def send_signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    """Signal the process group a CLI run leads (it was started in a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def read_turn(
    proc: asyncio.subprocess.Process,
    stream: ClaudeStream,
    cancel: asyncio.Event | None,
    *,
    idle_s: float,
    grace_s: float,
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
            deadline = last + idle_s if interrupted_at is None else interrupted_at + grace_s
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
                consume_line(line, stream)
                continue
            line_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await line_task
            if interrupted_at is None:
                caller = cancel_wait is not None and cancel_wait in done
                origin = CancelOrigin.CALLER if caller else CancelOrigin.WATCHDOG
                interrupted_at = loop.time()
                send_signal(proc, signal.SIGINT)
                continue
            send_signal(proc, signal.SIGKILL)
            return origin, True
    finally:
        if cancel_wait is not None:
            cancel_wait.cancel()

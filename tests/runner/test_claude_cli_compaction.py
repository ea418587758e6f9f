"""The runner's compaction policy over the real Claude CLI (npm ``@anthropic-ai/claude-code``).

The CLI runs real ``--print --output-format stream-json`` turns against a deterministic Messages
API on loopback (:mod:`.fake_messages_api`: its usage follows what the CLI sends, a ``PAD <n>``
line counting ``n`` tokens). A first turn tells the test the model's context window; a resumed
second turn pads the session to 20% of it, past a 10% watermark. Then
:func:`helmhive.runner.sessions.compaction.run_compaction` runs with the Claude CLI adapter:

- the CLI compacts with its own ``/compact`` on the same session: the ``compact_boundary``'s
  ``post_tokens`` is the smaller context, and the next resumed turn sends the summary, not the pad;
- when the summary call fails (HTTP 400), the provider stays silent past the window, or the pool
  set ``DISABLE_COMPACT`` (the CLI lists ``compact`` but refuses it), the session is archived and a
  fresh one is seeded with the profile's instructions.

The API key given to the CLI and the CLI's session ids appear in nothing a compaction reports.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from helmhive.api.runnerpool import CompactionSettings
from helmhive.api.session import CompactionMethod
from helmhive.runner.adapters import TurnOutcome, TurnRequest, TurnResult
from helmhive.runner.adapters.claude_cli import ClaudeCliAdapter, ClaudeCliConfig
from helmhive.runner.sessions.compaction import Compaction, run_compaction

from .fake_messages_api import ANSWER, FakeMessagesApi, fake_messages_api
from .npm_agents import CLAUDE_CODE, npm_bin

KEY = "sk-ant-canary-c1ccompact7e3"
INSTRUCTIONS = "Keep answers short. Claude compaction marker 5be2."
SETTINGS = CompactionSettings(watermark_percent=10, command_timeout_seconds=5)


def _adapter(api: FakeMessagesApi, home: Path, **env: str) -> ClaudeCliAdapter:
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": api.url,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    config = ClaudeCliConfig(
        path=str(npm_bin(*CLAUDE_CODE)),
        env=base | env,
        secret_env={"ANTHROPIC_API_KEY": SecretStr(KEY)},
        idle_timeout_s=120,
        cancel_grace_s=5,
    )
    return ClaudeCliAdapter(config)


async def _padded_session(adapter: ClaudeCliAdapter, workdir: str) -> TurnResult:
    """Two turns of one session; the second leaves it at about 20% of the model's window."""
    first = await adapter.run_turn(TurnRequest(prompt="Hello.", cwd=workdir))
    assert first.ok and first.text == ANSWER, first
    assert first.context_size is not None and first.context_used is not None, first
    pad = first.context_size // 5
    request = TurnRequest(prompt=f"Remember this. PAD {pad}", cwd=workdir, session_id=first.native_session_id)
    second = await adapter.run_turn(request)
    assert second.ok and second.session_resumed, second
    assert second.context_used is not None and second.context_used > pad  # the pad and the history
    assert second.context_size == first.context_size
    return second


def _no_secret(done: Compaction, turns: list[TurnResult]) -> None:
    ids = {t.native_session_id.get_secret_value() for t in turns if t.native_session_id is not None}
    shown = json.dumps(done.status(job="job-1", now=dt.datetime.now(dt.UTC))) + done.describe() + done.reason
    shown += json.dumps([t.model_dump(mode="json", exclude={"native_session_id"}) for t in turns])
    assert ids and not [i for i in ids if i in shown]
    assert KEY not in shown


async def test_the_cli_compacts_its_own_session_with_slash_compact(tmp_path: Path, workdir: str) -> None:
    with fake_messages_api(api_key=KEY) as api:
        adapter = _adapter(api, tmp_path)
        second = await _padded_session(adapter, workdir)
        before = second.context_used
        assert before is not None
        done = await run_compaction(
            adapter=adapter,
            turn=second,
            request=TurnRequest(prompt="x", cwd=workdir),
            settings=SETTINGS,
            instructions=INSTRUCTIONS,
            cancel=asyncio.Event(),
        )
        assert done is not None and done.method is CompactionMethod.COMPACT_COMMAND, done
        assert done.used_before == before and done.used_after is not None and done.used_after < before // 10
        assert done.session_id == second.native_session_id  # the same session, smaller
        # The checkpoint turn on the same session, then one summary call made by the CLI itself.
        assert api.kinds() == ["turn", "turn", "turn", "summary"]
        after = await adapter.run_turn(TurnRequest(prompt="Go on.", cwd=workdir, session_id=done.session_id))
        assert after.ok and after.session_resumed
        # The resumed session sends the summary, not the padded history: far below the watermark.
        assert api.requests[-1].kind == "turn" and api.requests[-1].input_tokens < before // 10
        assert after.context_used is not None and after.context_used < before // 10
    assert {seen.key for seen in api.requests} == {"expected"}
    _no_secret(done, [second, after])


@pytest.mark.parametrize(
    ("mode", "env", "why", "summaries"),
    [
        ("error", {}, "the compact command failed (ProtocolError)", True),
        ("hang", {}, "stayed silent past its window (5s, or the idle timeout if shorter)", True),
        ("ok", {"DISABLE_COMPACT": "1"}, "no compact command advertised", False),
    ],
)
async def test_otherwise_the_session_is_archived_for_a_fresh_one(
    tmp_path: Path, workdir: str, mode: str, env: dict[str, str], why: str, summaries: bool
) -> None:
    with fake_messages_api(api_key=KEY) as api:
        api.compact, api.watch = mode, (INSTRUCTIONS,)
        adapter = _adapter(api, tmp_path, **env)
        second = await _padded_session(adapter, workdir)
        assert ("compact" in second.commands) is summaries  # DISABLE_COMPACT: not offered to the policy
        done = await run_compaction(
            adapter=adapter,
            turn=second,
            request=TurnRequest(prompt="x", cwd=workdir),
            settings=SETTINGS,
            instructions=INSTRUCTIONS,
            cancel=asyncio.Event(),
        )
        assert done is not None and done.method is CompactionMethod.ARCHIVE, done
        assert done.reason.endswith(why), done.reason
        assert done.session_id is not None and second.native_session_id is not None
        assert done.session_id.get_secret_value() != second.native_session_id.get_secret_value()
        assert ("summary" in api.kinds()) is summaries
        # The fresh session was seeded with the system prompt and is small.
        seeds = [seen for seen in api.requests if seen.found == (INSTRUCTIONS,)]
        assert len(seeds) == 1 and seeds[0].kind == "turn"
        assert done.used_after is not None and done.used_before is not None
        assert done.used_after < done.used_before // 10
        after = await adapter.run_turn(TurnRequest(prompt="Go on.", cwd=workdir, session_id=done.session_id))
        assert after.outcome is TurnOutcome.COMPLETED and after.session_resumed
        assert api.requests[-1].found == (INSTRUCTIONS,)  # the fresh session's history, not the old one
        assert api.requests[-1].input_tokens < done.used_before // 10
    _no_secret(done, [second, after])

"""The runner's own inputs, fuzzed: a malformed ``runner.json``, and an agent that breaks ACP.

* ``runner.json`` (what the operator writes from a RunnerPool, see
  :func:`helmhive.policy.runners.pool.build_runner_config`) is mutated and garbled;
  :func:`helmhive.runner.config.load_config` returns a configuration or raises ``ConfigError``
  whose every problem names a field or variable, nothing else. The real program
  (``helmhive runner run``) exits with its configuration code and no traceback.
* The runner's ACP client drives ``garbage_agent.py``, a real process over stdio that answers
  with invalid JSON, wrong ids, wrong shapes, unknown methods, invalid UTF-8, exits and silence.
  ``probe`` and ``run_turn`` always come back with a report or an outcome, never an exception,
  and never show the credential the agent was given.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from helmhive.api.common import JobKind
from helmhive.api.profile import ProfileSpec
from helmhive.api.reasons import Reason
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.policy.envelopes import ENVELOPES
from helmhive.policy.profiles.narrowing import decide_profile
from helmhive.policy.runners.pool import PoolRef, build_runner_config
from helmhive.runner.adapters import AcpAdapter, AcpAdapterConfig, TurnOutcome, TurnRequest
from helmhive.runner.config import ENV, ConfigError, load_config
from helmhive.runner.jobs.context import parse_assigned_job
from helmhive.runner.jobs.status import JobEnding
from helmhive.runner.program.main import ExitCode

from .budget import Tally, fuzz_settings
from .mutants import EXAMPLES, json_values, walk

AGENT = Path(__file__).with_name("garbage_agent.py")
CANARY = "hh-canary-credential-7f3a9c"


def runner_json_seeds() -> list[dict[str, Any]]:
    pools = yaml.safe_load_all((EXAMPLES / "runnerpools.yaml").read_text(encoding="utf-8"))
    pool = PoolRef(name="pool-a", namespace="team-a", uid="0b9e6a4e-0000-4000-8000-00000000000a")
    return [build_runner_config(pool, RunnerPoolSpec.model_validate(p["spec"])) for p in pools]


def _environ(config: Path, credential: Path) -> dict[str, str]:
    return {
        ENV["runner_name"]: "pool-a-0",
        ENV["namespace"]: "team-a",
        ENV["pool"]: "pool-a",
        ENV["config_path"]: str(config),
        ENV["credential_file"]: str(credential),
    }


@st.composite
def runner_json_texts(draw: st.DrawFn) -> str:
    doc: Any = copy.deepcopy(draw(st.sampled_from(runner_json_seeds())))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        paths = [p for p, _ in walk(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = doc
        for segment in path[:-1]:
            parent = parent[segment]
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(json_values)
        elif action == "drop":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(json_values)
    text = json.dumps(doc)
    garble = draw(st.sampled_from(["none", "none", "truncate", "nest", "bom", "yaml", "empty"]))
    if garble == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif garble == "nest":
        depth = draw(st.sampled_from([50, 5000, 100000]))
        text = '{"provider": ' + "[" * depth + "]" * depth + "}"
    elif garble == "bom":
        text = "\ufeff" + text
    elif garble == "yaml":
        text = yaml.safe_dump(doc)
    elif garble == "empty":
        text = ""
    return text


def _problems_name_their_field(problems: list[str]) -> bool:
    known = ("runner.json", *ENV.values())
    return bool(problems) and all(p.startswith(known) for p in problems)


def test_malformed_runner_json_is_refused_with_field_paths(tmp_path: Path) -> None:
    tally = Tally("runner: runner.json, load_config")
    credential = tmp_path / "credential"
    credential.write_text(CANARY, encoding="utf-8")

    @fuzz_settings(300)
    @given(text=runner_json_texts())
    def run(text: str) -> None:
        config = tmp_path / "runner.json"
        config.write_text(text, encoding="utf-8")
        try:
            load_config(
                environ=_environ(config, credential), read_text=lambda path: Path(path).read_text(encoding="utf-8")
            )
        except ConfigError as exc:
            assert _problems_name_their_field(exc.problems), exc.problems
            assert CANARY not in str(exc)
            tally.add("refused")
        else:
            tally.add("accepted")
        tally.add("tried")

    run()
    record = tally.report()
    assert record.get("refused", 0) > 0 and record.get("accepted", 0) > 0, record


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("not JSON", b"provider: anthropic\n"),
        ("invalid UTF-8", b'{"provider": "\xff\xfe"}'),
        ("nested too deeply", b'{"provider": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
        ("wrong types", json.dumps({"provider": 5, "adapter": [], "concurrency": "two"}).encode()),
        ("unknown field", json.dumps({"provider": "anthropic", "adapter": {"type": "acp"}, "x": 1}).encode()),
        ("a directory", None),
    ],
)
def test_the_runner_program_exits_with_its_config_code_and_no_traceback(
    tmp_path: Path, name: str, content: bytes | None
) -> None:
    config = tmp_path / "runner.json"
    if content is None:
        config.mkdir()
    else:
        config.write_bytes(content)
    credential = tmp_path / "credential"
    credential.write_text(CANARY, encoding="utf-8")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), **_environ(config, credential)}
    done = subprocess.run(
        [sys.executable, "-m", "helmhive", "runner", "run"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    output = done.stdout + done.stderr
    assert "Traceback" not in output, f"{name}: {output[-3000:]}"
    assert done.returncode == ExitCode.CONFIG, f"{name}: exit {done.returncode}: {output[-3000:]}"
    assert "invalid configuration" in output and "runner.json" in output, output[-3000:]
    assert CANARY not in output


# --- ACP ------------------------------------------------------------------------------------------

VALID = {
    "initialize": '{"jsonrpc":"2.0","id":{id},"result":{"protocolVersion":1,"agentCapabilities":{},"authMethods":[]}}',
    "session/new": '{"jsonrpc":"2.0","id":{id},"result":{"sessionId":"s-1"}}',
    "update": '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":'
    '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hello"}}}}',
    "session/prompt": '{"jsonrpc":"2.0","id":{id},"result":{"stopReason":"end_turn"}}',
}
GARBAGE: tuple[Any, ...] = (
    "not json at all",
    "{",
    "[]",
    "null",
    "42",
    '"a string"',
    '{"jsonrpc":"2.0"}',
    '{"jsonrpc":"2.0","id":{id}}',
    '{"jsonrpc":"2.0","id":{id},"result":null}',
    '{"jsonrpc":"2.0","id":{id},"result":[]}',
    '{"jsonrpc":"2.0","id":{id},"error":{"code":"x","message":5}}',
    '{"jsonrpc":"2.0","id":{id},"error":{"code":-32000,"message":"' + CANARY + '"}}',
    '{"jsonrpc":"2.0","id":{id},"result":{"protocolVersion":"one"}}',
    '{"jsonrpc":"2.0","id":{id},"result":{"protocolVersion":99,"agentCapabilities":{}}}',
    '{"jsonrpc":"2.0","id":{id},"result":{"sessionId":5}}',
    '{"jsonrpc":"2.0","id":{id},"result":{"stopReason":"bogus"}}',
    '{"jsonrpc":"2.0","id":999999,"result":{}}',
    '{"jsonrpc":"1.0","id":{id},"result":{}}',
    '{"jsonrpc":"2.0","method":"session/update","params":{"garbage":1}}',
    '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":{"sessionUpdate":"agent_message_chunk",'
    '"content":{"type":"text","text":"' + CANARY + '"}}}}',
    '{"jsonrpc":"2.0","id":77,"method":"fs/read_text_file","params":{"sessionId":"s-1","path":"/etc/passwd"}}',
    '{"jsonrpc":"2.0","id":78,"method":"session/request_permission","params":{}}',
    '{"jsonrpc":"2.0","id":79,"method":"evil/method","params":{}}',
    '{"jsonrpc":"2.0","method":"evil/notification"}',
    {"raw": "\udcff\udcfe not utf-8\n"},
    {"raw": "x" * 200_000 + "\n"},
    {"raw": '{"jsonrpc":"2.0","id":'},
    {"stderr": "agent says: " + CANARY},
    {"exit": 3},
    {"sleep": 3},
)


@st.composite
def agent_plans(draw: st.DrawFn) -> list[list[Any]]:
    """A reply for each request: valid until the step where garbage begins, then garbage."""
    steps = ["initialize", "session/new", "session/prompt"]
    broken = draw(st.integers(min_value=0, max_value=len(steps) - 1))
    plan: list[list[Any]] = []
    for index, step in enumerate(steps):
        if index < broken:
            plan.append([VALID[step]])
            continue
        junk = draw(st.lists(st.sampled_from(GARBAGE), min_size=1, max_size=4))
        tail = draw(st.sampled_from([[], [VALID[step]], [VALID["update"], VALID[step]]]))
        plan.append([*junk, *tail])
    return plan


def test_an_agent_that_breaks_acp_never_breaks_the_runner(tmp_path: Path) -> None:
    tally = Tally("runner: ACP agent speaking garbage")
    workdir = tmp_path / "work"
    workdir.mkdir()

    async def drive(plan: list[list[Any]]) -> None:
        adapter = AcpAdapter(
            AcpAdapterConfig(
                command=sys.executable,
                args=(str(AGENT),),
                env={"FUZZ_AGENT_PLAN": json.dumps(plan), "PATH": os.environ.get("PATH", "")},
                secret_env={"FUZZ_AGENT_TOKEN": SecretStr(CANARY)},
                idle_timeout_s=1.0,
                cancel_grace_s=0.5,
                request_timeout_s=2.0,
                probe_cwd=str(workdir),
            )
        )
        try:
            report = await asyncio.wait_for(adapter.probe(), timeout=60)
            assert CANARY not in repr(report.model_dump())
            tally.add(f"probe {report.auth.value}")
            result = await asyncio.wait_for(adapter.run_turn(TurnRequest(prompt="hi", cwd=str(workdir))), timeout=60)
            assert isinstance(result.outcome, TurnOutcome)
            assert CANARY not in repr(result.model_dump()), result
            tally.add(f"turn {result.outcome.value}")
        finally:
            await asyncio.wait_for(adapter.close(), timeout=30)
        assert adapter.process_id is None

    raised: list[str] = []

    @fuzz_settings(30)
    @given(plan=agent_plans())
    def run(plan: list[list[Any]]) -> None:
        tally.add("tried")
        try:
            asyncio.run(drive(plan))
        except Exception as exc:  # every one is listed at the end, with the plan that made it
            tally.add("raised")
            raised.append(f"{type(exc).__name__}: {str(exc)[:300]}\n  plan: {json.dumps(plan)[:600]}")

    run()
    record = tally.report()
    assert record["tried"] > 0
    assert not raised, f"{len(raised)} of {record['tried']} agents broke the runner's ACP client:\n" + "\n".join(raised)


# --- assignments --------------------------------------------------------------------------------


def routed_job() -> dict[str, Any]:
    """A job as the operator leaves it for a runner: spec, the bound profile (snapshot) and the assignment."""
    kind = JobKind.CONNECTION_TEST
    profile = ProfileSpec.model_validate(
        {"envelope": kind.value, "purpose": "fuzz", "providerMappings": [{"provider": "reference"}]}
    )
    effective = decide_profile(profile=profile, envelope=ENVELOPES[kind]).effective
    assert effective is not None
    return {
        "spec": {
            "workspace": "payments",
            "jobKind": kind.value,
            "profile": "probe",
            "request": {"title": "t", "prompt": "p"},
        },
        "status": {
            "profile": {
                "name": "probe",
                "revision": "probe-r1",
                "hash": "sha256:" + "0" * 64,
                "snapshot": effective.to_wire(),
                "boundAt": "2026-12-01T10:00:00Z",
            },
            "assignment": {
                "runner": "pool-a-0",
                "pool": "pool-a",
                "provider": "reference",
                "model": "reference-small",
                "modelSource": "mapping",
                "mappingIndex": 0,
                "assignedAt": "2026-12-01T10:00:01Z",
            },
        },
    }


_MISSING = (
    ("status", "profile"),
    ("status", "profile", "name"),
    ("status", "profile", "revision"),
    ("status", "profile", "snapshot"),
    ("status", "assignment"),
    ("status", "assignment", "model"),
    ("status", "assignment", "runner"),
    ("status",),
)


@st.composite
def routed_job_mutants(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A routed job with a missing or broken profile binding or assignment; True when it must be refused."""
    job = routed_job()
    choice = draw(st.sampled_from(["missing", "wrong", "random"]))
    if choice == "missing":
        path = draw(st.sampled_from(_MISSING))
        parent: Any = job
        for segment in path[:-1]:
            parent = parent[segment]
        del parent[path[-1]]
        # A missing revision string is refused; so is any missing required part.
        return job, True
    if choice == "wrong":
        snapshot = job["status"]["profile"]["snapshot"]
        field, value = draw(
            st.sampled_from(
                [
                    ("envelope", "change-review"),  # bound to another job kind's profile
                    ("tools", ["fly"]),
                    ("filesystem", "everything"),
                    ("providerMappings", "reference"),
                ]
            )
        )
        snapshot[field] = value
        return job, True
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p, _ in walk(job["status"]) if p]
        path = draw(st.sampled_from(paths))
        parent = job["status"]
        for segment in path[:-1]:
            parent = parent[segment]
        parent[path[-1]] = draw(json_values)
    return job, False


def test_assignments_naming_missing_or_broken_profiles_are_failed_closed() -> None:
    tally = Tally("runner: assignments (parse_assigned_job)")

    @fuzz_settings(300)
    @given(case=routed_job_mutants())
    def run(case: tuple[dict[str, Any], bool]) -> None:
        job, must_refuse = case
        outcome = parse_assigned_job(job)
        tally.add("tried")
        if isinstance(outcome, JobEnding):
            assert not outcome.succeeded and outcome.reason is Reason.INVALID_SPEC and outcome.message, outcome
            tally.add("refused")
        else:
            assert not must_refuse, job
            assert outcome.binding.snapshot.envelope is outcome.spec.job_kind
            tally.add("accepted")

    run()
    assert parse_assigned_job(routed_job()).__class__.__name__ == "ParsedJob"
    record = tally.report()
    assert record.get("refused", 0) > 0, record

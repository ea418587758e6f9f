"""A ``claude-cli`` runner compacts a resumed chain with the CLI's own ``/compact``, end to end.

A real runner program whose adapter is the real Claude CLI (npm ``@anthropic-ai/claude-code``),
with ``credentialIsolation: Proxy``: each job's CLI runs in the job's sandbox and reaches the
stand-in Messages API (:mod:`.fake_messages_api`, over TLS) only through the runner's egress
proxy, which adds the real key. The first job's prompt pads its session past the pool's 10%
watermark (15% of the 1M-token window the CLI gives the job's model), so after that job the
runner sends ``/compact`` on the same session; the binding counts it, the job gets a
``SessionCompacted`` Event, and the next job resumes the compacted session (its request carries
the CLI's summary, not the pad). The CLI's session id is stored in the runner's sessions Secret
and nowhere else: not in job status, Events, the binding or the log.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from helmhive.api.common import JobKind

from .execution_harness import ExecutionRig, condition
from .fake_messages_api import fake_messages_api
from .npm_agents import CLAUDE_CODE, npm_bin, npm_root
from .program_harness import CANARY

PAD = 150000
PROFILE = {
    "session": {"policy": "resume"},
    "instructions": "Answer in one line.",
    "providerMappings": [{"provider": "anthropic"}],
}


def _config(api_url: str, ca_file: Path) -> dict[str, Any]:
    return {
        "provider": "anthropic",
        "credentialEnvName": "ANTHROPIC_API_KEY",
        "credentialIsolation": "Proxy",
        "egress": {"upstream": api_url, "caBundle": str(ca_file)},
        "adapter": {"type": "claude-cli", "claudeCli": {"path": str(npm_bin(*CLAUDE_CODE))}},
        "sandbox": {"readPaths": [str(npm_root())]},
        "compaction": {"watermarkPercent": 10, "commandTimeoutSeconds": 60},
    }


def _run(execution: ExecutionRig, name: str, prompt: str) -> dict[str, Any]:
    execution.create_job(
        name, runner="pool-a-0", kind=JobKind.IMPLEMENTATION_PROBE, prompt=prompt, profile_spec=PROFILE, timeout=240
    )
    job = execution.wait_finished(name, timeout=240)
    assert condition(job, "Succeeded")["status"] == "True", job["status"]
    return job


def test_a_claude_cli_runner_compacts_its_chain_with_slash_compact(execution: ExecutionRig, tmp_path: Path) -> None:
    with fake_messages_api(api_key=CANARY, tls_dir=tmp_path / "pki") as api:
        assert api.ca_file is not None
        runner = execution.start_runner(config=_config(api.url, api.ca_file))
        first = _run(execution, "first", f"Remember this. PAD {PAD}")
        binding = first["status"]["session"]["binding"]
        execution.wait_events("first", "SessionCompacted", timeout=120)
        status = execution.binding(binding)["status"]
        assert status["compactions"] == 1, status
        last = status["lastCompaction"]
        assert last["method"] == "compact-command" and last["job"] == "first", last
        assert last["usedBefore"] > PAD and last["usedBefore"] * 100 >= 10 * last["contextSize"], last
        assert last["usedAfter"] < last["usedBefore"] // 10, last
        assert api.kinds().count("summary") == 1  # the CLI's own summary call, through the proxy

        second = _run(execution, "second", "Go on.")
        assert second["status"]["session"]["binding"] == binding
        turn = [seen for seen in api.requests if seen.kind == "turn"][-1]
        assert turn.input_tokens < PAD // 2  # the resumed session holds the summary, not the pad
        assert execution.binding(binding)["status"]["compactions"] == 1  # below the watermark now
    assert {seen.key for seen in api.requests} == {"expected"}  # the proxy added the real key

    stored = base64.b64decode(execution.sessions_data("pool-a-0")[binding]).decode()
    assert stored  # the CLI's session id, where it belongs
    events = execution.kube.core.list_namespaced_event(execution.namespace).items
    places = {
        "job status": json.dumps([execution.job(name)["status"] for name in ("first", "second")]),
        "events": json.dumps([(e.reason, e.message) for e in events]),
        "runner log": runner.proc.raw_log(),
        "session binding": json.dumps(execution.binding(binding)),
    }
    assert {where: stored in text for where, text in places.items()} == dict.fromkeys(places, False)
    assert {where: CANARY in text for where, text in places.items()} == dict.fromkeys(places, False)

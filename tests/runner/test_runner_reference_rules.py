"""The reference agent's documented reply rule, tested as pure functions."""

from __future__ import annotations

import hashlib
import json

from helmhive.runner import reference_rules as rules


def test_directives_are_read_from_magic_lines() -> None:
    prompt = "\n".join(
        [
            "Fix it",
            "  USE-TOOL: Bash",
            "USE-TOOL: Read",
            "USE-TOOL: Bash",
            "OUTPUT-CONTRACT: json",
            "REFERENCE-AGENT: slow",
        ]
    )
    directives = rules.parse_directives(prompt)
    assert directives.json_output is True
    assert directives.tools == ("Bash", "Read")
    assert directives.behaviour == "slow"


def test_unknown_or_inline_directives_are_ignored() -> None:
    directives = rules.parse_directives("say USE-TOOL: Bash\nREFERENCE-AGENT: explode\nOUTPUT-CONTRACT: yaml")
    assert directives == rules.Directives()


def test_digest_is_sha256_prefix() -> None:
    assert rules.prompt_digest("héllo") == hashlib.sha256("héllo".encode()).hexdigest()[:16]


def test_text_reply_states_turn_model_effort_digest_and_tools() -> None:
    prompt = "Explain the build\nUSE-TOOL: Bash"
    reply = rules.render_reply(prompt, turn=3, model="reference-large", effort="high", tool_results={"Bash": False})
    assert reply.splitlines() == [
        "helmhive-reference-agent: deterministic reference agent, not a model.",
        "turn=3 model=reference-large effort=high",
        f"prompt sha256={rules.prompt_digest(prompt)} lines=2 words=5",
        "first line: Explain the build",
        "tool Bash: denied",
    ]


def test_json_reply_is_deterministic_and_derived_from_prompt() -> None:
    prompt = "OUTPUT-CONTRACT: json\nList the services"
    first = rules.render_reply(prompt, turn=1, model="reference-small", effort="low", tool_results={})
    again = rules.render_reply(prompt, turn=1, model="reference-small", effort="low", tool_results={})
    assert first == again
    data = json.loads(first)
    assert data == {
        "agent": "helmhive-reference-agent",
        "turn": 1,
        "model": "reference-small",
        "effort": "low",
        "promptSha256": rules.prompt_digest(prompt),
        "promptLines": 2,
        "promptWords": 5,
        "firstLine": "List the services",
        "tools": {},
    }
    other = rules.render_reply(prompt + "!", turn=1, model="reference-small", effort="low", tool_results={})
    assert json.loads(other)["promptSha256"] != data["promptSha256"]

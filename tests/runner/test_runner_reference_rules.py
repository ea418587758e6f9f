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


def test_new_directives_are_read_and_unsafe_ones_ignored() -> None:
    prompt = "\n".join(
        [
            "Do things",
            "WRITE-FILE: a.txt",
            "WRITE-FILE: ../escape.txt",
            "ACP-WRITE-FILE: b.txt",
            "CONNECT: 8443",
            "CONNECT: 99999",
            "READ-FILE: /etc/hostname",
            "READ-FILE: relative",
            "PAD-REPLY: 12",
            "REFERENCE-AGENT: invalid-output",
        ]
    )
    directives = rules.parse_directives(prompt)
    assert directives.write_files == ("a.txt",)
    assert directives.acp_write_files == ("b.txt",)
    assert directives.connects == (8443,)
    assert directives.read_files == ("/etc/hostname",)
    assert directives.pad == 12 and directives.invalid_output
    assert directives.behaviour is None  # invalid-output is not a flow behaviour
    assert rules.first_content_line(prompt) == "Do things"
    assert rules.tool_kind("read") == "read" and rules.tool_kind("Read") == "other"


def test_a_json_answer_satisfies_the_schema_in_the_prompt() -> None:
    from jsonschema import Draft202012Validator

    from helmhive.api.common import JobKind
    from helmhive.api.envelope import OutputContract
    from helmhive.api.job import JobRequest
    from helmhive.policy.envelopes import ENVELOPES
    from helmhive.policy.prompts import build_agent_prompt, check_output

    for kind in JobKind:
        contract = ENVELOPES[kind].output_contract
        if contract.json_schema is None:
            continue
        narrowed = OutputContract.model_validate(
            {"format": "structured", "schema": {"allOf": [contract.json_schema, {"required": ["extra"]}]}}
        )
        for used in (contract, narrowed):
            prompt = build_agent_prompt(
                instructions="", request=JobRequest(title="t", prompt="do it"), memory_context="", contract=used
            )
            assert rules.find_schema(prompt) == used.json_schema
            reply = rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={})
            assert check_output(text=reply, contract=used).ok, (kind, reply)
            Draft202012Validator(used.json_schema or {}).validate(json.loads(reply))
            broken = rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={}, invalid_output=True)
            assert not check_output(text=broken, contract=used).ok


def test_a_closed_schema_gets_only_its_own_properties() -> None:
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer", "minimum": 3}}}
    schema["additionalProperties"] = False
    prompt = "OUTPUT-CONTRACT: json\n```json\n" + json.dumps(schema) + "\n```"
    assert json.loads(rules.render_reply(prompt, turn=1, model="m", effort="e", tool_results={})) == {"a": 3}
    assert rules.minimal_instance({"type": "string", "minLength": 20, "maxLength": 25}) == "reference answer...."
    assert rules.minimal_instance({"type": "array", "minItems": 2, "items": {"enum": ["x"]}}) == ["x", "x"]


def test_padding_is_deterministic_and_exact() -> None:
    reply = rules.render_reply("hi\nPAD-REPLY: 1000", turn=1, model="m", effort="e", tool_results={})
    assert reply.endswith(rules.filler(1000)) and len(rules.filler(1000)) == 1000
    assert rules.filler(1000) == rules.filler(1000)

"""``helmhive explain-routing``'s table shows what objects hold as written: never as rich markup or a terminal escape.

Names, messages and reasons come from objects anyone with write access made (a condition's
message, a candidate's reason). Printed through rich, ``[bold]`` would be interpreted (and a stray
``[/x]`` raise), ``:smile:`` would become an emoji, and an ESC sequence would drive the terminal:
every control character is shown escaped (``\\x1b``) instead, so a reader sees it was there.
The renderer is pure: it is given an explanation built here, no cluster.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from helmhive.api.job import Candidate, ProfileBinding
from helmhive.api.reasons import Reason
from helmhive.cli.explain_output import Explanation, build_console, render_explanation
from helmhive.policy.routing.route import RouteOutcome, RoutingDecision

MARKUP = "[bold red]boom[/] [/stray] [link=https://example.invalid]x[/link] :thumbs_up:"
ESCAPES = "\x1b[2J\x1b]0;title\x07\x9b31m\r\x00\x7f"
SHOWN = "\\x1b[2J\\x1b]0;title\\x07\\x9b31m\\r\\x00\\x7f"  # ESCAPES as printed: every control escaped


def explanation() -> Explanation:
    binding = ProfileBinding.model_construct(
        name=f"p{MARKUP}", revision="p-0123", hash="h", snapshot=None, bound_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    )
    candidate = Candidate.model_construct(
        runner=f"r{ESCAPES}", namespace="ns", provider=MARKUP, mapping_index=0, model="m", reason=f"{MARKUP}{ESCAPES}"
    )
    decision = RoutingDecision(
        outcome=RouteOutcome.FAILED,
        reason=Reason.PROFILE_NOT_VALID,
        message=f"why: {MARKUP}{ESCAPES}",
        candidates=(candidate,),
        considered_runners=1,
    )
    return Explanation(
        namespace="demo",
        name="job-1",
        source="cluster",
        binding=binding,
        decision=decision,
        memory_ids=[],
        stored={"conditions": [{"type": "Routed", "status": "False", "reason": MARKUP, "message": ESCAPES + MARKUP}]},
        notes=[f"note {MARKUP}{ESCAPES}"],
    )


def test_text_from_objects_is_printed_as_written_without_markup_or_terminal_escapes() -> None:
    console = build_console()
    with console.capture() as captured:
        render_explanation(explanation(), console)
    out = captured.get()
    # Each markup-bearing value is shown literally: the header, the stored condition, the message,
    # the candidate cells (wrapped by the table, so checked word by word) and the notes.
    words = " ".join(out.split())  # long lines wrap at the console's width
    assert f"profile p{MARKUP} revision" in words
    assert f"Stored: Routed=False {MARKUP}: {SHOWN}{MARKUP}" in words
    assert f"why: {MARKUP}{SHOWN}" in words
    assert f"note {MARKUP}{SHOWN}" in words
    for word in ("[bold", "red]boom[/]", "[/stray]", ":thumbs_up:"):
        assert out.count(word) >= 6, (word, out)
    # No control character reaches the terminal; each is shown escaped, so a reader sees it.
    assert not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in out), repr(out)
    assert "\\x1b[2J" in out and "\\x9b31m" in out and "\\x07" in out


@pytest.mark.parametrize(
    ("planted", "shown"),
    [
        pytest.param("a\x1b[1;31mb", "a\\x1b[1;31mb", id="csi"),
        pytest.param("a\x1b]8;;https://x\x1b\\c", "a\\x1b]8;;https://x\\x1b\\c", id="osc-hyperlink"),
        pytest.param("a\x9b2Jb", "a\\x9b2Jb", id="c1-csi"),
        pytest.param("a\x85b", "a\\x85b", id="c1-nel"),
        pytest.param("a\rb\x00c\x7fd", "a\\rb\\x00c\\x7fd", id="cr-nul-del"),
        pytest.param("a\u202eb\u2066c", "a\\u202eb\\u2066c", id="bidi"),
        pytest.param("a\u200bb", "a\\u200bb", id="zero-width"),
    ],
)
def test_every_control_or_invisible_character_is_shown_escaped(planted: str, shown: str) -> None:
    console = build_console()
    with console.capture() as captured:
        render_explanation(dataclasses.replace(explanation(), notes=[planted]), console)
    out = captured.get()
    assert f"note: {shown}" in out
    assert not any(ch in out for ch in planted if not ch.isprintable()), repr(out)

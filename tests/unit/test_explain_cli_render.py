"""``helmhive explain-routing``'s table shows what objects hold as written: never as rich markup, never as escapes.

Names, messages and reasons come from objects anyone with write access made (a condition's
message, a candidate's reason). Printed through rich, ``[bold]`` would be interpreted (and a stray
``[/x]`` raise), ``:smile:`` would become an emoji, and an ESC sequence would drive the terminal.
The renderer is pure: it is given an explanation built here, no cluster.
"""

from __future__ import annotations

import datetime as dt

from helmhive.api.job import Candidate, ProfileBinding
from helmhive.api.reasons import Reason
from helmhive.cli import explain
from helmhive.policy.routing import RouteOutcome, RoutingDecision

MARKUP = "[bold red]boom[/] [/stray] [link=https://example.invalid]x[/link] :thumbs_up:"
ESCAPES = "\x1b[2J\x1b]0;title\x07\x9b31m\r\x00\x7f"


def explanation() -> explain.Explanation:
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
    return explain.Explanation(
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
    console = explain._console()
    with console.capture() as captured:
        explain._render(explanation(), console)
    out = captured.get()
    # Each markup-bearing value is shown literally: the header, the stored condition, the message,
    # the candidate cells (wrapped by the table, so checked word by word) and the notes.
    words = " ".join(out.split())  # long lines wrap at the console's width
    assert f"profile p{MARKUP} revision" in words
    assert f"Stored: Routed=False {MARKUP}: {MARKUP}" in words
    assert f"why: {MARKUP}" in words
    assert f"note {MARKUP}" in words
    for word in ("[bold", "red]boom[/]", "[/stray]", ":thumbs_up:"):
        assert out.count(word) >= 6, (word, out)
    assert "\x1b" not in out and "\x9b" not in out
    assert not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in out), repr(out)
    assert "title" not in out and "31m" not in out and "[2J" not in out  # whole sequences went, not only ESC


def test_plain_drops_every_kind_of_control_sequence_but_keeps_tabs_and_newlines() -> None:
    assert explain._plain("a\x1b[1;31mb\x1b]8;;https://x\x1b\\c\x1bPq#0\x1b\\d\x9b2Je\x1b7f\x1b(Bg") == "abcdefg"
    assert explain._plain("tab\there\nnew line\rcr\x00nul\x85nel\x7fdel") == "tab\there\nnew linecrnulneldel"
    assert explain._markup_safe("[bold]x[/bold]\x1b[0m") == "\\[bold]x\\[/bold]"

"""The runner's job journal and its patience with the API server, without a cluster.

The journal (:mod:`helmhive.runner.jobs.journal`): entries survive a round trip, a damaged or
half-written file is dropped rather than trusted, and what an entry means for a job this
process did not finish (:func:`decide_recovery`). The patience (:mod:`helmhive.runner.patience`):
the delays grow, are capped and jittered, only ``Unavailable`` is retried, and the budget ends it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from helmhive.runner.jobs.journal import JobJournal, JournalEntry, JournalPhase, decide_recovery
from helmhive.runner.jobs.status import JobEnding
from helmhive.runner.kube import Conflict, Unavailable
from helmhive.runner.patience import MAX_DELAY_S, decide_retry_delay, with_patience

DONE = JobEnding(succeeded=True, reason="Completed", message="the agent answered in 1 turn(s)")


def test_an_entry_round_trips_and_is_replaced_atomically(tmp_path: Path) -> None:
    journal = JobJournal(tmp_path)
    journal.write(JournalEntry(uid="u-1", name="job", attempt=1, phase=JournalPhase.RUNNING))
    journal.write(
        JournalEntry(
            uid="u-1", name="job", attempt=1, phase=JournalPhase.FINISHED, verdict=DONE, result={"summary": "hi"}
        )
    )
    (entry,) = journal.entries()
    assert (entry.phase, entry.verdict, entry.result, entry.attempt) == (
        JournalPhase.FINISHED,
        DONE,
        {"summary": "hi"},
        1,
    )
    assert [p.name for p in (tmp_path / "journal").iterdir()] == ["u-1.json"], "no temporary file is left"
    journal.remove("u-1")
    assert journal.read("u-1") is None and journal.entries() == []


def test_a_damaged_entry_or_a_leftover_temporary_file_is_dropped(tmp_path: Path) -> None:
    journal = JobJournal(tmp_path)
    journal.write(JournalEntry(uid="good", name="job", attempt=0, phase=JournalPhase.RUNNING))
    (tmp_path / "journal" / "torn.json").write_text('{"uid": "torn", "phase": "fini', encoding="utf-8")
    (tmp_path / "journal" / "nover.json").write_text(
        '{"uid": "nover", "name": "j", "attempt": 0, "phase": "finished"}', encoding="utf-8"
    )
    (tmp_path / "journal" / ".tmp-abc.json").write_text("{}", encoding="utf-8")
    assert [e.uid for e in journal.entries()] == ["good"]
    assert sorted(p.name for p in (tmp_path / "journal").iterdir()) == ["good.json"]


def test_recovery_writes_the_kept_result_or_reports_the_run_interrupted_never_finished() -> None:
    finished = JournalEntry(
        uid="u", name="j", attempt=0, phase=JournalPhase.FINISHED, verdict=DONE, result={"summary": "kept"}
    )
    replay = decide_recovery(finished)
    assert replay.replayed and replay.verdict == DONE and replay.result == {"summary": "kept"}
    running = decide_recovery(JournalEntry(uid="u", name="j", attempt=0, phase=JournalPhase.RUNNING))
    assert not running.replayed and not running.verdict.succeeded and running.verdict.reason == "Interrupted"
    lost = decide_recovery(None)
    assert not lost.verdict.succeeded and lost.verdict.reason == "RunnerLost"


def test_delays_grow_are_capped_and_jittered() -> None:
    steps = [decide_retry_delay(attempt=n, fraction=1.0) for n in range(8)]
    assert steps[:3] == [0.5, 1.0, 2.0] and steps[-1] == MAX_DELAY_S
    assert decide_retry_delay(attempt=3, fraction=0.5) == 2.0
    assert decide_retry_delay(attempt=3, fraction=0.0) == pytest.approx(0.4), "never zero"


def test_patience_retries_only_unavailable_and_ends_at_its_budget() -> None:
    clock = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    calls = {"n": 0}

    async def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 4:
            raise Unavailable(503, "connection refused")
        return "ok"

    def run(call, budget: float):  # type: ignore[no-untyped-def]
        return asyncio.run(
            with_patience(call, budget_s=budget, what="t", monotonic=lambda: clock[0], rand=lambda: 1.0, sleep=sleep)
        )

    assert run(flaky, 60) == "ok" and calls["n"] == 4 and slept == [0.5, 1.0, 2.0]

    async def down() -> str:
        raise Unavailable(503, "connection refused")

    slept.clear()
    clock[0] = 0.0
    with pytest.raises(Unavailable):
        run(down, 30)
    assert sum(slept) == pytest.approx(30.0), "it waited out its whole budget, no more"

    async def refused() -> str:
        raise Conflict(409, "stale")

    slept.clear()
    with pytest.raises(Conflict):
        run(refused, 30)
    assert slept == [], "an answer is not retried"

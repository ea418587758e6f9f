"""The operator's one deadline scheduler and its per-object locks, on a clock the test moves by hand.

Nothing here sleeps for a deadline: the clock is a variable, and :meth:`DeadlineScheduler.poke`
makes the loop read it again, as a real clock would be read when its sleep ends.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from helmhive.controller.deadlines import Action, DeadlineScheduler, KeyedLocks

START = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


async def settle() -> None:
    """Let the scheduler's loop and the actions it started run until they wait again."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_actions_run_when_due_in_time_order(clock: Clock) -> None:
    scheduler = DeadlineScheduler(clock=clock, concurrency=1)
    ran: list[str] = []

    def record(name: str) -> Action:
        async def action() -> None:
            ran.append(name)

        return action

    try:
        scheduler.at("late", START + dt.timedelta(seconds=30), record("late"))
        scheduler.at("early", START + dt.timedelta(seconds=10), record("early"))
        await settle()
        assert ran == []
        assert len(scheduler) == 2
        clock.advance(10)
        scheduler.poke()
        await settle()
        assert ran == ["early"]
        clock.advance(100)
        scheduler.poke()
        await settle()
        assert ran == ["early", "late"]
        assert len(scheduler) == 0
    finally:
        await scheduler.stop()


async def test_soon_replaces_a_deadline_and_the_action_runs_once(clock: Clock) -> None:
    scheduler = DeadlineScheduler(clock=clock)
    runs = 0

    async def action() -> None:
        nonlocal runs
        runs += 1

    try:
        scheduler.at("job", START + dt.timedelta(minutes=10), action)
        scheduler.soon("job", action)  # its Workspace appeared: look now
        await settle()
        assert runs == 1
        assert scheduler.when("job") is None
        clock.advance(600)
        scheduler.poke()
        await settle()
        assert runs == 1
    finally:
        await scheduler.stop()


async def test_cancel_drops_the_entry(clock: Clock) -> None:
    scheduler = DeadlineScheduler(clock=clock)
    ran: list[str] = []

    async def action() -> None:
        ran.append("x")

    try:
        scheduler.at("record", START + dt.timedelta(seconds=5), action)
        scheduler.cancel("record")
        scheduler.cancel("unknown")
        clock.advance(60)
        scheduler.poke()
        await settle()
        assert ran == []
    finally:
        await scheduler.stop()


async def test_a_failing_action_is_retried_later_unless_set_again(clock: Clock) -> None:
    scheduler = DeadlineScheduler(clock=clock, retry_seconds=5)
    attempts = 0

    async def flaky() -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("the API server is away")

    try:
        scheduler.soon("record", flaky)
        await settle()
        assert attempts == 1
        assert scheduler.when("record") == START + dt.timedelta(seconds=5)
        clock.advance(5)
        scheduler.poke()
        await settle()
        assert attempts == 2
        assert scheduler.when("record") is None
    finally:
        await scheduler.stop()


async def test_an_action_may_schedule_its_own_next_deadline(clock: Clock) -> None:
    scheduler = DeadlineScheduler(clock=clock)
    seen: list[dt.datetime] = []

    async def again() -> None:
        seen.append(clock())
        if len(seen) < 3:
            scheduler.at("memory", clock() + dt.timedelta(seconds=30), again)

    try:
        scheduler.soon("memory", again)
        for _ in range(3):
            await settle()
            clock.advance(30)
            scheduler.poke()
        await settle()
        assert seen == [START + dt.timedelta(seconds=30 * i) for i in range(3)]
        assert len(scheduler) == 0
    finally:
        await scheduler.stop()


async def test_concurrency_is_bounded(clock: Clock) -> None:
    scheduler = DeadlineScheduler(clock=clock, concurrency=2)
    release = asyncio.Event()
    running = 0
    peak = 0

    async def slow() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    try:
        for key in range(6):
            scheduler.soon(key, slow)
        await settle()
        assert peak == 2
        release.set()
        await settle()
        assert running == 0
        assert peak == 2
    finally:
        await scheduler.stop()


async def test_keyed_locks_serialise_one_key_and_clean_up() -> None:
    locks = KeyedLocks()
    order: list[str] = []
    gate = asyncio.Event()

    async def first() -> None:
        async with locks.hold("a"):
            order.append("first-in")
            await gate.wait()
            order.append("first-out")

    async def second() -> None:
        async with locks.hold("a"):
            order.append("second-in")

    async def other() -> None:
        async with locks.hold("b"):
            order.append("other-in")

    tasks = [asyncio.create_task(first()), asyncio.create_task(second()), asyncio.create_task(other())]
    await settle()
    assert order == ["first-in", "other-in"]
    assert len(locks) == 1
    gate.set()
    await asyncio.gather(*tasks)
    assert order == ["first-in", "other-in", "first-out", "second-in"]
    assert len(locks) == 0

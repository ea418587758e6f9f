"""The runner's memory of the jobs it ended is per attempt: a late event is ignored, an operator's re-queue is not."""

from __future__ import annotations

from typing import Any, cast

from helmhive.runner.program.cluster_jobs import ClusterJobSource


def test_a_later_attempt_of_an_ended_job_is_not_taken_for_a_late_event() -> None:
    source = ClusterJobSource(ctx=cast(Any, None))  # the memory needs no context
    assert not source._ended("u1", 0)
    source._remember("u1", 0)
    assert source._ended("u1", 0)  # a late event of the run it ended
    assert not source._ended("u1", 1)  # the operator re-queued it: attempt 1 is a new run
    source._remember("u1", 1)
    assert source._ended("u1", 1) and source._ended("u1", 0)
    source._remember("u2", None)  # ended before it started: the attempt is not known
    assert source._ended("u2", 0) and source._ended("u2", 3)

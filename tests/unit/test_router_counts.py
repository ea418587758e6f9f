"""The router's one-pass count of active jobs agrees with the per-runner count it replaced.

:meth:`~helmhive.controller.router_capacity.Capacity.active_counts` feeds every decision; it
must give each runner exactly what :meth:`~helmhive.controller.router_capacity.Capacity.active_jobs`
gives (the job store plus this process's reservations, a reservation the store already shows
counted once), over generated stores and reservations.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from helmhive.controller.router import Router, RouterSettings
from helmhive.controller.runtime import Runtime

RUNNERS = [("runners", f"r{i}") for i in range(6)]
JOBS = [("team", f"j{i}") for i in range(30)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.dictionaries(st.sampled_from(JOBS), st.sampled_from(RUNNERS)),
    st.dictionaries(st.sampled_from(JOBS), st.sampled_from(RUNNERS)),
)
def test_active_counts_equal_active_jobs_for_every_runner(stored: dict, reserved: dict) -> None:
    router = Router(Runtime(kube=None), RouterSettings())  # type: ignore[arg-type]  # no API calls here
    by_runner: dict = {}
    for job, runner in stored.items():
        by_runner.setdefault(runner, set()).add(job)
    router.jobs_by_runner = by_runner
    for job, runner in reserved.items():
        router._reserve(job, runner)
    counts = router.active_counts()
    expected = router.active_jobs(RUNNERS)
    assert {runner: counts.get(runner, 0) for runner in RUNNERS} == {r: expected.get(r, 0) for r in RUNNERS}
    assert all(count > 0 for count in counts.values())

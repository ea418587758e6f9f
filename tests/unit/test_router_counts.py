"""The router's one-pass count of active jobs agrees with the per-runner count it replaced.

:meth:`~helmhive.controller.router.capacity.Capacity.active_counts` feeds every decision; it
must give each runner exactly what :meth:`~helmhive.controller.router.capacity.Capacity.active_jobs`
gives (the job store plus this process's reservations, a reservation the store already shows
counted once), over generated stores and reservations. The store is a real
:class:`~helmhive.policy.routing.job_store.JobStore` fed watch events, so the counts it keeps beside its
sets are checked too.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from helmhive.controller.router.engine import Router, RouterSettings
from helmhive.controller.runtime import Runtime


def assigned(job: tuple[str, str], runner: tuple[str, str], version: int) -> dict:
    """A job's watch copy: assigned to ``runner``, not finished."""
    return {
        "metadata": {"namespace": job[0], "name": job[1], "resourceVersion": str(version)},
        "spec": {"jobKind": "implementation"},
        "status": {
            "profile": {"name": "p"},
            "assignment": {"runner": runner[1], "runnerNamespace": runner[0], "provider": "anthropic"},
            "conditions": [{"type": "Routed", "status": "True", "reason": "Routed"}],
        },
    }


RUNNERS = [("runners", f"r{i}") for i in range(6)]
JOBS = [("team", f"j{i}") for i in range(30)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.dictionaries(st.sampled_from(JOBS), st.sampled_from(RUNNERS)),
    st.dictionaries(st.sampled_from(JOBS), st.sampled_from(RUNNERS)),
    st.sets(st.sampled_from(JOBS)),
)
def test_active_counts_equal_active_jobs_for_every_runner(stored: dict, reserved: dict, gone: set) -> None:
    router = Router(Runtime(kube=None), RouterSettings())  # type: ignore[arg-type]  # no API calls here
    store = router.job_store
    for version, (job, runner) in enumerate(sorted(stored.items()), start=1):
        store.observe("ADDED", assigned(job, RUNNERS[(RUNNERS.index(runner) + 1) % len(RUNNERS)], version))
        store.observe("MODIFIED", assigned(job, runner, 1000 + version))  # moved: counted on the new runner only
    for job in sorted(gone & set(stored)):
        store.observe("DELETED", assigned(job, stored[job], 5000))
        del stored[job]
    assert {r: len(jobs) for r, jobs in store.jobs_by_runner.items()} == dict(store.counts_by_runner)
    for job, runner in reserved.items():
        router._reserve(job, runner)
    counts = router.active_counts()
    expected = router.active_jobs(RUNNERS)
    assert {runner: counts.get(runner, 0) for runner in RUNNERS} == {r: expected.get(r, 0) for r in RUNNERS}
    assert all(count > 0 for count in counts.values())

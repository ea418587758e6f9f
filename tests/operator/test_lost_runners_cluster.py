"""Lost runners on a real API server: the runner's transition ends its jobs, with no per-job poll.

A runner is lost when the operator derives ``Offline`` for it (its Lease is gone or expired) or
when its Runner is deleted. Its assigned, unfinished jobs end ``RunnerLost`` and are re-queued
only when :func:`helmhive.policy.agentjob.retry.decide_job_retry` allows it; jobs on other runners are
untouched. Runners are simulated (each writes as its own pod) and hold one slot each, so the
tests know where every job goes. ``tests/operator/test_end_to_end.py`` covers the same with a
real runner process killed mid-job.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from held_jobs import Fleet, create_profile, get_job, job_manifest, make_fleet, running, start_job
from pools import condition
from simulated_runner import GROUP, VERSION

from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.policy.audit.routing import iter_routing_decisions, job_audit_label


@pytest.fixture
def fleet(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> Iterator[Fleet]:
    """Three schedulable runners (``lost-0`` … ``lost-2``) with one slot each; profiles ``review`` and ``impl``."""
    fleet = make_fleet(kube, service_account_identity, namespace, name="lost", replicas=3, slots=1)
    try:
        create_profile(kube, namespace, "review", "review-probe")
        create_profile(kube, namespace, "impl", "implementation-probe")
        yield fleet
    finally:
        fleet.stop()


def _place(kube: Kube, namespace: str, name: str, *, profile: str, kind: str) -> str:
    """Create a job and wait for its assignment; return the runner it was placed on."""
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentjobs", job_manifest(name, profile=profile, kind=kind)
    )
    job = wait_for(
        lambda: (get_job(kube, namespace, name).get("status") or {}).get("assignment"),
        timeout=120,
        describe=f"job {name} to be assigned",
    )
    return str(job["runner"])


def _start(fleet: Fleet, kube: Kube, namespace: str, name: str) -> None:
    """Mark job ``name`` Running as the runner it is assigned to (retrying a conflict with the operator)."""

    def started() -> bool:
        job = get_job(kube, namespace, name)
        if not running(job):
            start_job(fleet.runners[job["status"]["assignment"]["runner"]], job)
        return running(get_job(kube, namespace, name))

    wait_for(started, timeout=60, describe=f"job {name} to be Running")


def _ended(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any]:
        job = get_job(kube, namespace, name)
        cond = condition(job, "Succeeded")
        assert (cond.get("status"), cond.get("reason")) == ("False", "RunnerLost"), job.get("status")
        return job

    return wait_for(check, timeout=90, describe=f"job {name} to end RunnerLost")


def _requeued_onto(kube: Kube, namespace: str, name: str, lost: str) -> dict[str, Any]:
    def check() -> dict[str, Any]:
        job = get_job(kube, namespace, name)
        status = job.get("status") or {}
        assert status.get("attempts") == 1, status
        runner = (status.get("assignment") or {}).get("runner")
        assert runner and runner != lost, status
        return job

    return wait_for(check, timeout=90, describe=f"job {name} to be re-queued and placed again")


def _wait_event(kube: Kube, namespace: str, name: str, says: Callable[[str], bool], describe: str) -> str:
    """The message of a RunnerLost Event about job ``name`` that ``says`` so, waited for: the
    operator posts it after the job's status."""

    def posted() -> str:
        listed = kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        messages = [str(e.message) for e in listed.items if e.reason == "RunnerLost"]
        found = [m for m in messages if says(m)]
        assert found, messages
        return found[0]

    return wait_for(posted, timeout=60, describe=f"a RunnerLost Event about job {name}: {describe}")


def _routed_records(kube: Kube, namespace: str, job: str, uid: str, *, count: int) -> dict[int, str]:
    """Attempt -> runner of the JobRouted decisions about ``job``, found by its label, once there are ``count``."""

    def listed() -> dict[int, str]:
        items = kube.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "auditrecords", label_selector=job_audit_label(uid)
        )["items"]
        decisions = [
            d["spec"]
            for d in iter_routing_decisions(items)
            if d["spec"]["action"] == "JobRouted" and d["spec"]["object"]["name"] == job
        ]
        found = {d["attempt"]: d["details"]["runner"] for d in decisions}
        assert len(decisions) == len(found) == count, decisions
        return found

    return wait_for(listed, timeout=60, describe=f"{count} JobRouted decisions about job {job}")


def test_a_deleted_runner_ends_its_jobs_and_a_requeued_job_is_not_rerun_twice(
    fleet: Fleet, kube: Kube, namespace: str
) -> None:
    read_on = _place(kube, namespace, "read", profile="review", kind="review-probe")
    _start(fleet, kube, namespace, "read")
    write_on = _place(kube, namespace, "write", profile="impl", kind="implementation-probe")
    _start(fleet, kube, namespace, "write")

    # The Runner of the read-only job is deleted: the job is re-queued once and placed on the free runner.
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "runners", read_on)
    again = _requeued_onto(kube, namespace, "read", read_on)
    second = again["status"]["assignment"]["runner"]
    assert second != write_on, "the writing job's runner has no free slot"
    _wait_event(
        kube,
        namespace,
        "read",
        lambda m: "its runner no longer exists" in m and "(re-queued)" in m,
        "its runner no longer exists (re-queued)",
    )
    write = get_job(kube, namespace, "write")
    assert running(write) and not write["status"].get("attempts"), "a job on another runner is untouched"
    # Each run has its own JobRouted decision: the re-run's does not replace the first run's.
    routed = _routed_records(kube, namespace, "read", again["metadata"]["uid"], count=2)
    assert routed == {0: read_on, 1: second}, routed

    # Its second runner goes Offline (it releases its Lease): lost again, it is not re-run a second time.
    _start(fleet, kube, namespace, "read")
    fleet.runners[second].release()
    ended = condition(_ended(kube, namespace, "read"), "Succeeded")
    assert f"runner {second} went Offline" in ended["message"]
    assert "not re-run: already re-run 1 time(s)" in ended["message"]
    read = get_job(kube, namespace, "read")
    assert read["status"]["attempts"] == 1 and read["status"]["result"]["outcome"] == "RunnerLost"
    assert condition(read, "Running").get("status") == "False"
    write = get_job(kube, namespace, "write")
    assert running(write) and not write["status"].get("attempts"), "a job on another runner is untouched"


@pytest.mark.timeout(600)
def test_jobs_whose_runner_was_lost_while_the_operator_was_down_end_when_it_starts(
    fleet: Fleet, kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    gone_on = _place(kube, namespace, "gone", profile="impl", kind="implementation-probe")
    _start(fleet, kube, namespace, "gone")
    offline_on = _place(kube, namespace, "offline", profile="impl", kind="implementation-probe")  # never started
    free = next(r for r in fleet.runners if r not in (gone_on, offline_on))

    operator.stop()
    try:
        # No operator sees either loss happen: one Runner is deleted, the other releases its Lease.
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "runners", gone_on)
        fleet.runners[offline_on].release()
    finally:
        operator.start()

    # Absent from the start: found from the job's own event.
    gone = condition(_ended(kube, namespace, "gone"), "Succeeded")
    assert "its runner no longer exists" in gone["message"]
    assert "not re-run" in gone["message"] and "side effects" in gone["message"]
    assert get_job(kube, namespace, "gone")["status"]["assignment"]["runner"] == gone_on, "its history is kept"
    # Derived Offline after the start: found from the runner's transition. It never started, so it runs again.
    again = _requeued_onto(kube, namespace, "offline", offline_on)
    assert again["status"]["assignment"]["runner"] == free
    _wait_event(
        kube, namespace, "offline", lambda m: f"runner {offline_on} went Offline" in m, f"{offline_on} went Offline"
    )


def test_a_runner_lost_longer_ago_than_the_retry_window_has_its_jobs_ended_not_rerun(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    """The operator was down while two runners died: one three hours ago, one a moment ago.

    Both are found Offline at its start (after the heartbeat hold). The read-only job of the one
    that died a moment ago is re-queued; the same kind of job on the one that died three hours ago
    is ended with ``RetryWindowPassed`` (default window 15 minutes): the loss counts from the
    runner's last heartbeat, as a failure counts from its end.
    """
    fleet = make_fleet(
        kube, service_account_identity, namespace, name="window", replicas=2, slots=1, lease_seconds=10, renew_seconds=2
    )
    try:
        create_profile(kube, namespace, "review", "review-probe")
        old_on = _place(kube, namespace, "old", profile="review", kind="review-probe")
        _start(fleet, kube, namespace, "old")
        recent_on = _place(kube, namespace, "recent", profile="review", kind="review-probe")
        _start(fleet, kube, namespace, "recent")
        assert old_on != recent_on

        operator.stop()
        try:
            fleet.stop()
            # The Lease still names its runner, but its last renewal is three hours old.
            fleet.runners[old_on].renew(at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=3))
        finally:
            operator.start()

        old = condition(_ended(kube, namespace, "old"), "Succeeded")
        assert old["message"].startswith(f"runner {old_on} went Offline"), old
        assert "; not re-run: its runner last renewed its Lease 3h" in old["message"], old
        assert old["message"].endswith("ago, outside the 15m re-run window (RetryWindowPassed)"), old
        assert not (get_job(kube, namespace, "old")["status"].get("attempts")), "not re-run"

        def requeued() -> dict[str, Any]:
            status = get_job(kube, namespace, "recent").get("status") or {}
            assert status.get("attempts") == 1, status
            return status

        wait_for(requeued, timeout=90, describe="job recent re-queued: its runner died a moment ago")
        _wait_event(kube, namespace, "old", lambda m: "RetryWindowPassed" in m, "not re-run: RetryWindowPassed")
    finally:
        fleet.stop()

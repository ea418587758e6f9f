"""Profile revisions are pruned past the history limit, never while an unfinished job is bound to one.

The operator keeps ``--revision-history`` revisions (1 here), the current one, and every revision
an unfinished job is bound to. Once its job store is synced it answers "which revisions are
bound" from the store (no LIST of every job per profile event); this test exercises that path on
a real API server: a job placed on a simulated runner keeps its revision through two profile
changes, and the revision goes at the first change after the job has finished.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from held_jobs import Fleet, create_profile, get_job, job_manifest, make_fleet
from kubernetes import client
from kubernetes.client.rest import ApiException
from simulated_runner import GROUP, VERSION

from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.policy.conditions import set_condition

OPERATOR_ENV = {"HELMHIVE_REVISION_HISTORY": "1"}


@pytest.fixture
def fleet(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> Iterator[Fleet]:
    """One schedulable runner with one slot; profile ``review``."""
    fleet = make_fleet(kube, service_account_identity, namespace, name="prune", replicas=1, slots=1)
    try:
        create_profile(kube, namespace, "review", "review-probe")
        yield fleet
    finally:
        fleet.stop()


def _profile_status(kube: Kube, namespace: str) -> dict[str, Any]:
    body = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "profiles", "review")
    return dict(body.get("status") or {})


def _change_profile(kube: Kube, namespace: str, purpose: str) -> str:
    """Change the profile's spec; wait for and return its new current revision."""
    before = _profile_status(kube, namespace)["currentRevision"]
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "profiles", "review", {"spec": {"purpose": purpose}}
    )
    return str(
        wait_for(
            lambda: (
                (_profile_status(kube, namespace).get("currentRevision") or before) != before
                and _profile_status(kube, namespace)["currentRevision"]
            ),
            timeout=60,
            describe=f"the profile's revision for purpose {purpose!r}",
        )
    )


def _revision_exists(kube: Kube, namespace: str, name: str) -> bool:
    try:
        client.AppsV1Api(kube.api_client).read_namespaced_controller_revision(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _finish(kube: Kube, namespace: str, name: str) -> None:
    """End the job ``Succeeded=True`` as its runner would."""
    job = get_job(kube, namespace, name)
    now = dt.datetime.now(dt.UTC)
    conditions = set_condition(
        (job.get("status") or {}).get("conditions"),
        type="Succeeded",
        status=True,
        reason="Completed",
        message="done",
        generation=job["metadata"]["generation"],
        now=now,
    ).conditions
    kube.custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        "agentjobs",
        name,
        {"metadata": {"resourceVersion": job["metadata"]["resourceVersion"]}, "status": {"conditions": conditions}},
    )


def test_a_revision_bound_to_an_unfinished_job_outlives_the_history_limit_until_the_job_ends(
    fleet: Fleet, kube: Kube, namespace: str
) -> None:
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentjobs", job_manifest("bound", profile="review", kind="review-probe")
    )
    job = wait_for(
        lambda: (
            (get_job(kube, namespace, "bound").get("status") or {}).get("assignment")
            and get_job(kube, namespace, "bound")
        ),
        timeout=120,
        describe="job bound to be assigned",
    )
    first = str(job["status"]["profile"]["revision"])
    assert first == _profile_status(kube, namespace)["currentRevision"]

    second = _change_profile(kube, namespace, "second")
    third = _change_profile(kube, namespace, "third")
    # History 1: the unreferenced middle revision goes, the job's and the current one stay.
    wait_for(lambda: not _revision_exists(kube, namespace, second), timeout=60, describe=f"{second} pruned")
    assert _revision_exists(kube, namespace, first), "the revision an unfinished job is bound to was pruned"
    assert _revision_exists(kube, namespace, third)
    assert _profile_status(kube, namespace)["revisions"][0] == first

    # Finished, the job holds nothing: the next change prunes its revision.
    wait_for(lambda: _finish(kube, namespace, "bound") is None, timeout=60, describe="job bound finished")
    fourth = _change_profile(kube, namespace, "fourth")
    wait_for(lambda: not _revision_exists(kube, namespace, first), timeout=60, describe=f"{first} pruned")
    assert _revision_exists(kube, namespace, fourth)

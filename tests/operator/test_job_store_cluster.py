"""The operator's AgentJob store filled from the real API server: a paginated LIST, then events.

No operator runs here: the test writes the jobs' assignments itself and drives
:class:`helmhive.controller.job_store_sync.JobStoreSync` with the operator's own ``Kube`` door,
with pages of two so the LIST follows ``continue`` tokens.
"""

from __future__ import annotations

import asyncio
from typing import Any

from held_jobs import assign_job, job_manifest
from kubernetes import client
from simulated_runner import GROUP, VERSION

from harness.aio import run_closing
from harness.kube import Kube
from helmhive.controller.job_store_sync import JobStoreSync
from helmhive.controller.kube.door import Kube as OperatorKube


def test_the_store_lists_every_job_in_pages_then_follows_events(
    kube: Kube, api_client: client.ApiClient, crds: list[str], namespace: str
) -> None:
    for i in range(5):
        kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentjobs", job_manifest(f"job-{i}", profile="p", kind="review-probe")
        )
    held = [assign_job(kube, namespace, f"job-{i}", "r1") for i in range(3)]

    async def scenario() -> tuple[int, set[tuple[str, str]], set[tuple[str, str]]]:
        sync = JobStoreSync(page_size=2)
        # An event older than the LIST's copy (the job before its assignment) arrives first.
        version = int(held[0]["metadata"]["resourceVersion"])
        stale = {**held[0], "status": {}, "metadata": {**held[0]["metadata"], "resourceVersion": str(version - 1)}}
        sync.start(door)
        sync.observe(None, stale)
        await asyncio.wait_for(sync.list(), timeout=60)
        assert sync.synced.is_set()
        listed = set(sync.store.held_on((namespace, "r1")))
        mine = sum(1 for i in range(5) if sync.store.facts((namespace, f"job-{i}")) is not None)
        sync.observe(None, stale)  # and again after the LIST: ignored
        # After the sync: the job finishes (its runner frees the slot), another is deleted.
        finished = _finish(kube, namespace, "job-1")
        sync.observe("MODIFIED", finished)
        sync.observe("DELETED", {**held[2], "metadata": {**held[2]["metadata"], "resourceVersion": str(10**12)}})
        after = set(sync.store.held_on((namespace, "r1")))
        return mine, listed, after

    door = OperatorKube(api_client)
    mine, listed, after = run_closing(scenario(), door)
    assert mine == 5, "every job of the namespace is in the store after the LIST"
    assert listed == {(namespace, f"job-{i}") for i in range(3)}, "the stale event did not hide job-0's slot"
    assert after == {(namespace, "job-0")}


def _finish(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    condition = {
        "type": "Succeeded",
        "status": "True",
        "reason": "Completed",
        "message": "done",
        "lastTransitionTime": "2026-12-02T00:00:00Z",
    }
    result: dict[str, Any] = kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "agentjobs", name, {"status": {"conditions": [condition]}}
    )
    return result

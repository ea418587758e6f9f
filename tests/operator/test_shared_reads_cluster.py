"""Shared single-object reads against the real API server (:mod:`helmhive.controller.kube.shared_reads`).

Twenty queue steps asking for one Workspace at once cost the API server one GET, counted by
the server itself (``apiserver_request_total``); and a read asked after a change always sees
the change (the reads are shared, never cached).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes import client

from harness.aio import run_closing
from harness.kube import Kube
from harness.metrics import scrape_apiserver
from helmhive.api.kinds import kind_by_name
from helmhive.controller.kube.door import Kube as OperatorKube
from helmhive.controller.kube.shared_reads import SharedReads

GROUP, VERSION = "helmhive.dev", "v1alpha1"
WORKSPACE = kind_by_name("Workspace")


def _workspace_gets(api: client.ApiClient) -> int:
    """The API server's count of GETs of workspaces (not of a subresource), all of them."""
    series = scrape_apiserver(api).series("apiserver_request_total", verb="GET", resource="workspaces")
    return int(sum(s.value for s in series if not s.labels.get("subresource")))


def _workspace(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workspace",
        "metadata": {"name": name},
        "spec": {"repository": {"url": "https://git.example.com/shop.git"}},
    }


def test_concurrent_reads_of_one_object_cost_one_get_and_never_miss_a_change(
    kube: Kube, api_client: client.ApiClient, crds: list[str], namespace: str
) -> None:
    created = kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "workspaces", _workspace("shop"))
    before = _workspace_gets(api_client)

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any], SharedReads]:
        reads = SharedReads(lambda kind, name, ns: door.get(kind, name, namespace=ns))
        answers = await asyncio.gather(*(reads.get(WORKSPACE, "shop", namespace) for _ in range(20)))
        await asyncio.to_thread(
            kube.custom.patch_namespaced_custom_object,
            GROUP, VERSION, namespace, "workspaces", "shop", {"metadata": {"labels": {"edited": "yes"}}},
        )  # fmt: skip
        after_change = await reads.get(WORKSPACE, "shop", namespace)
        return list(answers), after_change, reads

    door = OperatorKube(api_client)
    answers, after_change, reads = run_closing(scenario(), door)
    counted = _workspace_gets(api_client) - before
    assert {a["metadata"]["resourceVersion"] for a in answers} == {created["metadata"]["resourceVersion"]}
    assert reads.asked == 21
    assert reads.sent == 2, "the twenty callers shared one GET; the read after the change sent its own"
    assert 2 <= counted < 21, f"the API server counted {counted} GETs of workspaces for 21 reads"
    assert after_change["metadata"]["labels"] == {"edited": "yes"}, "a read asked after a change sees it"

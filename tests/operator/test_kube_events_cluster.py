"""The operator's Events, written as plain JSON by :class:`helmhive.controller.kube.door.Kube`, read back from
the real API server: the created Event, then its series raised as client-go's correlator does."""

from __future__ import annotations

import datetime as dt

from kubernetes import client

from harness.aio import run_closing
from helmhive.controller.kube.door import Kube


def test_an_event_is_created_about_its_object_and_its_series_is_raised(
    api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str
) -> None:
    involved = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "Runner",
        "metadata": {"name": "pool-a-0", "namespace": namespace, "uid": "0b5e7c9e-1111-4d3a-9d59-000000000001"},
    }
    first = dt.datetime(2026, 12, 2, 15, 0, 0, 250_000, tzinfo=dt.UTC)
    later = first + dt.timedelta(minutes=2)
    kube = Kube(api_client)

    async def scenario() -> str | None:
        name = await kube.post_event(
            involved=involved, reason="JobRouted", message="x" * 1500, event_type="Normal", count=3, now=first
        )
        assert name is not None
        await kube.patch_event_series(name, namespace=namespace, count=7, message="seven so far", now=later)
        return name

    name = run_closing(scenario(), kube)
    assert name is not None and name.startswith("pool-a-0.")
    event = core_v1.read_namespaced_event(name, namespace)
    assert (event.involved_object.kind, event.involved_object.name) == ("Runner", "pool-a-0")
    assert event.involved_object.uid == involved["metadata"]["uid"]
    assert (event.reason, event.type, event.source.component) == ("JobRouted", "Normal", "helmhive-operator")
    assert event.first_timestamp == first.replace(microsecond=0)
    assert (event.count, event.last_timestamp, event.message) == (7, later.replace(microsecond=0), "seven so far")


def test_an_event_the_api_server_refuses_is_dropped_not_raised(api_client: client.ApiClient) -> None:
    involved = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "no-such-namespace"}}
    kube = Kube(api_client)
    name = run_closing(
        kube.post_event(involved=involved, reason="Test", message="m", now=dt.datetime.now(dt.UTC)), kube
    )
    assert name is None  # best-effort: the namespace does not exist, the caller carries on

"""The Events both doors post (:mod:`helmhive.policy.audit.events`): one wire form for the operator and the runner.

The API server's view of these bodies (created, read back, series raised) is in
``tests/operator/test_kube_events_cluster.py`` and the runner's cluster tests.
"""

from __future__ import annotations

import datetime as dt

from helmhive.policy.audit.events import (
    MAX_EVENT_MESSAGE,
    build_event,
    build_event_series_patch,
    build_object_reference,
)

NOW = dt.datetime(2026, 12, 2, 10, 11, 12, 999_000, tzinfo=dt.UTC)
JOB = {
    "apiVersion": "helmhive.dev/v1alpha1",
    "kind": "AgentJob",
    "metadata": {"name": "fix-tests", "namespace": "payments", "uid": "u-1", "labels": {"x": "y"}},
    "spec": {"ignored": True},
}


def test_the_reference_names_the_object_and_nothing_else() -> None:
    assert build_object_reference(JOB) == {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "name": "fix-tests",
        "namespace": "payments",
        "uid": "u-1",
    }


def test_a_reference_to_an_object_without_uid_or_namespace_omits_them() -> None:
    bare = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "payments", "uid": None}}
    assert build_object_reference(bare) == {"apiVersion": "v1", "kind": "Namespace", "name": "payments"}


def test_an_event_lives_in_its_objects_namespace_with_a_generated_name() -> None:
    event = build_event(JOB, reason="JobRouted", message="to pool-a-0", now=NOW, component="helmhive-operator")
    assert event["metadata"] == {"generateName": "fix-tests.", "namespace": "payments"}
    assert event["involvedObject"] == build_object_reference(JOB)
    assert (event["reason"], event["message"], event["type"], event["count"]) == (
        "JobRouted",
        "to pool-a-0",
        "Normal",
        1,
    )
    assert event["source"] == {"component": "helmhive-operator"}
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-12-02T10:11:12Z"


def test_the_namespace_can_be_named_and_defaults_for_a_cluster_object() -> None:
    cluster_scoped = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
    assert build_event(cluster_scoped, reason="R", message="m", now=NOW, component="c")["metadata"]["namespace"] == (
        "default"
    )
    event = build_event(JOB, reason="R", message="m", now=NOW, component="c", namespace="runners", count=3)
    assert (event["metadata"]["namespace"], event["count"]) == ("runners", 3)


def test_an_object_without_a_name_gets_the_components_prefix() -> None:
    nameless = {"apiVersion": "v1", "kind": "Thing", "metadata": {}}
    assert build_event(nameless, reason="R", message="m", now=NOW, component="helmhive-runner")["metadata"][
        "generateName"
    ] == ("helmhive-runner.")


def test_long_messages_are_cut_in_the_event_and_in_its_series() -> None:
    long = "x" * (MAX_EVENT_MESSAGE + 500)
    warning = build_event(JOB, reason="R", message=long, now=NOW, component="c", event_type="Warning")
    assert (len(warning["message"]), warning["type"]) == (MAX_EVENT_MESSAGE, "Warning")
    later = NOW + dt.timedelta(minutes=5)
    assert build_event_series_patch(count=7, message=long, now=later) == {
        "count": 7,
        "lastTimestamp": "2026-12-02T10:16:12Z",
        "message": "x" * MAX_EVENT_MESSAGE,
    }

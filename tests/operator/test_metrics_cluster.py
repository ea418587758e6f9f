"""Prometheus metrics, scraped from the real endpoints during a real run.

The operator (its ``/metrics`` on a free loopback port, see :mod:`harness.operator`) routes jobs
to a RunnerPool's pod, run locally as a kubelet would with the reference agent (its ``/metrics``
moved to a free loopback port by :mod:`helmhive.devcluster.localpod`). Each test scrapes both
endpoints before and after, parses the exposition with ``prometheus_client.parser`` and waits
for the values to move by exactly what happened.

The operator is cluster-wide and other modules' objects may still be going away, so counts
that any job could move are compared with ``>=``; counts under this module's own provider
(``reference``, used by no other test of this operator process) are compared exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from reference_pool import PodStarter, pool_docs, profile_doc, workspace_doc

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.metrics import Scrape, scrape
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod

API = "helmhive.dev/v1alpha1"
PROVIDER = "reference"
POD = "reference-0"


def _docs() -> list[dict[str, Any]]:
    return [
        *pool_docs(token="metrics-stand-in", provider=PROVIDER, lease_seconds=5, renew_seconds=1),
        workspace_doc("shop", {"connection-test": "ref-check"}),
        profile_doc("ref-check", "connection-test", purpose="Metrics test.", provider=PROVIDER),
        # Its provider's runner lacks the placement label it requires: it fails closed at once.
        profile_doc(
            "nobody-check",
            "connection-test",
            purpose="Metrics test.",
            provider=PROVIDER,
            requiredLabels={"zone": "none"},
        ),
    ]


def _job(name: str, prompt: str = "Say hello.", *, workspace: str = "shop", profile: str | None = None) -> str:
    spec: dict[str, Any] = {
        "workspace": workspace,
        "jobKind": "connection-test",
        "request": {"title": name, "prompt": prompt},
        "timeoutSeconds": 300,
    }
    if profile is not None:
        spec["profile"] = profile
    return yaml.safe_dump({"apiVersion": API, "kind": "AgentJob", "metadata": {"name": name}, "spec": spec})


def _condition(kube: Kube, namespace: str, name: str, ctype: str) -> dict[str, Any] | None:
    job = kube.custom.get_namespaced_custom_object("helmhive.dev", "v1alpha1", namespace, "agentjobs", name)
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


@pytest.fixture
def reference_pod(start_reference_pod: PodStarter) -> Iterator[LocalPod]:
    """The pool's pod, run locally; returned once its Runner is Schedulable and its /metrics answers."""
    with start_reference_pod(_docs(), POD) as pod:
        assert pod.metrics_port, "the pool's pod template declares a metrics port"
        wait_for(
            lambda: scrape(_runner_url(pod)).series("helmhive_runner_info"),
            timeout=30,
            ignore=(httpx.HTTPError, AssertionError),
            describe=f"the runner's /metrics on port {pod.metrics_port}",
        )
        yield pod


def _runner_url(pod: LocalPod) -> str:
    return f"http://127.0.0.1:{pod.metrics_port}/metrics"


def _moved(url: str, name: str, by: float, before: Scrape, *, exact: bool = True, **labels: str) -> float:
    """Wait until ``name{labels}`` is ``by`` more than in ``before`` (at least that much unless ``exact``)."""
    start = before.total(name, **labels)

    def check() -> float:
        now = scrape(url).total(name, **labels)
        assert now == start + by if exact else now >= start + by, f"{name}{labels}: {start} -> {now}, expected +{by}"
        return now or 1.0

    return wait_for(check, timeout=60, describe=f"{name}{labels} to move by {by}")


def test_metrics_move_as_jobs_are_routed_run_and_fail_closed(
    reference_pod: LocalPod, operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    op, run = operator.metrics_url, _runner_url(reference_pod)
    # Scrape-time gauges see the runner from the operator's indexes, with its provider and states.
    wait_for(
        lambda: (
            scrape(op).total(
                "helmhive_runners",
                provider=PROVIDER,
                control_state="Active",
                reported_status="Online",
                schedulable="true",
            )
            >= 1
        ),
        timeout=30,
        describe="the operator's helmhive_runners gauge to show the runner Active, Online and schedulable",
    )
    assert scrape(op).total("helmhive_schedulable_runners", provider=PROVIDER) >= 1
    assert scrape(op).total("helmhive_schedulable_slots", provider=PROVIDER) >= 1
    before_op, before_run = scrape(op), scrape(run)
    assert before_op.types["helmhive_jobs_routed"] == "counter"
    assert before_op.types["helmhive_job_duration_seconds"] == "histogram"

    names = ["hello-0", "hello-1", "hello-2"]
    kubectl("apply", "-n", namespace, "-f", "-", input="---\n".join(_job(n) for n in names))
    for name in names:
        done = wait_for(
            lambda name=name: _condition(kube, namespace, name, "Succeeded"), timeout=120, describe=f"{name} to finish"
        )
        assert (done["status"], done["reason"]) == ("True", "Completed"), done

    kind = {"job_kind": "connection-test", "provider": PROVIDER}
    # The operator: three assignments, their latency, three finished jobs and their run time.
    _moved(op, "helmhive_jobs_routed_total", 3, before_op, exact=False, outcome="Assigned", reason="Assigned")
    _moved(op, "helmhive_job_queue_to_assigned_seconds_count", 3, before_op, **kind)
    _moved(op, "helmhive_jobs_finished_total", 3, before_op, outcome="Succeeded", reason="Completed", **kind)
    _moved(op, "helmhive_job_duration_seconds_count", 3, before_op, outcome="Succeeded", **kind)
    _moved(op, "helmhive_routing_decision_duration_seconds_count", 3, before_op, exact=False)
    _moved(
        op,
        "helmhive_api_writes_total",
        3,
        before_op,
        exact=False,
        kind="AgentJob",
        verb="update",  # the router PUTs the status it merged (StatusPatch.replacement)
        subresource="status",
        result="Success",
    )
    # The runner: one completed turn per job, each timed; nothing running afterwards.
    turns = {"provider": PROVIDER, "adapter": "acp"}
    _moved(run, "helmhive_runner_adapter_turns_total", 3, before_run, outcome="Completed", **turns)
    _moved(run, "helmhive_runner_adapter_turn_duration_seconds_count", 3, before_run, outcome="Completed", **turns)
    _moved(run, "helmhive_runner_job_queue_to_agent_start_seconds_count", 3, before_run, start="in-runner", **turns)
    after_run = scrape(run)
    assert after_run.total("helmhive_runner_jobs_active") == 0
    assert after_run.total("helmhive_runner_job_slots") == 1
    assert after_run.total("helmhive_runner_control_state", state="Active") == 1
    assert after_run.total("helmhive_runner_auth_state", state="Authenticated") == 1
    assert after_run.total("helmhive_runner_report_writes_total", reason="Registration", result="success") == 1
    assert after_run.total("helmhive_runner_probes_total", auth_state="Authenticated", **turns) >= 1
    assert after_run.total("helmhive_runner_adapter_kills_total") == 0
    info = after_run.series("helmhive_runner_info")
    assert [(s.labels["provider"], s.labels["adapter"]) for s in info] == [(PROVIDER, "acp")]
    # Heartbeats keep coming (renewed every second), and the last one is recent on the runner's clock.
    _moved(run, "helmhive_runner_heartbeats_total", 2, after_run, exact=False, result="success")
    assert scrape(run).total("helmhive_runner_last_heartbeat_timestamp_seconds") > 0

    # Failing closed counts its reason; waiting for a Workspace that does not exist yet counts and shows.
    kubectl("apply", "-n", namespace, "-f", "-", input=_job("nobody", profile="nobody-check"))
    failed = wait_for(lambda: _condition(kube, namespace, "nobody", "Routed"), timeout=60, describe="nobody routed")
    assert (failed["status"], failed["reason"]) == ("False", "NoEligibleRunner"), failed
    _moved(op, "helmhive_jobs_routed_total", 1, before_op, outcome="Failed", reason="NoEligibleRunner")
    kubectl("apply", "-n", namespace, "-f", "-", input=_job("orphan", workspace="not-yet"))
    wait_for(
        lambda: (c := _condition(kube, namespace, "orphan", "Routed")) and c["reason"] == "WaitingForWorkspace",
        timeout=60,
        describe="orphan to wait for its Workspace",
    )
    _moved(op, "helmhive_jobs_routed_total", 1, before_op, outcome="WaitingForReference", reason="WaitingForWorkspace")
    assert scrape(op).total("helmhive_jobs_waiting_for_reference") >= 1
    # Labels never carry a job's name.
    for sample in scrape(op).samples + scrape(run).samples:
        assert not set(sample.labels.values()) & {*names, "nobody", "orphan", namespace}, sample


def test_a_cancelled_hung_agent_is_counted_as_cancelled_and_killed_and_control_states_show(
    reference_pod: LocalPod, operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    op, run = operator.metrics_url, _runner_url(reference_pod)
    before_op, before_run = scrape(op), scrape(run)
    kubectl("apply", "-n", namespace, "-f", "-", input=_job("stuck", "Wait forever.\nREFERENCE-AGENT: hang"))
    wait_for(
        lambda: (c := _condition(kube, namespace, "stuck", "Running")) and c["status"] == "True",
        timeout=90,
        describe="stuck to run",
    )
    assert wait_for(lambda: scrape(run).total("helmhive_runner_jobs_active") == 1, timeout=30)
    assert wait_for(lambda: scrape(op).total("helmhive_schedulable_slots_busy", provider=PROVIDER) >= 1, timeout=30)

    kube.custom.patch_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", namespace, "agentjobs", "stuck", {"spec": {"cancel": True}}
    )
    # The agent ignores session/cancel, so the adapter kills it after the grace period.
    ended = wait_for(
        lambda: (c := _condition(kube, namespace, "stuck", "Succeeded")) and c["status"] == "False" and c,
        timeout=60,
        describe="stuck to end",
    )
    assert ended["reason"] == "Cancelled", ended
    turns = {"provider": PROVIDER, "adapter": "acp"}
    _moved(run, "helmhive_runner_adapter_cancellations_total", 1, before_run, origin="Caller", **turns)
    _moved(run, "helmhive_runner_adapter_kills_total", 1, before_run, **turns)
    _moved(run, "helmhive_runner_adapter_turns_total", 1, before_run, outcome="Killed", **turns)
    kind = {"job_kind": "connection-test", "provider": PROVIDER}
    _moved(op, "helmhive_jobs_finished_total", 1, before_op, outcome="Failed", reason="Cancelled", **kind)
    _moved(op, "helmhive_job_duration_seconds_count", 1, before_op, outcome="Failed", **kind)

    # An administrator drains the runner: both endpoints show it, and it is no longer schedulable.
    kube.custom.patch_namespaced_custom_object(
        "helmhive.dev", "v1alpha1", namespace, "runners", POD, {"spec": {"controlState": "Draining"}}
    )
    wait_for(
        lambda: scrape(run).total("helmhive_runner_control_state", state="Draining") == 1,
        timeout=30,
        describe="the runner to report Draining",
    )
    assert scrape(run).total("helmhive_runner_control_state", state="Active") == 0
    wait_for(
        lambda: (
            scrape(op).total("helmhive_runners", provider=PROVIDER, control_state="Draining", schedulable="false") >= 1
        ),
        timeout=30,
        describe="the operator to count the runner Draining and not schedulable",
    )

"""Fresh authenticated health and stale reports, with the real operator on a real API server.

- A runner whose ``verifiedAt`` passes the pool's ``heartbeat.authMaxAgeSeconds`` becomes
  ``AuthStale`` at that instant with no event at all (the runner keeps renewing its Lease with
  the same digest, which wakes nothing): the operator's one scheduled review per runner does it.
- A Lease whose report digest disagrees with the report (the runner's latest report was not
  written) makes the runner ``ReportStale``; the report catching up makes it schedulable again.
- The API server refuses a bad bound or a default outside the pinned models, naming the field.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from pools import Pool, condition, make_pool
from simulated_runner import GROUP, VERSION, SimulatedRunner

from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess

AUTH_MAX_AGE = 120  # the smallest bound the API allows


@pytest.fixture
def pool(operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory) -> Pool:
    heartbeat = {
        "leaseDurationSeconds": 30,
        "renewIntervalSeconds": 1,
        "reportRefreshSeconds": 30,
        "authMaxAgeSeconds": AUTH_MAX_AGE,
    }
    made = make_pool(kube, service_account_identity, namespace, replicas=1, heartbeat=heartbeat)
    made.wait_pods(1)
    return made


def _online(pool: Pool, *, verified_ago: float) -> SimulatedRunner:
    runner = pool.acting_as("claude-0", lease_seconds=30)
    verified = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=verified_ago)
    runner.register(verified_at=verified)
    runner.start_heartbeat(interval=1.0)
    return runner


def test_authentication_older_than_the_pool_bound_is_auth_stale_without_any_event(pool: Pool, kube: Kube) -> None:
    # Verified 112 s ago: fresh for 8 more seconds. The Lease (30 s) stays fresh throughout.
    runner = _online(pool, verified_ago=AUTH_MAX_AGE - 8)
    try:
        pool.wait_runner("claude-0", "Online and schedulable", status="Online", schedulable="Schedulable")
        renewals = runner.renewals
        version = pool.runner("claude-0")["metadata"]["resourceVersion"]
        obj = pool.wait_runner(
            "claude-0", "AuthStale once verifiedAt passes the bound", timeout=60, schedulable="AuthStale"
        )
        assert obj["status"]["reportedStatus"] == "NeedsAttention"
        authenticated = condition(obj, "Authenticated")
        assert (authenticated["status"], authenticated["reason"]) == ("Unknown", "AuthStale")
        assert f"{AUTH_MAX_AGE}s (heartbeat.authMaxAgeSeconds)" in authenticated["message"]
        stale_at = dt.datetime.fromisoformat(authenticated["lastTransitionTime"].replace("Z", "+00:00"))
        verified = obj["status"]["report"]["authentication"]["verifiedAt"]
        bound = dt.datetime.fromisoformat(verified.replace("Z", "+00:00")) + dt.timedelta(seconds=AUTH_MAX_AGE)
        assert stale_at >= bound - dt.timedelta(seconds=1), "never before the bound (whole-second timestamps)"
        # Nothing but renewals happened meanwhile: the runner did not write its Runner.
        assert runner.renewals > renewals
        writers = [m for m in obj["metadata"]["managedFields"] if m["manager"] == "helmhive-runner"]
        assert len(writers) == 1 and int(obj["metadata"]["resourceVersion"]) > int(version)

        # The runner re-verifies and reports: schedulable again.
        runner.report(verified_at=dt.datetime.now(dt.UTC))
        pool.wait_runner("claude-0", "schedulable after re-verifying", status="Online", schedulable="Schedulable")
        changes = kube.custom.list_namespaced_custom_object(
            GROUP,
            VERSION,
            pool.namespace,
            "auditrecords",
            label_selector="helmhive.dev/audit-action=RunnerStatusChanged",
        )["items"]
        assert any("AuthStale" in r["spec"]["message"] for r in changes), [r["spec"]["message"] for r in changes]
    finally:
        runner.stop_heartbeat()


def test_a_lease_digest_that_disagrees_with_the_report_is_report_stale(pool: Pool) -> None:
    runner = _online(pool, verified_ago=1)
    try:
        pool.wait_runner("claude-0", "Online and schedulable", status="Online", schedulable="Schedulable")
        # The runner learned something new (its Lease says so) but its report was never written.
        runner.digest = "sha256:" + "0" * 64
        runner.renew()
        obj = pool.wait_runner("claude-0", "ReportStale", timeout=30, schedulable="ReportStale")
        assert obj["status"]["reportedStatus"] == "NeedsAttention"
        assert condition(obj, "Authenticated")["reason"] == "ReportStale"
        runner.report(verified_at=dt.datetime.now(dt.UTC))
        pool.wait_runner("claude-0", "schedulable once the report agrees", status="Online", schedulable="Schedulable")
    finally:
        runner.stop_heartbeat()


def test_a_runner_back_after_a_long_silence_is_online_at_its_first_renewal(pool: Pool) -> None:
    """No event but a plain renewal brings it back: the operator asked to be woken by one."""
    runner = pool.acting_as("claude-0", lease_seconds=5)
    runner.register(verified_at=dt.datetime.now(dt.UTC))
    runner.start_heartbeat(interval=1.0)
    try:
        pool.wait_runner("claude-0", "Online", status="Online", schedulable="Schedulable")
        runner.stop_heartbeat()
        pool.wait_runner("claude-0", "Offline", timeout=60, status="Offline", online="HeartbeatStale")
        # Long enough for the operator to have seen its own Offline write come back through the watch
        # (that event must not be what revives the runner).
        time.sleep(5)
        assert pool.runner("claude-0")["status"]["reportedStatus"] == "Offline"
        runner.renew()  # one renewal, same holder, same digest: nothing but renewTime changes
        pool.wait_runner("claude-0", "Online at the first renewal", timeout=30, status="Online")
    finally:
        runner.stop_heartbeat()


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"heartbeat": {"authMaxAgeSeconds": 60}}, "spec.heartbeat.authMaxAgeSeconds", "greater than or equal to 120"),
        (
            {"adapter": {"type": "claude-cli", "claudeCli": {"models": ["sonnet"], "defaultModel": "opus"}}},
            "spec.adapter.claudeCli.defaultModel",
            "defaultModel must be one of models",
        ),
    ],
)
def test_bad_freshness_and_catalogue_settings_are_refused_with_their_field(
    operator: OperatorProcess, kube: Kube, namespace: str, spec: dict[str, Any], field: str, words: str
) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RunnerPool",
        "metadata": {"name": "bad"},
        "spec": {
            "provider": "anthropic",
            "adapter": {"type": "claude-cli"},
            "image": "ghcr.io/helmhive/runner:test",
            "credential": {"secretRef": {"name": "key", "key": "api-key"}},
            **spec,
        },
    }
    with pytest.raises(ApiException) as refused:
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "runnerpools", body)
    assert refused.value.status == 422
    assert field in str(refused.value.body) and words in str(refused.value.body), refused.value.body

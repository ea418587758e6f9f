"""Runners on a real API server with the real operator, written to as the contract says by pod-bound tokens.

Heartbeats, authentication, control states, credential rotation, the two layers that keep a
runner to its own Runner (RBAC, then the identity admission policy), the audit trail, and
that the credential never leaves its Secret.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from pools import CANARY, Pool, condition, make_pool
from simulated_runner import GROUP, VERSION, SimulatedRunner

from harness.kube import IdentityFactory, Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for

LEASE_SECONDS = 5  # the pools' heartbeat.leaseDurationSeconds
GRACE_SECONDS = 2.0  # the operator's default runner grace


def audits(kube: Kube, namespace: str, action: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "auditrecords", label_selector=f"helmhive.dev/audit-action={action}"
    )["items"]
    return sorted(items, key=lambda r: r["spec"]["time"])


def wait_audit(kube: Kube, namespace: str, action: str, count: int = 1) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]]:
        found = audits(kube, namespace, action)
        assert len(found) >= count, [r["spec"]["message"] for r in found]
        return found

    return wait_for(enough, timeout=30, describe=f"{count} {action} audit record(s)")


def parse(ts: str) -> dt.datetime:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))


@pytest.fixture
def pool(operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory) -> Pool:
    made = make_pool(kube, service_account_identity, namespace, replicas=2)
    made.wait_pods(2)
    return made


def online(pool: Pool, pod: str = "claude-0", **report: Any) -> SimulatedRunner:
    runner = pool.acting_as(pod, lease_seconds=LEASE_SECONDS)
    runner.register(**report)
    runner.start_heartbeat(interval=1.0)
    return runner


def test_a_runner_goes_online_offline_and_online_again(pool: Pool, kube: Kube) -> None:
    runner = online(pool)
    try:
        obj = pool.wait_runner("claude-0", "Online and schedulable", status="Online", schedulable="Schedulable")
        assert obj["status"]["effectiveControlState"] == "Active"
        assert condition(obj, "Authenticated")["status"] == "True"
        # The runner's report and the operator's fields have one writer each.
        managers = {(m["manager"], m.get("subresource", "")) for m in obj["metadata"]["managedFields"]}
        assert {("helmhive-runner", "status"), ("helmhive-operator", "status")} <= managers
        registered = wait_audit(kube, pool.namespace, "RunnerRegistered")
        assert registered[0]["spec"]["object"]["name"] == "claude-0"
        assert registered[0]["spec"]["actor"]["username"].endswith(":helmhive-runner-claude")
        wait_for(
            lambda: pool.get()["status"]["readyReplicas"] == 1 and pool.get()["status"]["schedulableRunners"] == 1,
            timeout=60,
            describe="the pool to count one ready, schedulable runner",
        )

        runner.stop_heartbeat()
        last = runner.last_renewal
        assert last is not None
        obj = pool.wait_runner(
            "claude-0", "Offline after renewals stop", timeout=LEASE_SECONDS + GRACE_SECONDS + 20, status="Offline"
        )
        went_offline = parse(condition(obj, "Online")["lastTransitionTime"])
        # Never before the Lease expired (transition times have whole seconds, hence the 1 s).
        assert went_offline >= last + dt.timedelta(seconds=LEASE_SECONDS - 1)
        assert condition(obj, "Online")["reason"] == "HeartbeatStale"
        schedulable = condition(obj, "Schedulable")
        assert (schedulable["status"], schedulable["reason"]) == ("False", "HeartbeatStale")
        changed = wait_audit(kube, pool.namespace, "RunnerStatusChanged")
        assert (changed[-1]["spec"]["before"]["value"], changed[-1]["spec"]["after"]["value"]) == ("Online", "Offline")

        runner.start_heartbeat(interval=1.0)
        pool.wait_runner("claude-0", "Online again when renewals resume", status="Online", schedulable="Schedulable")
        wait_audit(kube, pool.namespace, "RunnerStatusChanged", count=2)
        # A heartbeat is a Lease renewal, not a Runner write: the report was written once.
        report_writes = [
            m for m in pool.runner("claude-0")["metadata"]["managedFields"] if m["manager"] == "helmhive-runner"
        ]
        assert len(report_writes) == 1
        assert len(audits(kube, pool.namespace, "RunnerRegistered")) == 1
    finally:
        runner.stop_heartbeat()


def test_a_released_lease_is_offline_at_once(pool: Pool) -> None:
    runner = online(pool)
    pool.wait_runner("claude-0", "Online", status="Online")
    runner.release()
    obj = pool.wait_runner("claude-0", "Offline after the Lease is deleted", timeout=60, status="Offline")
    assert condition(obj, "Online")["reason"] == "LeaseMissing"


def test_an_unauthenticated_or_failing_runner_needs_attention(pool: Pool) -> None:
    runner = online(pool, auth="Unauthenticated", auth_reason="AuthRequired")
    try:
        obj = pool.wait_runner("claude-0", "NeedsAttention", status="NeedsAttention", schedulable="Unauthenticated")
        assert condition(obj, "Authenticated")["status"] == "False"
        assert condition(obj, "Online")["status"] == "True"
        runner.report(auth="Failing", auth_reason="AgentCrashed")
        pool.wait_runner("claude-0", "adapter failing", status="NeedsAttention", schedulable="AdapterFailing")
        runner.report()
        pool.wait_runner("claude-0", "authenticated again", status="Online", schedulable="Schedulable")
    finally:
        runner.stop_heartbeat()


def test_control_states_make_a_runner_unschedulable_with_named_reasons(pool: Pool, kube: Kube) -> None:
    runner = online(pool)
    try:
        pool.wait_runner("claude-0", "Schedulable", schedulable="Schedulable")
        for state in ("Draining", "Disabled"):
            pool.patch_runner_spec("claude-0", {"controlState": state})
            pool.wait_runner("claude-0", state, control=state, schedulable=state, status="Online")
        pool.patch_runner_spec("claude-0", {"controlState": "Active"})
        pool.wait_runner("claude-0", "Active again", control="Active", schedulable="Schedulable")

        # The pool's control state applies to every runner; the most restrictive wins.
        pool.patch_spec({"controlState": "Draining"})
        pool.wait_runner("claude-0", "pool draining", control="Draining", schedulable="Draining")
        pool.patch_spec({"controlState": "Active"})
        pool.wait_runner("claude-0", "pool active", control="Active", schedulable="Schedulable")

        pool.patch_runner_spec("claude-0", {"controlState": "Revoked"})
        pool.wait_runner("claude-0", "Revoked", control="Revoked", schedulable="Revoked")
        revoked = wait_audit(kube, pool.namespace, "RunnerRevoked")
        assert revoked[-1]["spec"]["after"]["value"] == "Revoked"
        assert revoked[-1]["spec"]["details"]["setBy"]  # the administrator's field manager
        changes = wait_audit(kube, pool.namespace, "RunnerControlStateChanged", count=5)
        assert [(c["spec"]["before"]["value"], c["spec"]["after"]["value"]) for c in changes] == [
            ("Active", "Draining"),
            ("Draining", "Disabled"),
            ("Disabled", "Active"),
            ("Active", "Draining"),
            ("Draining", "Active"),
        ]
    finally:
        runner.stop_heartbeat()


def test_credential_rotation_is_detected_audited_and_requires_a_new_report(
    pool: Pool, kube: Kube, operator: OperatorProcess
) -> None:
    runner = online(pool, generation=1)
    try:
        pool.wait_runner("claude-0", "Schedulable at generation 1", schedulable="Schedulable")
        before = pool.get()["status"]
        assert before["credentialGeneration"] == 1
        pool.set_secret(CANARY + "-rotated")

        def rotated() -> dict[str, Any]:
            status = pool.get()["status"]
            assert status["credentialGeneration"] == 2, status
            return status

        after = wait_for(rotated, timeout=30, describe="credentialGeneration 2")
        assert after["credentialHash"] != before["credentialHash"]
        record = wait_audit(kube, pool.namespace, "RunnerCredentialRotated", count=2)[-1]["spec"]
        assert (record["before"]["hash"], record["after"]["hash"]) == (
            before["credentialHash"],
            after["credentialHash"],
        )
        assert (record["before"]["revision"], record["after"]["revision"]) == ("1", "2")
        # The new generation is stamped into the pod template, so the pods roll.
        wait_for(
            lambda: (
                kube.apps.read_namespaced_stateful_set("claude", pool.namespace).spec.template.metadata.annotations[
                    "helmhive.dev/credential-generation"
                ]
                == "2"
            ),
            timeout=30,
            describe="the pod template at generation 2",
        )
        obj = pool.wait_runner("claude-0", "CredentialRotated", schedulable="CredentialRotated", status="Online")
        assert "generation 1" in condition(obj, "Schedulable")["message"]
        runner.report(generation=2)
        pool.wait_runner("claude-0", "Schedulable after re-reporting", schedulable="Schedulable")
        # The same content again is no rotation.
        pool.set_secret(CANARY + "-rotated")
        kube.core.patch_namespaced_secret(pool.secret, pool.namespace, {"metadata": {"labels": {"touched": "yes"}}})
        assert pool.get()["status"]["credentialGeneration"] == 2
    finally:
        runner.stop_heartbeat()


def test_a_deleted_secret_makes_runners_unschedulable(pool: Pool, kube: Kube) -> None:
    runner = online(pool)
    try:
        pool.wait_runner("claude-0", "Schedulable", schedulable="Schedulable")
        kube.core.delete_namespaced_secret(pool.secret, pool.namespace)
        obj = pool.wait_runner("claude-0", "CredentialMissing", schedulable="CredentialMissing")
        assert condition(obj, "Schedulable")["status"] == "False"
        # The pool's own status is a separate write, which may land after the runner's.
        wait_for(
            lambda: condition(pool.get(), "CredentialAvailable")["reason"] == "CredentialMissing",
            timeout=60,
            describe="the pool's CredentialAvailable condition to say CredentialMissing",
        )
    finally:
        runner.stop_heartbeat()


def _denied(fn: Any) -> dict[str, Any]:
    with pytest.raises(ApiException) as err:
        fn()
    assert err.value.status == 403, err.value.body
    body: dict[str, Any] = json.loads(err.value.body)
    return body


def test_a_runner_writes_only_its_own_runner_and_reads_no_secrets(
    pool: Pool, kube: Kube, service_account_identity: IdentityFactory
) -> None:
    a = pool.acting_as("claude-0")
    b = pool.acting_as("claude-1")
    b.register()
    b.renew()
    a.register()

    # Layer 2, admission: a token bound to pod claude-0 cannot write runner claude-1.
    body = _denied(lambda: a.apply_status({"report": a.build_report()}, name="claude-1"))
    assert "helmhive-runner-identity" in body["message"]
    assert "runner pod claude-0 may write only its own Runner and Lease" in body["message"]
    assert "runners/status claude-1" in body["message"]
    body = _denied(lambda: a.renew(name="claude-1"))
    assert "not leases claude-1" in body["message"]
    # ... nor forge what the operator derives about itself.
    pool.wait_runner("claude-0", "derived once", schedulable="LeaseMissing")
    forged = {"conditions": [{"type": "Schedulable", "status": "True", "reason": "Schedulable",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}]}  # fmt: skip
    body = _denied(lambda: a.apply_status(forged))
    assert "may write only status.report" in body["message"]
    body = _denied(lambda: a.apply_status({"report": a.build_report(), "reportedStatus": "Online"}))
    assert "may write only status.report" in body["message"]
    # ... nor register a runner for another pod, or in another pool.
    custom = a.custom
    other = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Runner", "metadata": {"name": "claude-7"},
             "spec": {"poolRef": {"name": "claude"}}}  # fmt: skip
    assert (
        "not runners claude-7"
        in _denied(lambda: custom.create_namespaced_custom_object(GROUP, VERSION, pool.namespace, "runners", other))[
            "message"
        ]
    )

    # Layer 1, RBAC: no Secrets, no Pods, no spec updates.
    def read_secret() -> Any:
        return a.core.read_namespaced_secret(pool.secret, pool.namespace)

    assert 'cannot get resource "secrets"' in _denied(read_secret)["message"]
    assert 'cannot list resource "secrets"' in _denied(lambda: a.core.list_namespaced_secret(pool.namespace))["message"]
    assert (
        'cannot patch resource "runners"'
        in _denied(
            lambda: custom.patch_namespaced_custom_object(
                GROUP, VERSION, pool.namespace, "runners", "claude-0", {"spec": {"controlState": "Active"}}
            )
        )["message"]
    )

    # A token of the runner ServiceAccount that is bound to no pod is refused outright.
    unbound = service_account_identity(pool.namespace, pool.service_account, create=False)
    lone = SimulatedRunner(identity=unbound, namespace=pool.namespace, pool="claude", name="claude-0")
    assert "is not bound to a pod" in _denied(lone.report)["message"]

    # The rightful writer is allowed.
    a.report()
    a.renew()
    assert pool.runner("claude-0")["status"]["report"]["podName"] == "claude-0"


def _all_text(kube: Kube, namespace: str) -> str:
    parts = []
    for plural in ("runners", "runnerpools", "auditrecords"):
        parts.append(json.dumps(kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)))
    events = kube.core.list_namespaced_event(namespace)
    parts.append(json.dumps(kube.api_client.sanitize_for_serialization(events)))
    return "\n".join(parts)


def test_the_credential_never_appears_outside_its_secret(pool: Pool, kube: Kube, operator: OperatorProcess) -> None:
    runner = online(pool, generation=1)
    try:
        pool.wait_runner("claude-0", "Schedulable", schedulable="Schedulable")
        pool.set_secret(CANARY + "-2")
        pool.wait_runner("claude-0", "CredentialRotated", schedulable="CredentialRotated")
        runner.report(generation=2)
        pool.patch_runner_spec("claude-0", {"controlState": "Revoked"})
        pool.wait_runner("claude-0", "Revoked", schedulable="Revoked")
        wait_audit(kube, pool.namespace, "RunnerRevoked")
    finally:
        runner.stop_heartbeat()
    # The canary really is in the Secret (so this test could fail) ...
    secret = kube.core.read_namespaced_secret(pool.secret, pool.namespace)
    assert base64.b64decode(secret.data["note"]).decode() == CANARY
    # ... and in no Runner, RunnerPool, AuditRecord, Event, or line of the operator's log.
    needles = {CANARY, base64.b64encode(CANARY.encode()).decode(), base64.b64encode((CANARY + "-2").encode()).decode()}
    text = _all_text(kube, pool.namespace)
    assert "RunnerCredentialRotated" in text and "RunnerRevoked" in text
    log = operator.log_text()
    assert "claude-0" in log
    for needle in needles:
        assert needle not in text
        assert needle not in log


# --- The real runner program against the real operator --------------------------------------------


def _pod_environment(kube: Kube, namespace: str, pod_name: str) -> dict[str, str]:
    """The runner container's environment as the kubelet would resolve it (fieldRefs included)."""
    pod = kube.core.read_namespaced_pod(pod_name, namespace)
    fields = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "status.podIP": "127.0.0.1",  # as helmhive dev run-pod gives it: the runner runs as a local process
        **{f"metadata.annotations['{k}']": v for k, v in (pod.metadata.annotations or {}).items()},
    }
    env = {}
    for var in pod.spec.containers[0].env:
        env[var.name] = var.value if var.value_from is None else fields[var.value_from.field_ref.field_path]
    return env


def test_the_runner_program_in_a_pool_of_the_operator(
    operator: OperatorProcess,
    kube: Kube,
    kubectl: Kubectl,
    namespace: str,
    service_account_identity: IdentityFactory,
    tmp_path: Path,
) -> None:
    reference_agent = Path(sys.executable).with_name("helmhive-reference-agent")
    pool = make_pool(
        kube,
        service_account_identity,
        namespace,
        provider="reference",
        adapter={"type": "acp", "acp": {"command": str(reference_agent)}},
        credential={
            "secretRef": {"name": "claude-credential", "key": "api-key"},
            "envName": "HELMHIVE_REFERENCE_AGENT_TOKEN",
        },
    )
    pool.wait_pods(1)
    # What the pod would see: the operator's runner.json, its environment, the mounted credential.
    config_map = wait_for(lambda: kube.core.read_namespaced_config_map("helmhive-runner-claude", namespace), timeout=30)
    env = _pod_environment(kube, namespace, "claude-0")
    assert env["HELMHIVE_CREDENTIAL_GENERATION"] == "1"
    files = {
        "HELMHIVE_RUNNER_CONFIG": config_map.data["runner.json"],
        "HELMHIVE_CREDENTIAL_FILE": CANARY,
    }
    for var, content in files.items():
        path = tmp_path / Path(env[var]).name
        path.write_text(content, encoding="utf-8")
        env[var] = str(path)
    for var in ("HELMHIVE_STATE_DIR", "HOME", "TMPDIR"):
        (tmp_path / var).mkdir()
        env[var] = str(tmp_path / var)
    identity = service_account_identity(namespace, "helmhive-runner-claude", bound_pod="claude-0", create=False)
    env |= {"KUBECONFIG": str(identity.kubeconfig), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    log_path = tmp_path / "runner.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "helmhive", "runner", "run"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        obj = pool.wait_runner("claude-0", "the runner program Online and schedulable", timeout=60,
                               status="Online", schedulable="Schedulable")  # fmt: skip
        report = obj["status"]["report"]
        assert (report["provider"], report["credentialGeneration"], report["podName"]) == ("reference", 1, "claude-0")
        # The operator's runner.json chose Proxy for an API key: the runner says so, and the key stayed with it.
        assert json.loads(config_map.data["runner.json"])["credentialIsolation"] == "Proxy"
        assert report["credentialIsolation"] == "Proxy"
        assert "egress proxy listening" in log_path.read_text(encoding="utf-8")
        table = kubectl("get", "runners", "-n", namespace).stdout.splitlines()
        column = table[0].split().index("CREDENTIAL")
        assert table[1].split()[column] == "Proxy", table
        # Its jobs' network: a namespace of their own where this machine allows one (it does: root, user namespaces).
        assert table[1].split()[table[0].split().index("NETWORK")] == report["sandbox"]["network"] == "Namespace"
        wait_audit(kube, namespace, "RunnerRegistered")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log_path.read_text()
        obj = pool.wait_runner("claude-0", "Offline once the runner released its Lease", timeout=60, status="Offline")
        assert condition(obj, "Online")["reason"] == "LeaseMissing"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert CANARY not in operator.log_text()

"""The runner program (``python -m helmhive runner run``) against the real API server.

Each test starts the program as a subprocess with a runner pod's environment and a token bound
to its Pod object, under the exact RBAC the contract gives a pool, with the reference agent as
its ACP agent. The operator is not running, so ``spec.controlState`` is what the runner obeys.
"""

from __future__ import annotations

import datetime as dt
import json
import time

from harness import wait_for
from harness.audit import ApiAuditLog
from harness.cluster import ClusterHandle
from harness.metrics import scrape_apiserver
from helmhive.api.runner import REPORT_DIGEST_ANNOTATION, RunnerReport, build_report_digest

from .program_harness import CANARY, RunnerRig, reference_runner_json


def _parse(ts: str) -> dt.datetime:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))


def test_runner_registers_and_reports_its_catalogue(rig: RunnerRig) -> None:
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state))
    report = rig.wait_registered(proc)

    runner = rig.runner()
    assert runner["spec"] == {"poolRef": {"name": "pool-a"}}
    assert report["provider"] == "reference"
    assert report["adapter"]["type"] == "acp"
    assert report["adapter"]["name"] == "helmhive-reference-agent"
    assert report["adapter"]["version"]
    assert report["authentication"]["state"] == "Authenticated"
    assert report["authentication"]["reason"] == "SessionCreated"
    assert report["catalogue"]["default"] == "reference-small"
    assert [m["id"] for m in report["catalogue"]["models"]] == ["reference-small", "reference-large"]
    assert report["catalogue"]["models"][0]["efforts"] == ["low", "medium", "high"]
    assert report["placementLabels"] == {"zone": "test-a", "domain": "code"}
    assert report["capabilities"] == ["structured-output", "diff-review"]
    # What the agent advertised over ACP, and where each offered capability comes from.
    assert {"session-load", "session-fork"} <= set(report["agentCapabilities"])
    assert report["offeredCapabilities"] == [
        {"name": "structured-output", "source": "Pool"},
        {"name": "diff-review", "source": "Pool"},
    ]
    assert report.get("withheldCapabilities", []) == []
    assert report["concurrency"] == 1
    assert report["activeJobs"] == 0
    assert report["credentialGeneration"] == 1
    assert report["podName"] == "pool-a-0"
    assert report["environmentFingerprint"].startswith("sha256:")
    # status.report is owned by the runner's field manager, through the status subresource.
    managers = {(m["manager"], m.get("subresource")) for m in runner["metadata"]["managedFields"]}
    assert ("helmhive-runner", "status") in managers
    # The Lease exists, named and labelled as the contract says, held by the runner.
    lease = rig.lease()
    assert lease.spec.holder_identity == "pool-a-0"
    assert lease.spec.lease_duration_seconds == 5
    assert lease.metadata.labels == {"helmhive.dev/runner": "pool-a-0"}
    # A Registered event about the Runner was posted by the runner itself (after its report).
    registered = rig.wait_events("Registered")["Registered"]
    assert registered.involved_object.kind == "Runner" and registered.source.component == "helmhive-runner"


def test_report_is_not_written_per_heartbeat(rig: RunnerRig) -> None:
    """Over a window with several lease renewals (and probes), the Runner is not written at all."""
    # The periodic refresh is set far beyond the window, however long a loaded machine makes it:
    # a write in the window can then only come from a heartbeat or a probe, which must not write.
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state, renew=1, refresh=600))
    rig.wait_registered(proc)
    wait_for(lambda: len(proc.messages("report written")) >= 1, timeout=30, describe="the registration write")
    version_before = rig.runner()["metadata"]["resourceVersion"]
    renew_before = rig.lease().spec.renew_time
    lease_rv_before = rig.lease().metadata.resource_version
    started = time.monotonic()

    seen_renewals: set[str] = set()

    def several_renewals_and_probes() -> bool:
        lease = rig.lease()
        seen_renewals.add(lease.metadata.resource_version)
        probes = len(proc.messages("adapter probed"))
        return len(seen_renewals - {lease_rv_before}) >= 5 and probes >= 3

    wait_for(several_renewals_and_probes, timeout=40, interval=0.5, describe="5 lease renewals and 3 probes")
    window = time.monotonic() - started
    renew_after = rig.lease().spec.renew_time
    assert renew_after > renew_before
    assert rig.runner()["metadata"]["resourceVersion"] == version_before, "the Runner was written during the window"
    writes = proc.messages("report written")
    assert [w["reason"] for w in writes] == ["Registration"]
    # The figures for the record: lease writes vs report writes per minute over the window.
    lease_per_min = len(seen_renewals - {lease_rv_before}) * 60 / window
    print(f"window {window:.1f}s: lease renewals/min >= {lease_per_min:.0f}, report writes/min = 0")


def _report_writes(rig: RunnerRig) -> int:
    """Writes to ``runners/status`` the API server has counted (``apiserver_request_total``)."""
    series = scrape_apiserver(rig.kube.api_client).series(
        "apiserver_request_total", resource="runners", subresource="status"
    )
    return int(sum(s.value for s in series if s.labels.get("verb") in {"PATCH", "APPLY", "PUT", "POST"}))


def test_every_renewal_carries_the_digest_and_the_report_is_written_only_when_it_changes(rig: RunnerRig) -> None:
    login = rig.root / "login"
    login.mkdir(parents=True)
    (login / "token").write_text(CANARY, encoding="utf-8")
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state, renew=1, refresh=600), credential_dir=login)
    rig.wait_registered(proc)

    def digest_of_report() -> str:
        return build_report_digest(RunnerReport.model_validate(rig.report()))

    def lease_digest() -> tuple[str, str | None]:
        lease = rig.lease()
        return lease.metadata.resource_version, (lease.metadata.annotations or {}).get(REPORT_DIGEST_ANNOTATION)

    first = wait_for(digest_of_report, timeout=30, describe="the first report")
    wait_for(lambda: lease_digest()[1] == first, timeout=30, describe="the Lease to carry the report's digest")
    assert rig.report()["authentication"]["verifiedAt"]
    before = _report_writes(rig)

    def renewals_carrying(seen: dict[str, str | None], count: int) -> bool:
        version, carried = lease_digest()
        seen[version] = carried
        return len(seen) >= count

    quiet: dict[str, str | None] = {}
    wait_for(lambda: renewals_carrying(quiet, 5), timeout=40, interval=0.3, describe="5 renewals")
    assert set(quiet.values()) == {first}, "every renewal carries the current digest"
    assert _report_writes(rig) == before, "no report write while nothing changed"

    # The login goes away: the next probe says NoCredential, so the digest changes -- one report
    # write, and the Lease carries the new digest from then on.
    (login / "token").unlink()
    wait_for(
        lambda: rig.report()["authentication"]["reason"] == "NoCredential", timeout=30, describe="the new auth state"
    )
    second = digest_of_report()
    assert second != first
    wait_for(lambda: lease_digest()[1] == second, timeout=30, describe="the Lease to carry the new digest")
    after: dict[str, str | None] = {}
    wait_for(lambda: renewals_carrying(after, 4), timeout=40, interval=0.3, describe="4 more renewals")
    assert set(after.values()) == {second}
    assert _report_writes(rig) - before == 1, "exactly one report write, for the one change"
    assert [w["reason"] for w in proc.messages("report written")] == ["Registration", "Changed"]


def test_unauthenticated_agent_is_reported_with_a_reason(rig: RunnerRig) -> None:
    proc = rig.start(reference_runner_json(mode="unauthenticated", agent_state=rig.agent_state))
    report = rig.wait_registered(proc)
    auth = report["authentication"]
    assert auth["state"] == "Unauthenticated"
    # The runner's key is in HELMHIVE_REFERENCE_AGENT_TOKEN, which the agent's env_var method names:
    # the adapter called authenticate with it, and the agent (mode unauthenticated) refused.
    assert auth["reason"] == "AuthenticateFailed"
    assert "reference-token" in auth["message"]
    assert report["adapter"]["name"] == "helmhive-reference-agent"
    assert report["catalogue"] == {"models": []}
    assert proc.popen.poll() is None, "the runner must keep running and heartbeating"


def test_runner_without_credential_never_claims_authenticated(rig: RunnerRig) -> None:
    empty = rig.root / "login"
    empty.mkdir(parents=True)
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state), credential_dir=empty)
    auth = rig.wait_registered(proc)["authentication"]
    assert auth["state"] == "Unauthenticated"
    assert auth["reason"] == "NoCredential"
    assert "Authenticated/SessionCreated" in auth["message"]


def test_sigterm_releases_the_lease_and_exits_zero(rig: RunnerRig) -> None:
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state))
    rig.wait_registered(proc)
    assert rig.lease_exists()
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert not rig.lease_exists()
    stopped = proc.messages("runner stopped")
    assert stopped and stopped[-1]["why"] == "stop" and stopped[-1]["leaseReleased"] is True
    # Stays registered: the Runner object and its report remain for the operator to judge.
    assert rig.report()["podName"] == "pool-a-0"


def test_draining_and_disabled_keep_the_runner_registered(rig: RunnerRig) -> None:
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state))
    rig.wait_registered(proc)
    for state in ("Draining", "Disabled", "Active"):
        rig.set_control_state(state)
        wait_for(
            lambda s=state: any(m.get("state") == s for m in proc.messages("control state changed")),
            timeout=30,
            describe=f"the runner to see {state}",
        )
        assert proc.popen.poll() is None
        assert rig.lease_exists()
    rig.wait_events("ControlDraining", "ControlDisabled", "ControlActive")


def test_revoked_wipes_the_credential_exits_zero_and_refuses_the_same_generation(rig: RunnerRig) -> None:
    login = rig.root / "login"
    (login / ".config").mkdir(parents=True)
    (login / ".config" / "token.json").write_text(json.dumps({"token": CANARY}))
    (login / "session").write_text("x")
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state), credential_dir=login, generation=3)
    rig.wait_registered(proc)
    rig.set_control_state("Revoked")
    assert proc.wait(timeout=40) == 0
    assert login.is_dir() and list(login.iterdir()) == [], "the login directory's contents must be wiped"
    assert not rig.lease_exists()
    assert rig.report()["credentialGeneration"] == 3
    assert "CredentialWiped" in {e.reason for e in rig.events()}

    # The same generation again: refused, without touching the Lease or the report.
    (login / "fresh").write_text("y")
    again = rig.start(reference_runner_json(agent_state=rig.agent_state), credential_dir=login, generation=3)
    assert again.wait(timeout=40) == 3
    refused = again.messages("refusing to start")
    assert refused and refused[0]["reason"] == "RevokedCredentialGeneration"
    assert not rig.lease_exists()
    assert list(login.iterdir()) == []


def test_a_file_credential_copy_is_wiped_on_revocation(rig: RunnerRig) -> None:
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state), generation=2)
    rig.wait_registered(proc)
    copy = rig.state_dir / "credential" / "credential"
    assert copy.read_text() == CANARY
    assert oct(copy.stat().st_mode & 0o777) == "0o600"
    rig.set_control_state("Revoked")
    assert proc.wait(timeout=40) == 0
    assert not copy.exists()
    assert (rig.root / "secret" / "credential").read_text() == CANARY, (
        "the mounted Secret is not the runner's to change"
    )
    assert (rig.state_dir / "revoked-generation").read_text().strip() == "2"


def test_the_canary_credential_appears_nowhere(rig: RunnerRig) -> None:
    """The credential reaches the agent (its env) but never the Runner, events, Lease, logs or report."""
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state))
    rig.wait_registered(proc)
    # The agent did get the credential in its environment (by name; the agent never logs values).
    init = [json.loads(line) for line in (rig.agent_state / "methods.jsonl").read_text().splitlines()]
    assert any("HELMHIVE_REFERENCE_AGENT_TOKEN" in entry.get("envKeys", []) for entry in init)
    rig.set_control_state("Draining")
    wait_for(lambda: proc.messages("control state changed"), timeout=30, describe="the Draining transition")
    rig.wait_events("ControlDraining")  # posted after the transition is logged; the sweep below reads it
    lease_text = json.dumps(rig.lease().to_dict(), default=str)
    assert CANARY not in lease_text and "pool-a-0" in lease_text
    proc.terminate()
    assert proc.wait(timeout=30) == 0

    runner_text = json.dumps(rig.runner())
    events_text = json.dumps([e.to_dict() for e in rig.events()], default=str)
    log_text = proc.raw_log()
    assert "report written" in log_text and "runner stopped" in log_text
    for where, text in {"runner": runner_text, "events": events_text, "log": log_text}.items():
        assert CANARY not in text, f"the credential leaked into the {where}"
        assert CANARY[:12] not in text, f"part of the credential leaked into the {where}"


def _operator_apply(rig: RunnerRig, status: dict[str, object]) -> None:
    """Write status fields as the operator does: server-side apply, field manager helmhive-operator."""
    body = {"apiVersion": "helmhive.dev/v1alpha1", "kind": "Runner", "metadata": {"name": rig.name}, "status": status}
    rig.kube.custom.patch_namespaced_custom_object_status(
        "helmhive.dev",
        "v1alpha1",
        rig.namespace,
        "runners",
        rig.name,
        body,
        field_manager="helmhive-operator",
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def test_runner_and_operator_field_managers_never_overwrite_each_other(rig: RunnerRig) -> None:
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state))
    first = rig.wait_registered(proc)
    _operator_apply(rig, {"reportedStatus": "Online", "effectiveControlState": "Draining"})
    assert rig.report() == first, "the operator's apply must leave the runner's report alone"
    # The runner obeys the operator's effective state even though spec.controlState is unset.
    wait_for(
        lambda: any(m.get("state") == "Draining" for m in proc.messages("control state changed")),
        timeout=30,
        describe="the runner to follow status.effectiveControlState",
    )
    proc.terminate()
    assert proc.wait(timeout=30) == 0

    _operator_apply(rig, {"reportedStatus": "Online", "effectiveControlState": "Active"})
    again = rig.start(reference_runner_json(agent_state=rig.agent_state))
    wait_for(
        lambda: rig.report().get("registeredAt") != first["registeredAt"],
        timeout=60,
        describe="a new registration",
    )
    status = rig.runner()["status"]
    assert status["reportedStatus"] == "Online" and status["effectiveControlState"] == "Active"
    owners = {
        m["manager"]: json.dumps(m.get("fieldsV1", {}))
        for m in rig.runner()["metadata"]["managedFields"]
        if m.get("subresource") == "status"
    }
    assert '"f:report"' in owners["helmhive-runner"] and '"f:reportedStatus"' not in owners["helmhive-runner"]
    assert '"f:reportedStatus"' in owners["helmhive-operator"] and '"f:report"' not in owners["helmhive-operator"]
    assert again.popen.poll() is None


def test_runner_passes_the_runner_identity_admission_policy(rig: RunnerRig) -> None:
    """With the operator's ValidatingAdmissionPolicy in force, the runner registers, reports and renews."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from helmhive.deploy.manifests import build_runner_identity_policy

    admission = client.AdmissionregistrationV1Api(rig.kube.api_client)
    policy, binding = build_runner_identity_policy()
    created: list[str] = []
    for body, create in (
        (policy, admission.create_validating_admission_policy),
        (binding, admission.create_validating_admission_policy_binding),
    ):
        try:
            create(body)
            created.append(body["kind"])
        except ApiException as exc:
            if exc.status != 409:
                raise
    try:
        rig.ensure_rbac()
        unbound = rig.identities(rig.namespace, rig.service_account, create=False)
        leases = client.CoordinationV1Api(unbound.api_client())
        intruder = client.V1Lease(metadata=client.V1ObjectMeta(name="pool-a-0"), spec=client.V1LeaseSpec())

        def policy_in_force() -> bool:
            try:
                leases.create_namespaced_lease(rig.namespace, intruder)
            except ApiException as exc:
                assert exc.status == 403 and "not bound to a pod" in (exc.body or "")
                return True
            leases.delete_namespaced_lease("pool-a-0", rig.namespace)
            return False

        wait_for(policy_in_force, timeout=30, describe="the runner identity policy to refuse an unbound token")
        proc = rig.start(reference_runner_json(agent_state=rig.agent_state))
        report = rig.wait_registered(proc)
        assert report["authentication"]["state"] == "Authenticated"
        renewed = rig.lease().spec.renew_time
        wait_for(lambda: rig.lease().spec.renew_time > renewed, timeout=60, describe="a renewal under the policy")
        assert not [line for line in proc.lines() if line.get("severity") in ("WARNING", "ERROR")]
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        assert not rig.lease_exists()
    finally:
        if "ValidatingAdmissionPolicyBinding" in created:
            admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        if "ValidatingAdmissionPolicy" in created:
            admission.delete_validating_admission_policy(policy["metadata"]["name"])


_WATCHED = ("agentjobs", "runners")


def test_a_quiet_runner_resumes_its_watches_without_listing_again(rig: RunnerRig, cluster: ClusterHandle) -> None:
    # Watch requests of 5 s: each of the runner's two watches (its Runner, its jobs) ends several
    # times in the window, and each resumes from the last version it saw instead of listing again,
    # so a quiet runner costs the API server no read (a list every round was a poll per runner).
    # The audit log names the client of each request: kube-controller-manager lists the same
    # resources while it empties earlier tests' namespaces.
    audit = ApiAuditLog.of(cluster)
    user = f"system:serviceaccount:{rig.namespace}:{rig.service_account}"

    def requests(verbs: set[str]) -> dict[str, int]:
        return audit.count(user=user, verbs=verbs, resources=_WATCHED)

    proc = rig.start(reference_runner_json(renew=1, refresh=600), extra_env={"HELMHIVE_WATCH_ROUND_SECONDS": "5"})
    rig.wait_registered(proc)
    watching = {"watch"}
    reading = {"list", "get"}
    wait_for(
        lambda: all(requests(watching).values()),
        timeout=60,
        describe="a first watch round of each watch to end",
    )
    reads = requests(reading)
    relists = len(proc.messages("watch listing again"))
    watches = requests(watching)
    assert all(reads.values()), reads  # each watch listed when it started

    def three_more_rounds_each() -> bool:
        now = requests(watching)
        return all(now[r] >= watches[r] + 3 for r in _WATCHED)

    wait_for(three_more_rounds_each, timeout=90, interval=1, describe="three more rounds of each watch")
    after = requests(reading)
    # A list again is allowed only with a reason the runner logs (the API server said the version
    # is too old, or a request failed); on a quiet machine there is none.
    explained = len(proc.messages("watch listing again")) - relists
    assert sum(after.values()) - sum(reads.values()) == explained, (reads, after, proc.messages("watch listing again"))
    assert explained <= 1, proc.messages("watch listing again")
    assert proc.popen.poll() is None

"""Governed changes end to end: the real operator, real runner pods, the reference agent, a real git server.

Each test applies a Change against a repository served by ``git daemon`` on loopback and waits for
its conditions. The patch is read back through ``helmhive change patch`` and applied with
``git apply`` to a fresh clone at the exact commit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from change_rig import (
    GIT_CANARY,
    GROUP,
    PROVIDER_CANARY,
    SESSION_PREFIX,
    SOURCE,
    VERSION,
    ChangeRig,
    change,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.cluster import ClusterHandle
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for

FINAL = (
    "ReviewApproved",
    "ChangesRequested",
    "ChecksFailed",
    "PlanningFailed",
    "ImplementationFailed",
    "ReviewFailed",
    "JobMissing",
)


def cli(cluster: ClusterHandle, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "helmhive", "change", *args, "--kubeconfig", str(kubeconfig or cluster.kubeconfig)],
        capture_output=True,
        timeout=60,
        check=False,
    )


def conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in obj["status"]["conditions"]}


def job(rig: ChangeRig, name: str) -> dict[str, Any]:
    return rig.get("agentjobs", name)


def fresh_clone(rig: ChangeRig, commit: str, where: Path) -> Path:
    subprocess.run(["git", "clone", "--quiet", str(rig.repo.path), str(where)], check=True)
    subprocess.run(["git", "-C", str(where), "checkout", "--quiet", commit], check=True)
    return where


def test_a_governed_change_is_planned_implemented_checked_and_reviewed_on_another_provider(
    rig: ChangeRig, cluster: ClusterHandle, operator: OperatorProcess, tmp_path: Path
) -> None:
    commit = rig.repo.head
    description = (
        "POST /refunds must take an Idempotency-Key.\n"
        "APPEND-LINE: app.py :: # refunds are idempotent\n"
        "WRITE-BYTES: data/blob.bin :: 3000\n"
        "DELETE-FILE: README.md\n"
    )
    checks = [
        {"name": "marker", "command": ["sh", "-c", "grep -q idempotent app.py && echo found"], "timeoutSeconds": 60},
        {"name": "blob", "command": ["test", "-f", "data/blob.bin"]},
    ]
    # A private repository: the runners fetch it with the pool's git credentials over smart HTTP.
    rig.apply(change("refunds", rig.private_url, commit, description, checks=checks))
    obj = rig.wait_ready("refunds", final=FINAL)
    status = obj["status"]
    assert conditions(obj) == {
        "Planned": ("True", "PlanReady"),
        "Approved": ("True", "ApprovedAutomatically"),
        "Implemented": ("True", "PatchReady"),
        "Checked": ("True", "ChecksPassed"),
        "Reviewed": ("True", "ReviewApproved"),
        "Ready": ("True", "ReviewApproved"),
    }
    assert [(j["name"], j["provider"], j["outcome"]) for j in status["jobs"]] == [
        ("refunds-plan", "alpha", "Completed"),
        ("refunds-impl-1", "alpha", "Completed"),
        ("refunds-review-1", "beta", "Completed"),
    ]
    review = status["review"]
    assert review["verdict"] == "approve" and review["providerDiffers"] is True
    assert review["provider"] == "beta" and review["implementationProvider"] == "alpha"
    assert [c["criterion"] for c in review["criteria"]] == [0, 1]
    assert status["approval"]["by"] == "Automatic" and status["approval"]["digest"] == status["plan"]["digest"]
    assert [(c["name"], c["outcome"], c["exitCode"]) for c in status["checkEvidence"]] == [
        ("marker", "Passed", 0),
        ("blob", "Passed", 0),
    ]
    assert "found" in status["checkEvidence"][0]["outputTail"]

    # Each job is owned by the Change, carries its stage, and ran fresh with no memory.
    for name, stage in (
        ("refunds-plan", "planning"),
        ("refunds-impl-1", "implementation"),
        ("refunds-review-1", "review"),
    ):
        body = job(rig, name)
        owner = body["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Change", "refunds", obj["metadata"]["uid"])
        assert body["spec"]["change"]["stage"] == stage
        assert body["spec"]["source"] == {"repository": rig.private_url, "commit": commit}
        assert body["status"]["session"]["mode"] == "fresh"
        assert body["status"]["assignment"].get("memoryIds", []) == []
    assert job(rig, "refunds-review-1")["spec"]["patch"]["sha256"] == status["patch"]["sha256"]

    # The stored patch, as the CLI prints it, applies to the exact commit and reproduces the agent's tree.
    printed = cli(cluster, "patch", "refunds", "-n", rig.namespace)
    assert printed.returncode == 0, printed.stderr
    assert hashlib.sha256(printed.stdout).hexdigest() == status["patch"]["sha256"]
    assert len(printed.stdout) == status["patch"]["bytes"] and status["patch"]["files"] == 3
    clone = fresh_clone(rig, commit, tmp_path / "clone")
    patch_file = tmp_path / "change.patch"
    patch_file.write_bytes(printed.stdout)
    subprocess.run(["git", "-C", str(clone), "apply", "--check", str(patch_file)], check=True)
    subprocess.run(["git", "-C", str(clone), "apply", str(patch_file)], check=True)
    assert (clone / "app.py").read_text() == SOURCE["app.py"] + "# refunds are idempotent\n"
    assert not (clone / "README.md").exists()
    assert len((clone / "data" / "blob.bin").read_bytes()) == 3000
    assert (clone / "logo.bin").read_bytes() == SOURCE["logo.bin"]

    shown = cli(cluster, "status", "refunds", "-n", rig.namespace)
    text = shown.stdout.decode()
    assert shown.returncode == 0, shown.stderr
    for expected in (
        "refunds-impl-1",
        "alpha",
        "beta",
        "approve",
        status["plan"]["digest"],
        "marker",
        "Passed",
        status["patch"]["sha256"],
    ):
        assert expected in text, f"{expected!r} missing from:\n{text}"

    # Every stage is audited: job, provider, plan digest, approval, patch digest and size, checks, verdict.
    records = rig.kube.custom.list_namespaced_custom_object(GROUP, VERSION, rig.namespace, "auditrecords")["items"]
    by_action = {r["spec"]["action"]: r["spec"] for r in records if r["spec"]["object"]["kind"] == "Change"}
    assert set(by_action) == {"ChangePlanned", "ChangeApproved", "ChangeImplemented", "ChangeReviewed"}
    assert by_action["ChangePlanned"]["details"]["planDigest"] == status["plan"]["digest"]
    assert by_action["ChangeImplemented"]["details"]["patchSha256"] == status["patch"]["sha256"]
    assert by_action["ChangeImplemented"]["details"]["check.marker"] == "Passed"
    assert by_action["ChangeReviewed"]["details"]["verdict"] == "approve"
    assert by_action["ChangeReviewed"]["details"]["provider"] == "beta"

    assert any(r.authorized for r in rig.http.requests), "the runners fetched with the pool's credential"
    assert not any(r.authorized is False for r in rig.http.requests), "no fetch went out without it"
    sweep_canaries(rig, cluster, operator, outputs=[printed.stdout, shown.stdout, shown.stderr])


def sweep_canaries(rig: ChangeRig, cluster: ClusterHandle, operator: OperatorProcess, *, outputs: list[bytes]) -> None:
    """Every object in the namespace (status included), every Event, the logs and the CLI's output: no canary."""
    kinds = [
        k
        for k in rig.kubectl("api-resources", "--namespaced=true", "--verbs=list", "-o", "name").stdout.split()
        if k != "secrets"
    ]  # Secrets are where the credentials are meant to live
    assert "changes.helmhive.dev" in kinds and "events" in kinds
    texts = [rig.kubectl("get", ",".join(kinds), "-n", rig.namespace, "-o", "json").stdout]
    assert '"kind": "Change"' in texts[0] and '"checkEvidence"' in texts[0], "the sweep reads every kind, status too"
    for pod in rig.pods.values():
        texts.append((pod.root / "container.log").read_text(errors="replace"))
    texts.append(operator.log_path.read_text(errors="replace"))
    events = rig.kube.core.list_namespaced_event(rig.namespace)
    assert events.items, "the sweep reads Events"
    texts.append(json.dumps(rig.kube.api_client.sanitize_for_serialization(events)))
    texts += [o.decode(errors="replace") for o in outputs]
    # Every native session id the reference agent makes starts with the planted prefix; the prefix alone
    # appears in the pools' configuration, a whole id must appear nowhere.
    session_id = re.compile(re.escape(SESSION_PREFIX) + "[0-9a-f]{32}")
    for text in texts:
        assert PROVIDER_CANARY not in text
        assert GIT_CANARY not in text
        assert base64.b64encode(f"ci-bot:{GIT_CANARY}".encode()).decode() not in text
        assert session_id.search(text) is None, session_id.search(text)


def test_a_failing_check_is_evidence_for_the_reviewer_who_requests_changes(rig: ChangeRig) -> None:
    description = "APPEND-LINE: app.py :: # touched\n"
    checks = [{"name": "fixed", "command": ["sh", "-c", "echo missing >&2; test -f fixed.txt"]}]
    rig.apply(change("broken", rig.url, rig.repo.head, description, checks=checks))
    obj = rig.wait_ready("broken", final=FINAL)
    assert conditions(obj)["Checked"] == ("False", "ChecksFailed")
    assert conditions(obj)["Reviewed"] == ("False", "ChangesRequested")
    assert conditions(obj)["Ready"] == ("False", "ChangesRequested")
    evidence = obj["status"]["checkEvidence"][0]
    assert (evidence["outcome"], evidence["exitCode"]) == ("Failed", 1)
    assert "missing" in evidence["outputTail"] and len(evidence["outputSha256"]) == 64
    review = obj["status"]["review"]
    assert review["verdict"] == "request-changes"
    assert any("fixed" in f["message"] for f in review["findings"])
    assert "- check fixed: Failed exit=1" in job(rig, "broken-review-1")["spec"]["request"]["prompt"]


def test_request_changes_sends_the_change_back_to_a_fresh_implementation_then_it_is_approved(rig: ChangeRig) -> None:
    description = "APPEND-LINE: app.py :: # first try\nIF-FINDINGS APPEND-LINE: fixed.txt :: fixed\n"
    checks = [{"name": "fixed", "command": ["test", "-f", "fixed.txt"]}]
    rig.apply(change("retry", rig.url, rig.repo.head, description, checks=checks, maxIterations=2))
    obj = rig.wait_ready("retry", final=FINAL)
    status = obj["status"]
    assert conditions(obj)["Ready"] == ("True", "ReviewApproved")
    assert status["iteration"] == 2
    assert [j["name"] for j in status["jobs"]] == [
        "retry-plan",
        "retry-impl-1",
        "retry-review-1",
        "retry-impl-2",
        "retry-review-2",
    ]
    second = job(rig, "retry-impl-2")
    assert second["spec"]["change"]["iteration"] == 2
    assert "## Review findings to address (from the review of iteration 1)" in second["spec"]["request"]["prompt"]
    assert second["status"]["session"]["mode"] == "fresh"
    assert status["review"]["iteration"] == 2 and status["checkEvidence"][0]["outcome"] == "Passed"


def test_a_manual_change_waits_for_an_approval_of_its_exact_plan_by_an_allowed_person(
    rig: ChangeRig, cluster: ClusterHandle, service_account_identity: Any, kubectl: Kubectl
) -> None:
    rig.apply(change("gated", rig.url, rig.repo.head, "APPEND-LINE: app.py :: # gated\n", approval="Manual"))
    obj = rig.wait_ready("gated", final=("AwaitingApproval",))
    digest = obj["status"]["plan"]["digest"]
    assert conditions(obj)["Planned"] == ("True", "PlanReady")
    assert [j["name"] for j in obj["status"]["jobs"]] == ["gated-plan"]

    outsider = service_account_identity(rig.namespace, "outsider")
    approver = service_account_identity(rig.namespace, "approver")
    for who in (outsider, approver):
        rig.kube.rbac.create_namespaced_role_binding(
            rig.namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name=f"{who.service_account}-edit"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit-changes"
                ),
                subjects=[
                    client.RbacV1Subject(kind="ServiceAccount", name=who.service_account, namespace=rig.namespace)
                ],
            ),
        )
    _ensure_cluster_role(rig, "edit-changes", ["get", "list", "watch", "patch"])
    rig.kube.rbac.create_namespaced_role_binding(
        rig.namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="approver-approves"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="helmhive-change-approver"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="approver", namespace=rig.namespace)],
        ),
    )

    # Someone who may edit Changes but not approve them is refused by the API server.
    refused = cli(cluster, "approve", "gated", "-n", rig.namespace, kubeconfig=outsider.kubeconfig)
    assert refused.returncode == 1
    assert b"approve verb" in refused.stderr, refused.stderr
    # An approver may not approve in someone else's name.
    forged = {"spec": {"approvedPlan": {"digest": digest, "by": "somebody-else"}}}
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(approver.api_client()).patch_namespaced_custom_object(
            GROUP, VERSION, rig.namespace, "changes", "gated", forged
        )
    assert err.value.status in (403, 422) and "own username" in (err.value.body or "")
    # An approval of another digest does not count.
    stale = "sha256:" + "0" * 64
    client.CustomObjectsApi(approver.api_client()).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        rig.namespace,
        "changes",
        "gated",
        {"spec": {"approvedPlan": {"digest": stale, "by": approver.username}}},
    )
    mismatch = wait_for(
        lambda: (c := rig.condition("gated", "Approved")) and c["reason"] == "ApprovalDigestMismatch" and c, timeout=60
    )
    assert digest in mismatch["message"]
    assert [j["name"] for j in rig.get("changes", "gated")["status"]["jobs"]] == ["gated-plan"]
    # The CLI approves the current digest in the approver's name; the change goes on.
    approved = cli(cluster, "approve", "gated", "-n", rig.namespace, "--digest", digest, kubeconfig=approver.kubeconfig)
    assert approved.returncode == 0, approved.stderr
    obj = rig.wait_ready("gated", final=FINAL)
    assert conditions(obj)["Approved"] == ("True", "ApprovedManually")
    assert obj["status"]["approval"] == {**obj["status"]["approval"], "by": approver.username, "digest": digest}
    records = rig.kube.custom.list_namespaced_custom_object(GROUP, VERSION, rig.namespace, "auditrecords")["items"]
    audit = next(r["spec"] for r in records if r["spec"]["action"] == "ChangeApproved")
    assert audit["actor"]["username"] == approver.username and audit["details"]["planDigest"] == digest


def _ensure_cluster_role(rig: ChangeRig, name: str, verbs: list[str]) -> None:
    body = client.V1ClusterRole(
        metadata=client.V1ObjectMeta(name=name),
        rules=[client.V1PolicyRule(api_groups=[GROUP], resources=["changes"], verbs=verbs)],
    )
    try:
        rig.kube.rbac.create_cluster_role(body)
    except ApiException as err:
        if err.status != 409:
            raise


def test_review_falls_back_to_the_same_provider_in_a_fresh_context(rig: ChangeRig) -> None:
    rig.apply(change("alone", rig.url, rig.repo.head, "APPEND-LINE: app.py :: # alone\n", workspace="solo"))
    obj = rig.wait_ready("alone", final=FINAL)
    review = obj["status"]["review"]
    assert conditions(obj)["Ready"] == ("True", "ReviewApproved")
    assert (review["provider"], review["implementationProvider"], review["providerDiffers"]) == (
        "alpha",
        "alpha",
        False,
    )
    impl, rev = job(rig, "alone-impl-1"), job(rig, "alone-review-1")
    assert rev["status"]["session"]["mode"] == "fresh"
    assert rev["status"]["routing"]["avoidedProvider"] == "alpha"
    assert impl["status"]["session"].get("binding") is None or (
        impl["status"]["session"].get("binding") != rev["status"]["session"].get("binding")
    )


def test_a_commit_that_does_not_exist_ends_the_change_with_the_jobs_reason(rig: ChangeRig) -> None:
    rig.apply(change("ghost", rig.url, "0" * 40, "APPEND-LINE: app.py :: # x\n"))
    obj = rig.wait_ready("ghost", final=FINAL)
    assert conditions(obj)["Planned"] == ("False", "CommitNotFound")
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "PlanningFailed" and "ghost-plan" in ready["message"]


def test_deleting_a_change_cancels_its_running_job_and_removes_what_it_owns(rig: ChangeRig) -> None:
    rig.apply(change("doomed", rig.url, rig.repo.head, "REFERENCE-AGENT: stall\n"))
    wait_for(
        lambda: (
            (c := (job(rig, "doomed-plan").get("status") or {}).get("conditions"))
            and any(x["type"] == "Running" and x["status"] == "True" for x in c)
        ),
        timeout=120,
        describe="the planning job to run",
    )
    rig.kubectl("delete", "change", "doomed", "-n", rig.namespace, "--wait=true")

    def gone() -> bool:
        try:
            job(rig, "doomed-plan")
        except ApiException as err:
            return err.status == 404
        return False

    wait_for(gone, timeout=120, describe="the garbage collector to delete the Change's job")
    log = rig.pods["alpha-0"].root / "container.log"
    wait_for(
        lambda: "Cancelled" in log.read_text(errors="replace") or "cancel" in log.read_text(errors="replace"),
        timeout=60,
        describe="the runner to cancel the deleted job's turn",
    )
    # The runner is free again: another change runs to the end on it.
    rig.apply(change("after", rig.url, rig.repo.head, "APPEND-LINE: app.py :: # after\n", workspace="solo"))
    assert conditions(rig.wait_ready("after", final=FINAL))["Ready"] == ("True", "ReviewApproved")

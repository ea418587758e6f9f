"""Policy suggestions reach a pull request: exported to files, validated, audited, never applied.

The real operator, its admission policies and a runner made schedulable the way real ones are
(its own Lease and report, with a token bound to its pod; :mod:`pools`). A ``policy-suggestion``
job is routed to that runner; its result is then written to ``status.result`` as the runner
writes a finished job's result (the agent's answer needs no model here: its contents are what
this test exports). Then, as a person allowed to export (the chart's ``helmhive-suggestion-exporter``
role): ``helmhive suggestions list|export``, ``helmhive validate`` on the files, and what the
cluster holds afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from pools import CANARY, Pool, condition, make_pool
from simulated_runner import GROUP, VERSION, SimulatedRunner

from harness.identity import Identity
from harness.kube import IdentityFactory, Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for

API = f"{GROUP}/{VERSION}"
SONNET = "claude-sonnet-4-5"
CAPABILITIES = ["structured-output", "diff-review", "workspace-write"]
TEXT_CANARY = f"text-canary-{uuid.uuid4().hex}"  # the agent's words: in the files, never in the audit trail


def _suggestions() -> list[dict[str, Any]]:
    return [
        {
            "name": "ledger-append-only",
            "kind": "constraint",
            "scope": {"type": "service", "service": "ledger"},
            "text": f"Ledger entries are append-only; corrections are reversing entries. {TEXT_CANARY}",
            "sensitivity": "internal",
            "rationale": "Two reviews this month reverted in-place edits of ledger rows.",
        },
        {
            "kind": "decision",
            "scope": {"type": "workspace"},
            "text": "Money is integer cents.",
            "sensitivity": "public",
            "rationale": "Every service already stores cents.",
        },
    ]


def _obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name}, "spec": spec}


def _create(kube: Kube, namespace: str, plural: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)


def _get(kube: Kube, namespace: str, plural: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    return obj


def _items(kube: Kube, namespace: str, plural: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
    return items


def _job(name: str, kind: str, profile: str, **extra: Any) -> dict[str, Any]:
    return _obj(
        "AgentJob",
        name,
        {
            "workspace": "payments",
            "jobKind": kind,
            "profile": profile,
            "request": {"title": name, "prompt": "Look at the ledger service."},
            "timeoutSeconds": 600,
            **extra,
        },
    )


def _assigned(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    def routed() -> dict[str, Any] | None:
        job = _get(kube, namespace, "agentjobs", name)
        return job if condition(job, "Routed").get("status") == "True" else None

    found: dict[str, Any] = wait_for(routed, timeout=60, describe=f"job {name} routed")
    return found


def _cli(identity: Identity, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "helmhive", *args, "--kubeconfig", str(identity.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def runner(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> Iterator[SimulatedRunner]:
    pool: Pool = make_pool(
        kube,
        service_account_identity,
        namespace,
        replicas=1,
        concurrency=4,
        capabilities=CAPABILITIES,
        heartbeat={"leaseDurationSeconds": 30, "renewIntervalSeconds": 5, "reportRefreshSeconds": 300},
    )
    (pod,) = pool.wait_pods(1)
    generation = wait_for(
        lambda: (pool.get().get("status") or {}).get("credentialGeneration"), timeout=30, describe="credential"
    )
    made = pool.acting_as(pod, lease_seconds=30)
    made.register(generation=generation, provider="anthropic", models=(SONNET,))
    report = made.build_report(generation=generation, provider="anthropic", models=(SONNET,))
    report.update(concurrency=4, capabilities=CAPABILITIES)
    made.apply_status({"report": report})
    made.start_heartbeat(interval=5)
    try:
        pool.wait_runner(pod, "schedulable", timeout=60, schedulable="Schedulable")
        yield made
    finally:
        made.stop_heartbeat()


@pytest.fixture
def exporter(kube: Kube, namespace: str, service_account_identity: IdentityFactory) -> Identity:
    """A person who may export suggestions: the chart's helmhive-suggestion-exporter role, in this namespace."""
    who = service_account_identity(namespace, "exporter")
    kube.rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="exporter-exports"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="helmhive-suggestion-exporter"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="exporter", namespace=namespace)],
        ),
    )
    return who


def test_a_suggestion_exported_to_a_file_is_valid_audited_and_memory_only_once_committed(
    runner: SimulatedRunner,
    exporter: Identity,
    kube: Kube,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    workspace = _obj(
        "Workspace",
        "payments",
        {"repository": {"url": "https://git.example.com/acme/payments.git"}, "services": [{"name": "ledger"}]},
    )
    _create(kube, namespace, "workspaces", workspace)
    mappings = [{"provider": "anthropic", "model": SONNET}]
    memory = {"enabled": True, "maxSensitivity": "internal"}
    for name, envelope in (("suggest", "policy-suggestion"), ("review", "review-probe")):
        spec = {"envelope": envelope, "purpose": "tests", "providerMappings": mappings, "memory": memory}
        _create(kube, namespace, "profiles", _obj("Profile", name, spec))

    # The suggestion job runs on the runner, which reports its structured answer.
    _create(kube, namespace, "agentjobs", _job("suggest-1", "policy-suggestion", "suggest"))
    job = _assigned(kube, namespace, "suggest-1")
    assert job["status"]["assignment"]["runner"] == runner.name
    result = {"outcome": "Completed", "summary": "2 suggestions", "output": {"suggestions": _suggestions()}}
    kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "agentjobs", "suggest-1", {"status": {"result": result}}
    )

    # A job routed now is told no memory: the suggestions are in a job's status, not MemoryRecords.
    _create(kube, namespace, "agentjobs", _job("review-before", "review-probe", "review", service="ledger"))
    assert _assigned(kube, namespace, "review-before")["status"]["assignment"].get("memoryIds", []) == []

    # list, as the exporter.
    listed = _cli(exporter, "suggestions", "list", "suggest-1", "-n", namespace, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["record"], r["valid"]) for r in rows] == [("ledger-append-only", True), (rows[1]["record"], True)]
    assert rows[1]["record"].startswith("suggest-1-")

    # A SuggestionExport in someone else's name is refused by the API server.
    forged = {
        "apiVersion": API,
        "kind": "SuggestionExport",
        "metadata": {"name": "forged"},
        "spec": {
            "job": "suggest-1",
            "jobUid": job["metadata"]["uid"],
            "suggestions": [{"digest": rows[0]["digest"], "record": "ledger-append-only"}],
            "exportedBy": "somebody-else",
        },
    }
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(exporter.api_client()).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "suggestionexports", forged
        )
    assert err.value.status in (403, 422) and "own username" in (err.value.body or "")

    # export, as the exporter: the files, and nothing applied.
    out = tmp_path / "memory"
    exported = _cli(exporter, "suggestions", "export", "suggest-1", "-n", namespace, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(f"{r['record']}.yaml" for r in rows)
    record = yaml.safe_load((out / "ledger-append-only.yaml").read_text(encoding="utf-8"))
    assert record["spec"]["source"]["job"] == {
        "name": "suggest-1",
        "uid": job["metadata"]["uid"],
        "digest": rows[0]["digest"],
    }
    assert _items(kube, namespace, "memoryrecords") == []

    # helmhive validate accepts them, alone and beside their Workspace (services checked).
    alone = subprocess.run(
        [sys.executable, "-m", "helmhive", "validate", str(out)], capture_output=True, text=True, check=False
    )
    assert alone.returncode == 0 and "2 Helmhive objects in 2 files are valid" in alone.stderr, alone.stderr
    (tmp_path / "workspace.yaml").write_text(yaml.safe_dump(workspace), encoding="utf-8")
    beside = subprocess.run(
        [sys.executable, "-m", "helmhive", "validate", str(out), str(tmp_path / "workspace.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert beside.returncode == 0 and "3 Helmhive objects in 3 files are valid" in beside.stderr, beside.stderr

    # The operator audits the export: by job, digest and actor (the API server's word for who).
    audit = wait_for(
        lambda: [a for a in _items(kube, namespace, "auditrecords") if a["spec"]["action"] == "SuggestionsExported"],
        timeout=60,
        describe="the SuggestionsExported audit record",
    )[0]
    spec = audit["spec"]
    assert spec["actor"]["username"] == exporter.username
    assert (spec["object"]["kind"], spec["object"]["name"], spec["object"]["uid"]) == (
        "AgentJob",
        "suggest-1",
        job["metadata"]["uid"],
    )
    assert [(s["digest"], s["matchesJob"]) for s in spec["suggestions"]] == [(r["digest"], True) for r in rows]
    (export,) = _items(kube, namespace, "suggestionexports")
    wait_for(
        lambda: (
            condition(_get(kube, namespace, "suggestionexports", export["metadata"]["name"]), "Recorded").get("status")
            == "True"
        ),
        timeout=30,
        describe="the export's Recorded condition",
    )

    # No secret and no suggestion text in what the export left behind.
    trail = json.dumps(_items(kube, namespace, "auditrecords"))
    events = kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    for canary in (CANARY, TEXT_CANARY):
        assert canary not in trail and canary not in events
        assert canary not in operator.log_text()
    assert CANARY not in exported.stdout + exported.stderr + listed.stdout + listed.stderr
    assert all(CANARY not in (out / f).read_text(encoding="utf-8") for f in files)

    # A human commits the files (here: applies them, as CI would after the merge); now they are memory.
    kubectl("apply", "-n", namespace, "-f", str(out))
    for name in (r["record"] for r in rows):
        wait_for(
            lambda n=name: condition(_get(kube, namespace, "memoryrecords", n), "Active").get("status") == "True",  # type: ignore[misc]
            timeout=60,
            describe=f"memory record {name} Active",
        )
    _create(kube, namespace, "agentjobs", _job("review-after", "review-probe", "review", service="ledger"))
    after = _assigned(kube, namespace, "review-after")["status"]["assignment"]
    assert after["memoryIds"] == ["ledger-append-only", rows[1]["record"]]  # the constraint first

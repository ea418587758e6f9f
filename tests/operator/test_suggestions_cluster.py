"""Policy suggestions reach a pull request: exported to files, validated, audited, never applied.

The real operator and its admission policies, and a runner pod started locally as ``helmhive dev
run-pod`` does, with the reference agent (:mod:`reference_pool`). A ``policy-suggestion`` job
runs there for real: its prompt carries ``REFERENCE-AGENT: suggest`` lines, the agent answers
with those suggestions over ACP, and the runner checks the answer against the envelope's
contract and writes it to ``status.result``. Then, as a person allowed to export (the chart's
``helmhive-suggestion-exporter`` role): ``helmhive suggestions list|export``, ``helmhive
validate`` on the files, and what the cluster holds afterwards.

Two canaries: the pool's token, which appears nowhere, and a word of the suggestion's text, which
is in the exported files but in no AuditRecord, Event or operator log.
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
from reference_pool import PodStarter, pool_docs, profile_doc

from harness.identity import Identity
from harness.kube import IdentityFactory, Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.devcluster.localpod import LocalPod

GROUP, VERSION = "helmhive.dev", "v1alpha1"
API = f"{GROUP}/{VERSION}"
RUNNER = "reference-0"
CANARY = f"canary-suggestions-token-{uuid.uuid4().hex}"  # the pool's credential: nowhere
TEXT_CANARY = f"text-canary-{uuid.uuid4().hex}"  # the agent's words: in the files, never in the audit trail
SUGGEST_PROMPT = "\n".join(
    [
        "Look at the ledger service.",
        "REFERENCE-AGENT: suggest constraint service:ledger internal name=ledger-append-only "
        f"Ledger entries are append-only; corrections are reversing entries. {TEXT_CANARY}",
        "REFERENCE-AGENT: suggest decision workspace public Money is integer cents.",
    ]
)


def _obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name}, "spec": spec}


def _workspace() -> dict[str, Any]:
    return _obj(
        "Workspace",
        "payments",
        {"repository": {"url": "https://git.example.com/acme/payments.git"}, "services": [{"name": "ledger"}]},
    )


def _docs() -> list[dict[str, Any]]:
    memory = {"enabled": True, "maxSensitivity": "internal"}
    return [
        *pool_docs(token=CANARY),
        _workspace(),
        profile_doc("suggest", "policy-suggestion", purpose="Suggestions test.", memory=memory),
        profile_doc("review", "review-probe", purpose="Suggestions test.", memory=memory),
    ]


def _create(kube: Kube, namespace: str, plural: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)


def _get(kube: Kube, namespace: str, plural: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    return obj


def _items(kube: Kube, namespace: str, plural: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
    return items


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _job(
    name: str, kind: str, profile: str, prompt: str = "Look at the ledger service.", **extra: Any
) -> dict[str, Any]:
    return _obj(
        "AgentJob",
        name,
        {
            "workspace": "payments",
            "jobKind": kind,
            "profile": profile,
            "request": {"title": name, "prompt": prompt},
            "timeoutSeconds": 600,
            **extra,
        },
    )


def _assigned(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    def routed() -> dict[str, Any] | None:
        job = _get(kube, namespace, "agentjobs", name)
        return job if _condition(job, "Routed").get("status") == "True" else None

    found: dict[str, Any] = wait_for(routed, timeout=60, describe=f"job {name} routed")
    return found


def _succeeded(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any]:
        job = _get(kube, namespace, "agentjobs", name)
        assert _condition(job, "Succeeded").get("status") == "True", job.get("status")
        return job

    found: dict[str, Any] = wait_for(done, timeout=180, describe=f"job {name} succeeded")
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
def runner_pod(start_reference_pod: PodStarter) -> Iterator[LocalPod]:
    with start_reference_pod(_docs(), RUNNER) as pod:
        yield pod


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
    runner_pod: LocalPod,
    exporter: Identity,
    kube: Kube,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    # The suggestion job runs on the runner; the reference agent answers its suggest lines.
    _create(kube, namespace, "agentjobs", _job("suggest-1", "policy-suggestion", "suggest", SUGGEST_PROMPT))
    job = _succeeded(kube, namespace, "suggest-1")
    assert job["status"]["assignment"]["runner"] == RUNNER
    output = job["status"]["result"]["output"]
    assert output["agent"] == "helmhive-reference-agent"  # the agent's answer, as the runner wrote it
    assert [(s["kind"], s["scope"]["type"], s["sensitivity"]) for s in output["suggestions"]] == [
        ("constraint", "service", "internal"),
        ("decision", "workspace", "public"),
    ]
    assert TEXT_CANARY in output["suggestions"][0]["text"]

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
    out = tmp_path / "exported"
    exported = _cli(exporter, "suggestions", "export", "suggest-1", "-n", namespace, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(f"{r['record']}.yaml" for r in rows)
    text = (out / "ledger-append-only.yaml").read_text(encoding="utf-8")
    assert TEXT_CANARY in text  # the agent's words reach the file a human reviews
    record = yaml.safe_load(text)
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
    (tmp_path / "workspace.yaml").write_text(yaml.safe_dump(_workspace()), encoding="utf-8")
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
            _condition(_get(kube, namespace, "suggestionexports", export["metadata"]["name"]), "Recorded").get("status")
            == "True"
        ),
        timeout=30,
        describe="the export's Recorded condition",
    )

    # No suggestion text in the audit trail, Events or the operator's log; the pool's token nowhere.
    trail = json.dumps(_items(kube, namespace, "auditrecords"))
    events = kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    for canary in (CANARY, TEXT_CANARY):
        assert canary not in trail and canary not in events
        assert canary not in operator.log_text()
    statuses = json.dumps(
        [_items(kube, namespace, plural) for plural in ("agentjobs", "runners", "runnerpools", "suggestionexports")]
    )
    runner_log = (runner_pod.root / "container.log").read_text(encoding="utf-8", errors="replace")
    assert '"job": "suggest-1"' in runner_log  # the runner ran it
    assert CANARY not in statuses + runner_log
    assert CANARY not in exported.stdout + exported.stderr + listed.stdout + listed.stderr
    assert all(CANARY not in (out / f).read_text(encoding="utf-8") for f in files)

    # A human commits the files (here: applies them, as CI would after the merge); now they are memory.
    kubectl("apply", "-n", namespace, "-f", str(out))
    for name in (r["record"] for r in rows):
        wait_for(
            lambda n=name: _condition(_get(kube, namespace, "memoryrecords", n), "Active").get("status") == "True",  # type: ignore[misc]
            timeout=60,
            describe=f"memory record {name} Active",
        )
    _create(kube, namespace, "agentjobs", _job("review-after", "review-probe", "review", service="ledger"))
    after = _assigned(kube, namespace, "review-after")["status"]["assignment"]
    assert after["memoryIds"] == ["ledger-append-only", rows[1]["record"]]  # the constraint first


def test_an_output_over_16_kib_is_exported_from_the_jobs_artifacts_config_map(
    runner_pod: LocalPod, exporter: Identity, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """The runner keeps an output over 16 KiB in ``<job>-artifacts``; list and export read it from there."""
    lines = [
        f"REFERENCE-AGENT: suggest decision workspace internal name=long-{i} {i}: " + "Keep entries immutable. " * 78
        for i in range(10)
    ]
    _create(kube, namespace, "agentjobs", _job("suggest-big", "policy-suggestion", "suggest", "\n".join(lines)))
    job = _succeeded(kube, namespace, "suggest-big")
    result = job["status"]["result"]
    assert "output" not in result or result["output"] is None  # too large to be inline
    stored = [a for a in result["artifacts"] if a["key"] == "output.json"]
    assert stored and stored[0]["bytes"] > 16 * 1024 and not stored[0].get("truncated")

    listed = _cli(exporter, "suggestions", "list", "suggest-big", "-n", namespace, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    out = tmp_path / "big"
    exported = _cli(exporter, "suggestions", "export", "suggest-big", "-n", namespace, "-o", str(out))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    files = sorted(out.glob("*.yaml"))
    assert [p.stem for p in files] == sorted(f"long-{i}" for i in range(10))
    record = yaml.safe_load(files[0].read_text())
    assert record["kind"] == "MemoryRecord" and "Keep entries immutable." in record["spec"]["text"]
    valid = subprocess.run(
        [sys.executable, "-m", "helmhive", "validate", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert valid.returncode == 0, valid.stdout + valid.stderr

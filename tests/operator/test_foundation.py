"""The foundation against a real API server: CRDs, envelopes, admission policy, bad input, examples."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.api.kinds import KINDS
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.deploy.manifests import ENVELOPE_POLICY_NAME, OperatorIdentity, build_envelope_policy
from helmhive.policy.envelopes import ENVELOPES
from helmhive.policy.runners.pool import PoolRef, build_stateful_set
from helmhive.policy.validation.manifests import SourceDocument, validate_documents

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION = "helmhive.dev", "v1alpha1"


def test_every_crd_is_established_with_category_and_short_names(kubectl: Kubectl, crds: list[str]) -> None:
    listed = kubectl.json("get", "crds")["items"]
    ours = {c["metadata"]["name"]: c for c in listed if c["spec"]["group"] == GROUP}
    assert set(ours) == {k.crd_name for k in KINDS}
    for kind in KINDS:
        spec = ours[kind.crd_name]["spec"]
        assert spec["names"]["categories"] == ["helmhive"]
        assert spec["names"]["shortNames"] == list(kind.short_names)
        conditions = {c["type"]: c["status"] for c in ours[kind.crd_name]["status"]["conditions"]}
        assert conditions.get("Established") == "True", kind.kind
    # `kubectl get helmhive` resolves the category to every kind.
    names = kubectl("api-resources", "--categories", "helmhive", "-o", "name").stdout.split()
    assert sorted(names) == sorted(k.crd_name for k in KINDS)


def test_envelopes_are_published_equal_to_code_with_printer_columns(
    operator: OperatorProcess, kubectl: Kubectl
) -> None:
    table = kubectl("get", "envelopes").stdout.splitlines()
    assert table[0].split() == ["NAME", "CLASS", "FILESYSTEM", "NETWORK", "OUTPUT", "MEMORY", "PUBLISHED", "AGE"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert set(rows) == {k.value for k in ENVELOPES}
    assert rows["change-implementation"][1:6] == ["governed-change", "write", "disabled", "structured", "forbidden"]
    assert rows["change-review"][2] == "read"
    assert all(r[6] == "True" for r in rows.values())
    for kind, spec in ENVELOPES.items():
        obj = kubectl.json("get", "envelope", kind.value)
        assert obj["spec"] == spec.to_wire()


@pytest.fixture
def envelope_policy_suspended(kube: Kube) -> Any:
    """Remove the envelope policy binding for one test, and put it back afterwards."""
    admission = client.AdmissionregistrationV1Api(kube.api_client)
    admission.delete_validating_admission_policy_binding(ENVELOPE_POLICY_NAME)
    yield
    binding = build_envelope_policy(OperatorIdentity())[1]
    admission.create_validating_admission_policy_binding(binding)


def _patch_envelope(kube: Kube, name: str, spec_patch: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = kube.custom.patch_cluster_custom_object(
        GROUP, VERSION, "envelopes", name, {"spec": spec_patch}
    )
    return result


def test_an_edited_envelope_is_restored_and_the_restoration_logged(
    operator: OperatorProcess, kube: Kube, envelope_policy_suspended: None
) -> None:
    def edit_lands() -> dict[str, Any]:
        return _patch_envelope(kube, "change-review", {"filesystem": "write", "maxTools": ["read", "edit"]})

    # The binding's removal reaches the admission plugin within a moment; retry until it has.
    edited = wait_for(edit_lands, timeout=60, describe="an admin edit to go through without the policy")
    assert edited["spec"]["filesystem"] == "write"

    def restored() -> bool:
        obj = kube.custom.get_cluster_custom_object(GROUP, VERSION, "envelopes", "change-review")
        return bool(obj["spec"] == ENVELOPES[next(k for k in ENVELOPES if k.value == "change-review")].to_wire())

    wait_for(restored, timeout=60, describe="the operator to restore envelope change-review")

    def restoration_logged() -> bool:
        messages = [r.get("message", "") for r in operator.log_records()]
        return any("restored envelope change-review" in m and "filesystem" in m for m in messages)

    wait_for(restoration_logged, timeout=60, describe="the restoration in the operator's log")

    def restoration_audited() -> list[dict[str, Any]]:
        audits = kube.custom.list_namespaced_custom_object(GROUP, VERSION, "helmhive-system", "auditrecords")["items"]
        found = [a for a in audits if a["spec"]["action"] == "EnvelopeRestored"]
        return found if any(a["spec"]["object"]["name"] == "change-review" for a in found) else []

    restored_audits = wait_for(restoration_audited, timeout=60, describe="an EnvelopeRestored audit record")
    assert all(a["spec"]["object"]["kind"] == "Envelope" for a in restored_audits)

    kube.custom.delete_cluster_custom_object(GROUP, VERSION, "envelopes", "review-probe")
    wait_for(
        lambda: kube.custom.get_cluster_custom_object(GROUP, VERSION, "envelopes", "review-probe"),
        timeout=60,
        describe="the operator to recreate a deleted envelope",
    )


def test_admission_policy_denies_envelope_writes_by_anyone_but_the_operator(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl
) -> None:
    # Wait for the policy to be enforced (it may have just been re-created by another test).
    def denied() -> ApiException | None:
        try:
            _patch_envelope(kube, "connection-test", {"filesystem": "write"})
        except ApiException as err:
            return err
        return None

    err = wait_for(denied, timeout=60, describe="the envelope policy to deny an admin patch")
    assert err.status == 403
    body = json.loads(err.body)
    assert "envelopes are read-only" in body["message"]
    assert "kubernetes-admin" in body["message"] or "admin" in body["message"]
    assert "update envelope connection-test" in body["message"]

    proc = kubectl("delete", "envelope", "connection-test", check=False)
    assert proc.returncode != 0
    assert "envelopes are read-only" in proc.stderr
    assert "delete envelope connection-test" in proc.stderr
    obj = kube.custom.get_cluster_custom_object(GROUP, VERSION, "envelopes", "connection-test")
    assert obj["spec"]["filesystem"] == "none"


def _load_examples() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    return docs


def test_every_example_is_accepted_by_the_api_server(kubectl: Kubectl, namespace: str, crds: list[str]) -> None:
    out = kubectl("apply", "-n", namespace, "-f", str(REPO / "examples")).stdout
    docs = _load_examples()
    assert len(docs) >= 12
    for doc in docs:
        assert f"{doc['kind'].lower()}.helmhive.dev/{doc['metadata']['name']}" in out
    kinds = {d["kind"] for d in docs}
    assert {"Workspace", "Profile", "MemoryRecord", "RunnerPool", "AgentJob", "Change"} <= kinds


# --- Bad input: refused by the API server with a field path and a reason ----------------------


def _base(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "spec": spec}


MEMORY = _base(
    "MemoryRecord",
    "m1",
    {
        "workspace": "payments",
        "scope": {"type": "workspace"},
        "kind": "decision",
        "text": "ok",
        "source": {"type": "adr", "url": "https://example.com/adr/1"},
        "sensitivity": "internal",
    },
)
JOB = _base(
    "AgentJob",
    "j1",
    {
        "workspace": "payments",
        "jobKind": "connection-test",
        "request": {"title": "t", "prompt": "hello"},
    },
)
POOL = _base(
    "RunnerPool",
    "pool1",
    {
        "provider": "anthropic",
        "adapter": {"type": "claude-cli"},
        "image": "helmhive/runner:dev",
        "credential": {"volume": {"claimName": "login", "mountPath": "/home/runner/.claude"}},
        "credentialIsolation": "Proxy",
    },
)
PROFILE = _base(
    "Profile",
    "p1",
    {"envelope": "connection-test", "purpose": "x", "providerMappings": [{"provider": "anthropic"}]},
)


def _create(kube: Kube, namespace: str, doc: dict[str, Any]) -> dict[str, Any]:
    plural = next(k.plural for k in KINDS if k.kind == doc["kind"])
    result: dict[str, Any] = kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, doc)
    return result


def _refusal(fn: Any) -> str:
    with pytest.raises(ApiException) as info:
        fn()
    assert info.value.status == 422, info.value.body
    message: str = json.loads(info.value.body)["message"]
    return message


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    return out


KEYED_POOL = _with(POOL, "spec.credential", {"secretRef": {"name": "key"}})
"""A valid pool (an API key, so the Proxy isolation holds) for the resource and scheduling cases."""


@pytest.mark.parametrize(
    ("doc", "path", "needle"),
    [
        pytest.param(_with(MEMORY, "spec.text", "x" * 2001), "spec.text", "Too long", id="memory-text-2001"),
        pytest.param(
            _with(MEMORY, "spec.sensitivity", "top-secret"), "spec.sensitivity", "Unsupported value", id="enum"
        ),
        pytest.param(
            _with(PROFILE, "spec.envelope", "deploy-production"), "spec.envelope", "Unsupported value", id="envelope"
        ),
        pytest.param(
            _with(MEMORY, "spec.scope", {"type": "service"}),
            "spec.scope",
            "scope.service is required",
            id="service-scope-needs-service",
        ),
        pytest.param(POOL, "spec.credentialIsolation", "Proxy needs an API key", id="proxy-needs-a-key"),
        pytest.param(
            _with(_with(POOL, "spec.credentialIsolation", "InSandbox"), "spec.replicas", 2),
            "spec.replicas",
            "a login volume (credential.volume) is one subscription login, so at most 1 replica",
            id="a-login-shared-by-two-pods",
        ),
        pytest.param(
            _with(
                _with(POOL, "spec.credential", {"secretRef": {"name": "key"}}),
                "spec.provider",
                "acme",
            ),
            "spec.egress.upstream",
            "required with credentialIsolation Proxy",
            id="proxy-needs-an-upstream",
        ),
        pytest.param(
            _with(KEYED_POOL, "spec.resources", {"requests": {"memory": "3Gi"}}),
            "spec.resources.requests",
            "a request is above its limit",
            id="request-above-the-default-limit",
        ),
        pytest.param(
            _with(KEYED_POOL, "spec.resources", {"limits": {"memory": "512Mi"}, "requests": {"memory": "256Mi"}}),
            "spec.jobLimits.memoryBytes",
            "above the runner pod's memory limit",
            id="job-memory-above-the-pod-limit",
        ),
        pytest.param(
            _with(KEYED_POOL, "spec.resources", {"limits": {"memory": "2 GiB"}}),
            "spec.resources.limits.memory",
            "should match",
            id="not-a-quantity",
        ),
        pytest.param(
            _with(KEYED_POOL, "spec.resources", {"limits": {"nvidia.com/gpu": "1"}}),
            "spec.resources.limits",
            "every key must be a valid name matching ^(cpu|memory|ephemeral-storage)$",
            id="extended-resources-not-yet",
        ),
        pytest.param(
            _with(KEYED_POOL, "spec.resources", {"limits": {"memory": "1Pi"}}),
            "spec.resources.limits.memory",
            "should match",
            id="a-quantity-outside-the-subset",
        ),
        pytest.param(
            _with(KEYED_POOL, "spec.nodeSelector", {"a" * 64: "x"}),
            "spec.nodeSelector",
            "every key must be a valid name",
            id="a-node-label-key-kubernetes-refuses",
        ),
        pytest.param(
            _with(KEYED_POOL, "spec.podMetadata", {"labels": {"helmhive.dev/pool": "other"}}),
            "spec.podMetadata.labels",
            "a label key is reserved",
            id="a-pod-label-helmhive-sets",
        ),
        pytest.param(
            _with(KEYED_POOL, "spec.podMetadata", {"annotations": {"runners.helmhive.dev/x": "1"}}),
            "spec.podMetadata.annotations",
            "an annotation key is reserved",
            id="a-pod-annotation-under-helmhive-dev",
        ),
        pytest.param(
            _with(KEYED_POOL, "spec.tolerations", [{"operator": "Exists", "value": "x"}]),
            "spec.tolerations[0]",
            "operator Exists has no value",
            id="toleration-exists-with-a-value",
        ),
        pytest.param(
            _with(PROFILE, "spec.providerMappings", [{"provider": "a"}] * 9),
            "spec.providerMappings",
            "must have at most 8 items",
            id="too-many-mappings",
        ),
    ],
)
def test_invalid_objects_are_refused_with_field_paths(
    kube: Kube, namespace: str, crds: list[str], doc: dict[str, Any], path: str, needle: str
) -> None:
    message = _refusal(lambda: _create(kube, namespace, doc))
    assert path in message
    assert needle in message


def test_a_pool_within_its_resources_is_admitted_with_its_quantities(
    kube: Kube, namespace: str, crds: list[str]
) -> None:
    # Milli, binary and exponent forms; 1.5e9 bytes is above jobLimits.memoryBytes (1 GiB by default)
    # and above the 1Gi request, so both CEL rules compare quantities of different forms and hold.
    resources = {
        "requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1G"},
        "limits": {"cpu": "2", "memory": "1.5e9", "ephemeral-storage": "4Gi"},
    }
    doc = _with(
        _with(KEYED_POOL, "spec.resources", resources),
        "spec.tolerations",
        [
            {"key": "dedicated", "value": "agents", "effect": "NoExecute", "tolerationSeconds": 30},
            {"operator": "Exists"},
        ],
    )
    created = _create(kube, namespace, doc)
    assert created["spec"]["resources"] == resources
    assert [t["operator"] for t in created["spec"]["tolerations"]] == ["Equal", "Exists"]


def test_a_pool_written_before_resources_existed_is_still_admitted(kube: Kube, namespace: str, crds: list[str]) -> None:
    # jobLimits above the 2Gi pod limit was valid before a pool could set its limits; the memory
    # rule applies only to limits the pool sets (as the model reads it, so validate agrees).
    big = _with(KEYED_POOL, "spec.jobLimits", {"memoryBytes": 4 * 1024**3})
    _create(kube, namespace, big)
    _create(kube, namespace, _with(_with(big, "metadata.name", "pool2"), "spec.resources", {"limits": {"cpu": "1"}}))
    message = _refusal(
        lambda: _create(
            kube,
            namespace,
            _with(_with(big, "metadata.name", "pool3"), "spec.resources", {"limits": {"memory": "2Gi"}}),
        )
    )
    assert "spec.jobLimits.memoryBytes" in message and "above the runner pod's memory limit" in message


def test_immutable_fields_cannot_change(kube: Kube, namespace: str, crds: list[str]) -> None:
    _create(kube, namespace, JOB)
    changed = _with(JOB, "spec.request", {"title": "t", "prompt": "something else"})
    message = _refusal(
        lambda: kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentjobs", "j1", {"spec": changed["spec"]}
        )
    )
    assert "spec.request" in message
    assert "request is immutable once the AgentJob is created" in message
    # cancel stays mutable
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", "j1", {"spec": {"cancel": True}})

    runner = _base("Runner", "r1", {"poolRef": {"name": "pool-a"}})
    _create(kube, namespace, runner)
    message = _refusal(
        lambda: kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "runners", "r1", {"spec": {"poolRef": {"name": "pool-b"}}}
        )
    )
    assert "spec.poolRef" in message
    assert "poolRef is immutable" in message


def test_unknown_fields_are_refused_by_strict_apply(kubectl: Kubectl, namespace: str, crds: list[str]) -> None:
    doc = _with(PROFILE, "spec.maxTools", ["read"])
    proc = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0
    assert 'unknown field "spec.maxTools"' in proc.stderr


def test_operator_logs_are_structured_json(operator: OperatorProcess) -> None:
    # The line is logged once the envelopes are written, so it may follow the fixture's wait for them.
    wait_for(
        lambda: any("envelope catalogue published" in r.get("message", "") for r in operator.log_records()),
        timeout=60,
        describe="the catalogue's publication in the operator's log",
    )
    records = operator.log_records()
    assert all({"message", "timestamp", "severity"} <= set(r) for r in records)


def _res(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None, job: int = 0) -> dict[str, Any]:
    """A pool spec's resources (``None``: left out) and, when ``job``, its jobLimits.memoryBytes."""
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v is not None}
    return {"resources": resources} | ({"jobLimits": {"memoryBytes": job}} if job else {})


_EDGES: list[tuple[str, dict[str, Any]]] = [
    ("milli and exact", _res({"cpu": "0.001m"}, {"cpu": "0.001m"})),
    ("a milli above", _res({"cpu": "1.001m"}, {"cpu": "0.001"})),
    ("largest Gi", _res({"memory": "999999999.999Gi"}, {"memory": "999999.999Ti"})),
    ("largest Ti above Gi", _res({"memory": "999999.999Ti"}, {"memory": "999999999.999Gi"})),
    ("exponent against suffix", _res({"memory": "1e9"}, {"memory": "1G"})),
    ("exponent a byte over", _res({"memory": "1000000.001k"}, {"memory": "1e9"})),
    ("a point alone", _res({"cpu": "5."}, {"cpu": ".5e1"})),
    ("memory one byte under a job", _res({}, {"memory": "1Gi"}, job=1073741825)),
    ("memory equal to a job", _res({}, {"memory": "1Gi"}, job=1073741824)),
    ("memory not whole, under", _res({}, {"memory": "67108863.999"}, job=67108864)),
    ("memory not whole, over", _res({}, {"memory": "67108864.001"}, job=67108864)),
    ("memory in milli-bytes", _res({}, {"memory": "67108864000m"}, job=67108864)),
    ("no limits at all", _res(limits={}, job=8589934592)),
    ("requests only, above the default limit", _res({"memory": "2049Mi"})),
    ("requests only, at the default limit", _res({"memory": "2Gi"})),
    ("empty resources", _res(job=8589934592)),
    ("sign", _res(limits={"cpu": "+1"})),
    ("nano", _res(limits={"cpu": "1n"})),
    (
        "toleration Exists without a key",
        {"tolerations": [{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]},
    ),
    ("toleration seconds without NoExecute", {"tolerations": [{"key": "k", "tolerationSeconds": 5}]}),
    ("toleration Equal, empty value", {"tolerations": [{"key": "k"}]}),
    ("node label key at 63", {"nodeSelector": {"example.com/" + "a" * 63: ""}}),
    ("node label key, five prefix parts", {"nodeSelector": {".".join(["b" * 49] * 5) + "/x": "y"}}),
    ("pod labels and annotations", {"podMetadata": {"labels": {"team": "a"}, "annotations": {"a/b": "x" * 4096}}}),
    ("pod label the selector uses", {"podMetadata": {"labels": {"app.kubernetes.io/name": "x"}}}),
    ("pod label StatefulSets set", {"podMetadata": {"labels": {"apps.kubernetes.io/pod-index": "0"}}}),
    ("pod label under a helmhive.dev subdomain", {"podMetadata": {"labels": {"a.helmhive.dev/b": "c"}}}),
    ("pod label a prefix like helmhive.dev", {"podMetadata": {"labels": {"nothelmhive.dev/b": "c"}}}),
    ("pod annotation helmhive.dev", {"podMetadata": {"annotations": {"helmhive.dev/config-hash": "x"}}}),
    ("pod annotation with a selector key", {"podMetadata": {"annotations": {"app.kubernetes.io/name": "x"}}}),
    ("pod annotation key over 63", {"podMetadata": {"annotations": {"a" * 64: "x"}}}),
    ("pod annotation value over 4096", {"podMetadata": {"annotations": {"a": "x" * 4097}}}),
    ("pod annotation seccomp", {"podMetadata": {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "x"}}}),
    (
        "pod annotation deletion cost",
        {"podMetadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "1"}}},
    ),
]

_ADMITTED_POOLS: list[tuple[str, dict[str, Any]]] = [
    ("defaults", {}),
    (
        "every placement field",
        {"nodeSelector": {"a.b/c": "d"}, "tolerations": [{"operator": "Exists"}], "priorityClassName": "p"},
    ),
    (
        "pod metadata at its bounds",
        {
            "podMetadata": {
                "labels": {"b" * 63: "v" * 63, ".".join(["c" * 49] * 5) + "/x": ""},
                "annotations": {
                    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                    "kubernetes.io/config.source": "api",
                    "a": "x" * 4096,
                },
            }
        },
    ),
    ("resources at the subset's edge", _res({"cpu": "999999999.999m"}, {"memory": "999999.999Ti"})),
]


@pytest.mark.parametrize(
    ("spec", "why"), [(spec, why) for why, spec in _ADMITTED_POOLS], ids=[why for why, _ in _ADMITTED_POOLS]
)
def test_a_pool_the_api_server_admits_makes_a_stateful_set_it_admits(
    kube: Kube, namespace: str, crds: list[str], spec: dict[str, Any], why: str
) -> None:
    # The promise of helmhive.api.pod_settings: what the pool's CRD admits, the StatefulSet's validation admits.
    body = copy.deepcopy(KEYED_POOL)
    body["metadata"]["namespace"] = namespace
    body["spec"].update(spec)
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "runnerpools", body, dry_run="All", field_validation="Strict"
    )
    pool = RunnerPoolSpec.model_validate(body["spec"])
    ref = PoolRef(name=body["metadata"]["name"], namespace=namespace, uid="0b9e6a4e-0000-4000-8000-000000000002")
    stateful_set = build_stateful_set(ref, pool, credential_generation=1)
    stateful_set["metadata"].pop("ownerReferences", None)  # the pool is a dry run: no owner exists
    kube.apps.create_namespaced_stateful_set(namespace, stateful_set, dry_run="All", field_validation="Strict")


@pytest.mark.parametrize(("spec", "why"), [(spec, why) for why, spec in _EDGES], ids=[why for why, _ in _EDGES])
def test_the_api_server_and_validate_agree_on_a_pools_resources_and_placement(
    kube: Kube, namespace: str, crds: list[str], spec: dict[str, Any], why: str
) -> None:
    # Each edge of the quantity subset, the memory rule and the placement rules, judged by the API
    # server (a dry run: schema and CEL) and by helmhive validate: both accept or both refuse.
    body = copy.deepcopy(KEYED_POOL)
    body["metadata"]["namespace"] = namespace
    body["spec"].update(spec)
    try:
        kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "runnerpools", body, dry_run="All", field_validation="Strict"
        )
        server = "accepted"
    except ApiException as err:
        assert err.status == 422, err.body
        server = "refused"
    report = validate_documents(documents=[SourceDocument(file="pool.yaml", index=0, body=body)])
    offline = "refused" if report.issues else "accepted"
    assert (why, server) == (why, offline), [i.render() for i in report.issues]

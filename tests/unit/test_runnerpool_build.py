"""The objects a RunnerPool becomes, its credential hash and generation, and the runner identity policy."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.deploy.manifests import (
    RUNNER_POLICY_NAME,
    OperatorIdentity,
    build_install_manifests,
    build_operator_rbac,
    build_runner_identity_policy,
)
from helmhive.policy.runners.credentials import (
    build_credential_hash,
    build_credential_verdict,
    build_rotation_record,
    decide_credential,
)
from helmhive.policy.runners.pod import GENERATION_ANNOTATION, SOURCE_CREDENTIALS_DIR
from helmhive.policy.runners.pool import (
    EXECUTION_ROLE_RULES,
    MAX_POOL_NAME,
    RUNNER_ROLE_RULES,
    PoolRef,
    build_config_map,
    build_pool_objects,
    build_runner_config,
    build_stateful_set,
    decide_pool_name_problem,
    decide_pruned_objects,
)
from helmhive.runner.config import load_config

POOL = PoolRef(name="claude", namespace="team-a", uid="0b9e6a4e-0000-4000-8000-000000000001")
SECRET_SPEC: dict[str, Any] = {
    "provider": "anthropic",
    "adapter": {"type": "claude-cli", "claudeCli": {"path": "claude"}},
    "image": "ghcr.io/helmhive/runner:0.1.0",
    "credential": {"secretRef": {"name": "anthropic-key", "key": "api-key"}, "envName": "ANTHROPIC_API_KEY"},
    "placementLabels": {"domain": "code"},
    "capabilities": ["structured-output", "diff-review"],
    "concurrency": 2,
    "replicas": 3,
}
VOLUME_SPEC: dict[str, Any] = {
    **SECRET_SPEC,
    "credential": {"volume": {"claimName": "claude-login", "mountPath": "/home/runner/.claude"}},
    "replicas": 1,
}


def spec(wire: dict[str, Any] = SECRET_SPEC, **changes: Any) -> RunnerPoolSpec:
    return RunnerPoolSpec.model_validate({**wire, **changes})


def by_kind(objects: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def test_names_labels_and_owner_references_follow_the_contract() -> None:
    objects = by_kind(o for o in build_pool_objects(POOL, spec(), credential_generation=1) if o["kind"] != "Secret")
    assert set(objects) == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "NetworkPolicy",
        "StatefulSet",
        "PodDisruptionBudget",
    }
    names = {kind: o["metadata"]["name"] for kind, o in objects.items()}
    assert names == {
        "ServiceAccount": "helmhive-runner-claude",
        "Role": "helmhive-runner-claude",
        "RoleBinding": "helmhive-runner-claude",
        "ConfigMap": "helmhive-runner-claude",
        "NetworkPolicy": "helmhive-runner-claude",
        "StatefulSet": "claude",
        "PodDisruptionBudget": "claude",
    }
    for obj in objects.values():
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["labels"] == {
            "app.kubernetes.io/name": "helmhive-runner",
            "app.kubernetes.io/managed-by": "helmhive-operator",
            "helmhive.dev/pool": "claude",
        }
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "helmhive.dev/v1alpha1",
                "kind": "RunnerPool",
                "name": "claude",
                "uid": POOL.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_role_is_exactly_the_contract_and_binds_the_pool_service_account() -> None:
    objects = by_kind(build_pool_objects(POOL, spec(), credential_generation=1))
    assert objects["Role"]["rules"] == [
        {"apiGroups": ["helmhive.dev"], "resources": ["runners"], "verbs": ["get", "list", "watch", "create"]},
        {"apiGroups": ["helmhive.dev"], "resources": ["runners/status"], "verbs": ["get", "patch", "update"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update", "patch", "delete"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        *[dict(rule) for rule in EXECUTION_ROLE_RULES],
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [f"helmhive-sessions-claude-{i}" for i in range(spec().replicas)],
            "verbs": ["get", "patch"],
        },
    ]
    assert not any("secrets" in r["resources"] or "pods" in r["resources"] for r in RUNNER_ROLE_RULES)
    assert not any("secrets" in r["resources"] or "pods" in r["resources"] for r in EXECUTION_ROLE_RULES)
    secrets = [o for o in build_pool_objects(POOL, spec(), credential_generation=1) if o["kind"] == "Secret"]
    assert [o["metadata"]["name"] for o in secrets] == [f"helmhive-sessions-claude-{i}" for i in range(spec().replicas)]
    assert all("data" not in o and "stringData" not in o for o in secrets)
    binding = objects["RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "helmhive-runner-claude",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "helmhive-runner-claude", "namespace": "team-a"}]


def test_the_operator_holds_every_permission_it_grants_runners() -> None:
    # RBAC lets a subject grant only what it holds itself.
    rules = build_operator_rbac(OperatorIdentity())[1]["rules"]

    def held(group: str, resource: str, verb: str) -> bool:
        return any(
            group in r["apiGroups"]
            and (
                resource in r["resources"]
                or "*" in r["resources"]
                or ("*/status" in r["resources"] and "/" in resource)
            )
            and verb in r["verbs"]
            for r in rules
        )

    for rule in (*RUNNER_ROLE_RULES, *EXECUTION_ROLE_RULES):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert held(group, resource, verb), (group, resource, verb)


ALLOWED_VOLUME_TYPES = {"configMap", "emptyDir", "secret", "persistentVolumeClaim", "projected", "downwardAPI"}


@pytest.mark.parametrize("wire", [SECRET_SPEC, VOLUME_SPEC], ids=["secret", "volume"])
def test_pod_template_meets_pod_security_restricted(wire: dict[str, Any]) -> None:
    pod = build_stateful_set(POOL, spec(wire), credential_generation=4)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key)
    for volume in pod["volumes"]:
        kinds = set(volume) - {"name"}
        assert kinds <= ALLOWED_VOLUME_TYPES, volume
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not sc.get("privileged")
        assert not any(p.get("hostPort") for p in container.get("ports", []))
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        # Scratch space on emptyDirs, since the root filesystem is read-only.
        empty = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        assert {mounts["/tmp"], mounts["/var/lib/helmhive"], mounts["/home/runner"]} <= empty


def _env(obj: dict[str, Any]) -> dict[str, Any]:
    container = obj["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_runner_environment_and_credential_mounts() -> None:
    sts = build_stateful_set(POOL, spec(), credential_generation=4)
    env = _env(sts)
    assert env["HELMHIVE_RUNNER_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["HELMHIVE_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["HELMHIVE_POOL"] == "claude"
    assert env["HELMHIVE_RUNNER_CONFIG"] == "/etc/helmhive/runner.json"
    assert env["HELMHIVE_CREDENTIAL_GENERATION"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['helmhive.dev/credential-generation']"}
    }
    assert env["HELMHIVE_CREDENTIAL_FILE"] == "/var/run/helmhive/credential/api-key"
    assert "HELMHIVE_CREDENTIAL_DIR" not in env
    template = sts["spec"]["template"]
    assert template["metadata"]["annotations"][GENERATION_ANNOTATION] == "4"
    secret = next(v["secret"] for v in template["spec"]["volumes"] if v["name"] == "credential")
    assert secret == {
        "secretName": "anthropic-key",
        "defaultMode": 0o440,
        "items": [{"key": "api-key", "path": "api-key"}],
    }
    # Nothing about the credential's value is in the pod template, only where to find it.
    assert "ANTHROPIC_API_KEY" not in env
    volume_env = _env(build_stateful_set(POOL, spec(VOLUME_SPEC), credential_generation=0))
    assert volume_env["HELMHIVE_CREDENTIAL_DIR"] == "/home/runner/.claude"
    assert "HELMHIVE_CREDENTIAL_FILE" not in volume_env


def test_a_git_credentials_secret_is_mounted_read_only_for_the_runner() -> None:
    without = build_stateful_set(POOL, spec(), credential_generation=1)["spec"]["template"]["spec"]
    assert "HELMHIVE_SOURCE_CREDENTIALS_DIR" not in {e["name"] for e in without["containers"][0]["env"]}
    assert "source-credentials" not in {v["name"] for v in without["volumes"]}
    sts = build_stateful_set(POOL, spec(source={"credentialsSecret": {"name": "git-login"}}), credential_generation=1)
    pod = sts["spec"]["template"]["spec"]
    assert _env(sts)["HELMHIVE_SOURCE_CREDENTIALS_DIR"] == SOURCE_CREDENTIALS_DIR
    volume = next(v for v in pod["volumes"] if v["name"] == "source-credentials")
    assert volume["secret"] == {"secretName": "git-login", "defaultMode": 0o440, "optional": True}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "source-credentials")
    assert mount == {"name": "source-credentials", "mountPath": SOURCE_CREDENTIALS_DIR, "readOnly": True}
    # Apart from the one mount and its variable, the pod is the same, and runner.json does not change.
    assert build_runner_config(POOL, spec(source={"credentialsSecret": {"name": "git-login"}})) == build_runner_config(
        POOL, spec()
    )


def test_stable_identities_and_parallel_pods() -> None:
    sts = build_stateful_set(POOL, spec(), credential_generation=1)["spec"]
    assert sts["replicas"] == 3
    assert sts["podManagementPolicy"] == "Parallel"
    assert sts["selector"]["matchLabels"].items() <= sts["template"]["metadata"]["labels"].items()
    assert sts["template"]["spec"]["serviceAccountName"] == "helmhive-runner-claude"


def test_image_pull_secrets_reach_the_pods_only_when_given() -> None:
    plain = build_stateful_set(POOL, spec(), credential_generation=1)["spec"]["template"]["spec"]
    assert "imagePullSecrets" not in plain
    pulled = spec(imagePullSecrets=[{"name": "registry-a"}, {"name": "registry-b"}])
    pod = build_stateful_set(POOL, pulled, credential_generation=1)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
    with pytest.raises(ValidationError):
        spec(imagePullSecrets=[{"name": "Not A Name"}])


def test_template_changes_with_the_credential_generation_and_the_config() -> None:
    base = build_stateful_set(POOL, spec(), credential_generation=1)["spec"]["template"]
    rotated = build_stateful_set(POOL, spec(), credential_generation=2)["spec"]["template"]
    reconfigured = build_stateful_set(POOL, spec(concurrency=4), credential_generation=1)["spec"]["template"]
    assert base != rotated
    assert base["metadata"]["annotations"] != reconfigured["metadata"]["annotations"]
    assert build_stateful_set(POOL, spec(), credential_generation=1)["spec"]["template"] == base


def test_a_change_of_the_warm_pod_count_rolls_no_runner_but_what_runners_use_does() -> None:
    acp = {**SECRET_SPEC, "adapter": {"type": "acp", "acp": {"command": "agent"}}, "credentialIsolation": "Proxy"}

    def template(changes: dict[str, Any]) -> dict[str, Any]:
        built: dict[str, Any] = build_stateful_set(POOL, spec(acp, execution=changes), credential_generation=1)
        return built["spec"]["template"]

    one = template({"mode": "JobPod", "warmPods": 1})
    assert one == template({"mode": "JobPod", "warmPods": 5})
    assert build_runner_config(POOL, spec(acp, execution={"mode": "JobPod", "warmPods": 5}))["execution"] == {
        "mode": "JobPod",
        "warmPods": 0,
    }
    assert one != template({"mode": "JobPod", "warmPods": 1, "startTimeoutSeconds": 60})


def test_runner_json_holds_the_pool_settings_in_camel_case() -> None:
    config = json.loads(build_config_map(POOL, spec())["data"]["runner.json"])
    assert config == build_runner_config(POOL, spec())
    assert config == {
        "provider": "anthropic",
        "adapter": {"type": "claude-cli", "claudeCli": {"path": "claude", "extraArgs": [], "models": []}},
        "placementLabels": {"domain": "code"},
        "capabilities": ["structured-output", "diff-review"],
        "concurrency": 2,
        "heartbeat": {
            "leaseDurationSeconds": 20,
            "renewIntervalSeconds": 5,
            "reportRefreshSeconds": 300,
            "authMaxAgeSeconds": 3600,
        },
        "credentialEnvName": "ANTHROPIC_API_KEY",
        "jobLimits": {
            "memoryBytes": 1073741824,
            "cpuSeconds": 3600,
            "processes": 512,
            "openFiles": 4096,
            "cpuMillicores": 2000,
            "diskBytes": 4294967296,
        },
        "compaction": {"watermarkPercent": 80, "commandTimeoutSeconds": 180},
        "credentialIsolation": "Proxy",
        "egress": {
            "allowedHosts": [],
            "requestsPerMinute": 600,
            "burst": 60,
            "maxConcurrentRequests": 16,
            "networkNamespace": "Preferred",
        },
        "execution": {"mode": "InRunner", "warmPods": 0},
    }
    compacting = build_runner_config(POOL, spec(compaction={"watermarkPercent": 60}))["compaction"]
    assert compacting == {"watermarkPercent": 60, "commandTimeoutSeconds": 180}
    assert build_runner_config(POOL, spec(VOLUME_SPEC))["credentialDirEnvName"] == "CLAUDE_CONFIG_DIR"
    pinned = {"type": "claude-cli", "claudeCli": {"models": ["sonnet", "claude-sonnet-5-5"], "defaultModel": "sonnet"}}
    assert build_runner_config(POOL, spec(adapter=pinned))["adapter"]["claudeCli"] == {
        "path": "claude",
        "extraArgs": [],
        "models": ["sonnet", "claude-sonnet-5-5"],
        "defaultModel": "sonnet",
    }
    limited = build_runner_config(POOL, spec(jobLimits={"memoryBytes": 268435456, "processes": 64}))["jobLimits"]
    assert limited == {
        "memoryBytes": 268435456,
        "cpuSeconds": 3600,
        "processes": 64,
        "openFiles": 4096,
        "cpuMillicores": 2000,
        "diskBytes": 4294967296,
    }


def test_network_policy_denies_ingress_and_allows_only_dns_and_https_egress() -> None:
    policy = by_kind(build_pool_objects(POOL, spec(), credential_generation=1))["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == []
    ports = sorted((p["protocol"], p["port"]) for rule in policy["egress"] for p in rule["ports"])
    assert ports == [("TCP", 53), ("TCP", 443), ("TCP", 6443), ("UDP", 53)]
    assert policy["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "helmhive-runner",
        "helmhive.dev/pool": "claude",
    }


@pytest.mark.parametrize(("replicas", "has_pdb"), [(0, False), (1, False), (2, True), (5, True)])
def test_pod_disruption_budget_only_for_more_than_one_replica(replicas: int, has_pdb: bool) -> None:
    objects = by_kind(build_pool_objects(POOL, spec(replicas=replicas), credential_generation=1))
    assert ("PodDisruptionBudget" in objects) is has_pdb
    pruned = decide_pruned_objects(POOL, spec(replicas=replicas))
    assert (pruned == [("policy/v1", "PodDisruptionBudget", "claude")]) is not has_pdb
    if has_pdb:
        assert objects["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


def test_pool_names_too_long_for_a_stateful_set_are_refused() -> None:
    assert decide_pool_name_problem("a" * MAX_POOL_NAME) is None
    problem = decide_pool_name_problem("a" * (MAX_POOL_NAME + 1))
    assert problem is not None and "at most 52 characters" in problem


# --- Credential hash and generation --------------------------------------------------------------

CANARY = "c2stY2FuYXJ5LTEyMzQ="  # base64, as a Secret's data holds it


def test_credential_hash_covers_the_referenced_key_only_and_never_contains_it() -> None:
    digest = build_credential_hash(data={"api-key": CANARY, "note": "eA=="}, key="api-key")
    assert digest is not None and digest.startswith("sha256:") and len(digest) == 71
    assert CANARY not in digest
    assert digest == build_credential_hash(data={"api-key": CANARY, "note": "changed"}, key="api-key")
    assert digest != build_credential_hash(data={"api-key": "b3RoZXI="}, key="api-key")
    assert build_credential_hash(data={"other": CANARY}, key="api-key") is None
    whole = build_credential_hash(data={"a": "1", "b": "2"}, key=None)
    assert whole != build_credential_hash(data={"a": "1", "b": "3"}, key=None)


def test_credential_generation_bumps_only_when_the_hash_changes() -> None:
    first = decide_credential(uses_secret=True, observed_hash=None, observed_generation=0, digest="sha256:a")
    assert (first.generation, first.changed, first.available, first.previous_hash) == (1, True, True, None)
    same = decide_credential(uses_secret=True, observed_hash="sha256:a", observed_generation=1, digest="sha256:a")
    assert (same.generation, same.changed) == (1, False)
    rotated = decide_credential(uses_secret=True, observed_hash="sha256:a", observed_generation=1, digest="sha256:b")
    assert (rotated.generation, rotated.changed, rotated.previous_hash, rotated.hash) == (
        2,
        True,
        "sha256:a",
        "sha256:b",
    )
    missing = decide_credential(uses_secret=True, observed_hash="sha256:b", observed_generation=2, digest=None)
    assert (missing.generation, missing.available, missing.hash, missing.changed) == (2, False, "sha256:b", False)
    volume = decide_credential(uses_secret=False, observed_hash=None, observed_generation=0, digest=None)
    assert (volume.generation, volume.available, volume.hash) == (0, True, None)


def test_the_credential_verdict_names_the_secret_its_generation_or_what_is_missing() -> None:
    found = decide_credential(uses_secret=True, observed_hash=None, observed_generation=0, digest="sha256:a")
    verdict = build_credential_verdict(spec().credential, found)
    assert (verdict.status, verdict.reason, verdict.message) == (
        True,
        "CredentialFound",
        "Secret anthropic-key, generation 1",
    )
    missing = decide_credential(uses_secret=True, observed_hash="sha256:a", observed_generation=1, digest=None)
    verdict = build_credential_verdict(spec().credential, missing)
    assert (verdict.status, verdict.reason) == (False, "CredentialMissing")
    assert verdict.message == "Secret anthropic-key (key api-key) is missing"
    volume = decide_credential(uses_secret=False, observed_hash=None, observed_generation=0, digest=None)
    verdict = build_credential_verdict(spec(VOLUME_SPEC).credential, volume)
    assert (verdict.status, verdict.reason, verdict.message) == (
        True,
        "CredentialNotRequired",
        "a login on volume claim claude-login",
    )


def test_a_rotation_record_names_the_generations_and_hashes_never_the_secret() -> None:
    now = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)
    digest = build_credential_hash(data={"api-key": CANARY}, key="api-key")
    first = decide_credential(uses_secret=True, observed_hash=None, observed_generation=0, digest=digest)
    record = build_rotation_record(POOL, secret="anthropic-key", decision=first, now=now)
    spec_ = record["spec"]
    assert spec_["action"] == "RunnerCredentialRotated" and "before" not in spec_
    assert spec_["after"] == {"revision": "1", "hash": digest}
    assert spec_["message"] == "credential Secret anthropic-key recorded as generation 1"
    assert spec_["object"]["uid"] == POOL.uid and spec_["object"]["kind"] == "RunnerPool"
    rotated = decide_credential(uses_secret=True, observed_hash=digest, observed_generation=1, digest="sha256:b")
    spec_ = build_rotation_record(POOL, secret="anthropic-key", decision=rotated, now=now)["spec"]
    assert spec_["before"] == {"revision": "1", "hash": digest} and spec_["after"]["revision"] == "2"
    assert "generation 1 -> 2" in spec_["message"]
    assert spec_["details"] == {"secretRef": "anthropic-key", "credentialGeneration": "2"}
    assert CANARY not in json.dumps(record) and CANARY not in json.dumps(spec_)


# --- The runner identity admission policy --------------------------------------------------------


def test_runner_identity_policy_is_installed_and_checks_the_bound_pod_name() -> None:
    docs = build_install_manifests(OperatorIdentity())
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ValidatingAdmissionPolicy", RUNNER_POLICY_NAME) in names
    assert ("ValidatingAdmissionPolicyBinding", RUNNER_POLICY_NAME) in names
    policy, binding = build_runner_identity_policy()
    assert binding["spec"] == {"policyName": RUNNER_POLICY_NAME, "validationActions": ["Deny"]}
    spec_ = policy["spec"]
    assert spec_["failurePolicy"] == "Fail"
    resources = {r for rule in spec_["matchConstraints"]["resourceRules"] for r in rule["resources"]}
    assert resources == {"runners", "runners/status", "leases"}
    assert "helmhive-runner-" in spec_["matchConditions"][0]["expression"]
    text = json.dumps(spec_)
    assert "authentication.kubernetes.io/pod-name" in text
    assert "variables.podName == request.name" in text
    # The runner may not rewrite what the operator derives.
    for field in ("conditions", "reportedStatus", "effectiveControlState", "registeredAt"):
        assert f"object.?status.?{field} == oldObject.?status.?{field}" in text


# --- The other side of the contract ------------------------------------------------------------


GIT_SPEC: dict[str, Any] = {**SECRET_SPEC, "source": {"credentialsSecret": {"name": "git-login"}}}


@pytest.mark.parametrize("wire", [SECRET_SPEC, VOLUME_SPEC, GIT_SPEC], ids=["secret", "volume", "git-credentials"])
def test_the_runner_program_accepts_the_operators_runner_json_and_environment(wire: dict[str, Any]) -> None:
    pool_spec = spec(wire)
    container = build_stateful_set(POOL, pool_spec, credential_generation=3)["spec"]["template"]["spec"]["containers"][
        0
    ]
    downward = {
        "HELMHIVE_RUNNER_NAME": "claude-0",
        "HELMHIVE_NAMESPACE": "team-a",
        "HELMHIVE_CREDENTIAL_GENERATION": "3",
        "HELMHIVE_POD_IP": "10.244.0.7",
    }
    environ = {e["name"]: e.get("value") or downward[e["name"]] for e in container["env"]}
    text = build_config_map(POOL, pool_spec)["data"]["runner.json"]
    config = load_config(
        environ=environ, read_text=lambda path: text if str(path) == environ["HELMHIVE_RUNNER_CONFIG"] else ""
    )
    assert (config.env.runner_name, config.env.pool, config.env.credential_generation) == ("claude-0", "claude", 3)
    assert config.file.provider == "anthropic"
    assert config.file.concurrency == 2
    has_git = pool_spec.source.credentials_secret is not None
    assert config.env.source_credentials_dir == (Path(SOURCE_CREDENTIALS_DIR) if has_git else None)


def test_credential_isolation_defaults_to_proxy_for_a_key_and_in_sandbox_for_a_login_volume() -> None:
    assert build_runner_config(POOL, spec())["credentialIsolation"] == "Proxy"
    assert build_runner_config(POOL, spec(VOLUME_SPEC))["credentialIsolation"] == "InSandbox"
    assert build_runner_config(POOL, spec(credentialIsolation="InSandbox"))["credentialIsolation"] == "InSandbox"
    pinned = spec(
        egress={"upstream": "https://llm-gateway.internal:8443/anthropic", "allowedHosts": ["statsig.anthropic.com"]}
    )
    assert build_runner_config(POOL, pinned)["egress"] == {
        "upstream": "https://llm-gateway.internal:8443/anthropic",
        "allowedHosts": ["statsig.anthropic.com"],
        "requestsPerMinute": 600,
        "burst": 60,
        "maxConcurrentRequests": 16,
        "networkNamespace": "Preferred",
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({**VOLUME_SPEC, "credentialIsolation": "Proxy"}, "Proxy needs an API key (credential.secretRef)"),
        ({**VOLUME_SPEC, "replicas": 2}, "spec.replicas: a login volume (credential.volume) is one subscription login"),
        (
            {**SECRET_SPEC, "provider": "acme", "credentialIsolation": "Proxy"},
            "spec.egress.upstream: required with credentialIsolation Proxy",
        ),
        ({**SECRET_SPEC, "egress": {"upstream": "http://api.anthropic.com"}}, "egress.upstream"),
        ({**SECRET_SPEC, "egress": {"upstream": "https://user:pw@api.anthropic.com"}}, "egress.upstream"),
        ({**SECRET_SPEC, "egress": {"allowedHosts": ["*.example.com"]}}, "egress.allowedHosts.0"),
    ],
)
def test_bad_isolation_settings_are_refused_with_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(changes)
    assert message in str(caught.value)


def test_a_provider_without_defaults_runs_in_sandbox_unless_it_names_an_upstream() -> None:
    assert build_runner_config(POOL, spec({**SECRET_SPEC, "provider": "acme"}))["credentialIsolation"] == "InSandbox"
    upstream = {"upstream": "https://api.acme.example"}
    proxied = spec({**SECRET_SPEC, "provider": "acme", "egress": upstream, "credentialIsolation": "Proxy"})
    assert build_runner_config(POOL, proxied)["credentialIsolation"] == "Proxy"
    assert build_runner_config(POOL, spec({**SECRET_SPEC, "provider": "acme", "egress": upstream}))[
        "credentialIsolation"
    ] == ("Proxy")

"""RunnerPools on a real API server with the real operator: owned objects, runner RBAC, roll-outs, clean-up, columns."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pools import Pool, condition, make_pool
from pydantic import SecretStr
from simulated_runner import SimulatedRunner

from harness.identity import Identity
from harness.kube import IdentityFactory, Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.api.profile import SessionScope
from helmhive.api.runner import RunnerReport
from helmhive.api.session import SessionBindingSpec
from helmhive.runner.kube import Forbidden, KubeError, NotFound, RunnerKube
from helmhive.runner.program.heartbeat import LeaseKeeper, build_lease
from helmhive.runner.program.registration import ReportPublisher, build_runner, ensure_runner
from helmhive.runner.sessions.bindings import SessionStore

OWNED = [
    ("ServiceAccount", "helmhive-runner-claude"),
    ("Role", "helmhive-runner-claude"),
    ("RoleBinding", "helmhive-runner-claude"),
    ("ConfigMap", "helmhive-runner-claude"),
    ("NetworkPolicy", "helmhive-runner-claude"),
    ("StatefulSet", "claude"),
]


def read(kube: Kube, kind: str, name: str, namespace: str) -> dict[str, Any]:
    """Read an owned object as a plain dict (camelCase), whatever its API group."""
    api: Any
    match kind:
        case "ServiceAccount":
            api, fn = kube.core, "read_namespaced_service_account"
        case "ConfigMap":
            api, fn = kube.core, "read_namespaced_config_map"
        case "Secret":
            api, fn = kube.core, "read_namespaced_secret"
        case "Role":
            api, fn = kube.rbac, "read_namespaced_role"
        case "RoleBinding":
            api, fn = kube.rbac, "read_namespaced_role_binding"
        case "StatefulSet":
            api, fn = kube.apps, "read_namespaced_stateful_set"
        case "NetworkPolicy":
            api, fn = client.NetworkingV1Api(kube.api_client), "read_namespaced_network_policy"
        case "PodDisruptionBudget":
            api, fn = client.PolicyV1Api(kube.api_client), "read_namespaced_pod_disruption_budget"
        case _:
            raise AssertionError(kind)
    obj: dict[str, Any] = kube.api_client.sanitize_for_serialization(getattr(api, fn)(name, namespace))
    return obj


def gone(kube: Kube, kind: str, name: str, namespace: str) -> bool:
    with pytest.raises(ApiException) as err:
        read(kube, kind, name, namespace)
    assert err.value.status == 404
    return True


def test_a_pool_creates_its_objects_owned_by_it(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=2)
    uid = pool.get()["metadata"]["uid"]
    objects = {kind: wait_for(lambda k=kind, n=name: read(kube, k, n, namespace), timeout=30) for kind, name in OWNED}
    objects["PodDisruptionBudget"] = wait_for(lambda: read(kube, "PodDisruptionBudget", "claude", namespace))
    for kind, obj in objects.items():
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in refs] == [
            ("RunnerPool", "claude", uid, True)
        ], kind
        assert obj["metadata"]["labels"]["helmhive.dev/pool"] == "claude"

    # What the Role lets the runner do is checked against the runner's own calls, as the runner: the
    # two tests at the end (NEEDED, REFUSED).
    for index in (0, 1):
        secret = wait_for(lambda i=index: read(kube, "Secret", f"helmhive-sessions-claude-{i}", namespace), timeout=30)
        assert secret["metadata"]["ownerReferences"][0]["uid"] == uid
        assert not secret.get("data")
    policy = objects["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert not policy.get("ingress"), "default-deny ingress"
    assert objects["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1

    config = json.loads(objects["ConfigMap"]["data"]["runner.json"])
    assert (config["provider"], config["credentialEnvName"], config["heartbeat"]["leaseDurationSeconds"]) == (
        "anthropic",
        "ANTHROPIC_API_KEY",
        5,
    )
    # The namespace enforces Pod Security "restricted": the pods exist only because the template meets it.
    assert pool.wait_pods(2) == ["claude-0", "claude-1"]
    pod = kube.core.read_namespaced_pod("claude-0", namespace)
    assert pod.spec.service_account_name == "helmhive-runner-claude"
    assert pod.metadata.annotations["helmhive.dev/credential-generation"] == "1"
    assert pod.spec.containers[0].security_context.read_only_root_filesystem is True


def test_pool_status_and_printer_columns(
    operator: OperatorProcess, kube: Kube, kubectl: Kubectl, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=3)

    def reconciled() -> dict[str, Any]:
        obj = pool.get()
        assert condition(obj, "Ready").get("reason") == "Reconciled", obj.get("status")
        assert condition(obj, "CredentialAvailable").get("reason") == "CredentialFound"
        assert obj["status"]["desiredReplicas"] == 3
        return obj

    status = wait_for(reconciled, timeout=30, describe="pool Ready")["status"]
    assert (status["readyReplicas"], status["schedulableRunners"], status["credentialGeneration"]) == (0, 0, 1)
    assert status["credentialHash"].startswith("sha256:")
    table = kubectl("get", "runnerpools", "-n", namespace).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "PROVIDER",
        "ADAPTER",
        "CONTROL",
        "DESIRED",
        "READY",
        "SCHEDULABLE",
        "WARM",
        "AGE",
    ]
    assert table[1].split()[:7] == ["claude", "anthropic", "acp", "Active", "3", "0", "0"]


def test_replicas_decide_the_pod_disruption_budget(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=1)
    wait_for(lambda: read(kube, "StatefulSet", "claude", namespace), timeout=30)
    assert gone(kube, "PodDisruptionBudget", "claude", namespace)
    pool.patch_spec({"replicas": 3})
    wait_for(lambda: read(kube, "PodDisruptionBudget", "claude", namespace), timeout=30, describe="PDB at 3 replicas")
    assert pool.wait_pods(3) == ["claude-0", "claude-1", "claude-2"]
    pool.patch_spec({"replicas": 1})
    wait_for(lambda: gone(kube, "PodDisruptionBudget", "claude", namespace), timeout=30, describe="PDB removed at 1")
    assert read(kube, "StatefulSet", "claude", namespace)["spec"]["replicas"] == 1


def test_a_pool_change_rolls_out(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=1)
    pool.wait_pods(1)
    before = wait_for(
        lambda: read(kube, "StatefulSet", "claude", namespace)["status"].get("updateRevision"), timeout=30
    )
    pool.patch_spec({"image": "ghcr.io/helmhive/runner:test-2", "concurrency": 3})

    def rolled() -> dict[str, Any]:
        sts = read(kube, "StatefulSet", "claude", namespace)
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/helmhive/runner:test-2"
        assert sts["status"].get("updateRevision") not in (None, before)
        return sts

    sts = wait_for(rolled, timeout=30, describe="the StatefulSet template to change")
    config = json.loads(read(kube, "ConfigMap", "helmhive-runner-claude", namespace)["data"]["runner.json"])
    assert config["concurrency"] == 3

    # The StatefulSet controller replaces the pod with one of the new revision.
    def replaced() -> bool:
        pod = kube.core.read_namespaced_pod("claude-0", namespace)
        assert pod.metadata.labels["controller-revision-hash"] == sts["status"]["updateRevision"]
        assert pod.spec.containers[0].image == "ghcr.io/helmhive/runner:test-2"
        return True

    wait_for(replaced, timeout=60, describe="pod claude-0 at the new revision")


def test_deleting_the_pool_cleans_up(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool = make_pool(kube, service_account_identity, namespace, replicas=2)
    pool.wait_pods(2)
    runner = pool.acting_as("claude-0")
    runner.register()
    runner.renew()
    # The operator adopts the Runner, so it goes with the pool too.
    wait_for(
        lambda: [r["kind"] for r in pool.runner("claude-0")["metadata"].get("ownerReferences", [])] == ["RunnerPool"],
        timeout=30,
        describe="the Runner to be owned by its pool",
    )
    kube.custom.delete_namespaced_custom_object("helmhive.dev", "v1alpha1", namespace, "runnerpools", "claude")
    for kind, name in [*OWNED, ("PodDisruptionBudget", "claude")]:
        wait_for(lambda k=kind, n=name: gone(kube, k, n, namespace), timeout=60, describe=f"{kind} {name} deleted")

    def runner_gone() -> bool:
        with pytest.raises(ApiException) as err:
            pool.runner("claude-0")
        assert err.value.status == 404
        return True

    wait_for(runner_gone, timeout=60, describe="Runner claude-0 deleted with its pool")
    wait_for(lambda: pool.pod_names() == [], timeout=60, describe="the pods deleted")


def test_an_invalid_pool_name_is_reported(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    long_name = "a" * 53
    pool: Pool = make_pool(kube, service_account_identity, namespace, name=long_name, restricted=False)

    def refused() -> dict[str, Any]:
        ready = condition(pool.get(), "Ready")
        assert (ready.get("status"), ready.get("reason")) == ("False", "InvalidSpec"), ready
        return ready

    assert "at most 52 characters" in wait_for(refused, timeout=30)["message"]
    assert gone(kube, "StatefulSet", long_name, namespace)


def test_a_pool_sets_its_pods_resources_placement_and_metadata(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    resources = {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    toleration = {"key": "dedicated", "value": "agents", "effect": "NoSchedule"}
    make_pool(
        kube,
        service_account_identity,
        namespace,
        resources=resources,
        nodeSelector={"helmhive.dev/agents": "true"},
        tolerations=[toleration],
        priorityClassName="agents",
        podMetadata={"labels": {"team": "payments"}, "annotations": {"sidecar.istio.io/inject": "false"}},
    )
    template = wait_for(lambda: read(kube, "StatefulSet", "claude", namespace), timeout=30)["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "payments"
    assert template["metadata"]["labels"]["helmhive.dev/pool"] == "claude"
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert "helmhive.dev/config-hash" in template["metadata"]["annotations"]
    pod = template["spec"]
    assert pod["containers"][0]["resources"] == resources
    assert pod["nodeSelector"] == {"helmhive.dev/agents": "true"}
    assert pod["tolerations"] == [{**toleration, "operator": "Equal"}]
    assert pod["priorityClassName"] == "agents"


def test_a_pool_without_them_keeps_the_default_resources_and_no_placement(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    make_pool(kube, service_account_identity, namespace)
    pod = wait_for(lambda: read(kube, "StatefulSet", "claude", namespace), timeout=30)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "2Gi"},
    }
    assert not {"nodeSelector", "tolerations", "priorityClassName"} & set(pod)


# The runner's RBAC, against what the runner does ---------------------------------------------------
#
# Checked as the runner holds it -- a token of ServiceAccount helmhive-runner-claude bound to pod
# claude-0 -- against the real API server, in two ways (our choice: both, as each sees what the other cannot):
# * every row of NEEDED and REFUSED by SelfSubjectAccessReview: the API server's own RBAC decision
#   for that exact identity. Cheap, and it covers what a test should not really do (delete,
#   escalate, other namespaces, cluster scope);
# * a representative set by real requests, made through the runner's own code where it has it
#   (RunnerKube, ensure_runner, ReportPublisher, LeaseKeeper, SessionStore), so the admission
#   policies take part too. A 404 for a missing object shows the request got past authorization.
# Known gap, not closed by either layer: pod claude-0 may *read* helmhive-sessions-claude-1 (the Role
# names every pod's Secret, and admission never sees a read).

H, COORD, RBAC, VAP = "helmhive.dev", "coordination.k8s.io", "rbac.authorization.k8s.io", "admissionregistration.k8s.io"
OWN, OTHER, CLUSTER = "<own>", "default", ""
"""Namespaces in the tables: the pool's, another one, and none (cluster scope, or all namespaces)."""

NEEDED: tuple[tuple[str, str, str, str, str], ...] = (
    # (verb, group, resource[/subresource], name or "" for none, where in runner/helmhive/runner/ the call is made)
    ("get", H, "runners", "claude-0", "program/registration.py ensure_runner: get_runner"),
    ("create", H, "runners", "", "program/registration.py ensure_runner: create_runner"),
    ("list", H, "runners", "", "program/control_loop.py ControlLoop: watch_runner -> watch_objects"),
    ("watch", H, "runners", "", "program/control_loop.py ControlLoop: watch_runner -> watch_objects"),
    ("patch", H, "runners/status", "claude-0", "program/registration.py ReportPublisher.publish: apply_runner_status"),
    ("get", COORD, "leases", "claude-0", "program/heartbeat.py LeaseKeeper._acquire, renew: get_lease"),
    ("create", COORD, "leases", "", "program/heartbeat.py LeaseKeeper._acquire: create_lease"),
    ("update", COORD, "leases", "claude-0", "program/heartbeat.py LeaseKeeper._put: replace_lease"),
    ("delete", COORD, "leases", "claude-0", "program/heartbeat.py LeaseKeeper.release: delete_lease"),
    ("create", "", "events", "", "program/main.py RunnerProcess._event, jobs/writes.py JobWrites._event"),
    ("list", H, "agentjobs", "", "program/cluster_jobs.py ClusterJobSource.start: watch_objects"),
    ("watch", H, "agentjobs", "", "program/cluster_jobs.py ClusterJobSource.start: watch_objects"),
    ("get", H, "agentjobs", "job-a", "jobs/writes.py JobWrites._patch: get_object"),
    ("patch", H, "agentjobs/status", "job-a", "jobs/writes.py JobWrites._patch: merge_patch_status"),
    ("get", H, "memoryrecords", "memory-a", "jobs/context.py load_memory: get_object"),
    ("get", H, "sessionbindings", "binding-a", "sessions/bindings.py SessionStore.existing, _patch_status"),
    ("create", H, "sessionbindings", "", "sessions/bindings.py SessionStore.ensure_binding: create_object"),
    ("patch", H, "sessionbindings/status", "binding-a", "sessions/bindings.py SessionStore._patch_status"),
    ("get", "", "secrets", "helmhive-sessions-claude-0", "sessions/bindings.py SessionStore.load: get_secret_data"),
    ("patch", "", "secrets", "helmhive-sessions-claude-0", "sessions/bindings.py SessionStore.store"),
    ("create", "", "configmaps", "", "jobs/result.py ensure_job_result: create_config_map"),
    ("get", "", "configmaps", "job-a-artifacts", "jobs/governed.py load_review_patch: get_config_map_data"),
)
"""Every API call the runner program makes: all through ``RunnerKube`` (runner/helmhive/runner/kube.py)."""

REFUSED: tuple[tuple[str, str, str, str, str], ...] = (
    # (verb, group, resource[/subresource], name, namespace): what docs/runners.md and docs/security.md promise
    # a runner cannot do. The credential is mounted; the operator creates the sessions Secrets.
    ("get", "", "secrets", "claude-credential", OWN),
    ("list", "", "secrets", "", OWN),
    ("watch", "", "secrets", "", OWN),
    ("create", "", "secrets", "", OWN),
    ("update", "", "secrets", "helmhive-sessions-claude-0", OWN),
    ("delete", "", "secrets", "helmhive-sessions-claude-0", OWN),
    ("get", "", "secrets", "helmhive-sessions-codex-0", OWN),
    # No update of a Runner's spec (its control state), no deletion; the pool is the administrator's.
    ("update", H, "runners", "claude-0", OWN),
    ("patch", H, "runners", "claude-0", OWN),
    ("delete", H, "runners", "claude-0", OWN),
    ("deletecollection", H, "runners", "", OWN),
    ("patch", H, "runnerpools", "claude", OWN),
    ("delete", H, "runnerpools", "claude", OWN),
    # Jobs, memory, bindings: status and reads only; never a spec, never a deletion.
    ("create", H, "agentjobs", "", OWN),
    ("update", H, "agentjobs", "job-a", OWN),
    ("patch", H, "agentjobs", "job-a", OWN),
    ("delete", H, "agentjobs", "job-a", OWN),
    ("list", H, "memoryrecords", "", OWN),
    ("create", H, "memoryrecords", "", OWN),
    ("patch", H, "memoryrecords", "memory-a", OWN),
    ("patch", H, "sessionbindings", "binding-a", OWN),
    ("delete", H, "sessionbindings", "binding-a", OWN),
    ("create", H, "auditrecords", "", OWN),
    ("patch", H, "auditrecords", "record-a", OWN),
    ("delete", H, "auditrecords", "record-a", OWN),
    ("create", H, "profiles", "", OWN),
    ("patch", H, "profiles", "profile-a", OWN),
    ("patch", H, "changes", "change-a", OWN),
    ("patch", H, "workspaces", "workspace-a", OWN),
    # No pods; nothing of its own pool's make-up (config, network, replicas, identity, RBAC).
    ("create", "", "pods", "", OWN),
    ("get", "", "pods", "claude-1", OWN),
    ("list", "", "pods", "", OWN),
    ("delete", "", "pods", "claude-1", OWN),
    ("create", "", "pods/exec", "claude-1", OWN),
    ("update", "", "configmaps", "helmhive-runner-claude", OWN),
    ("patch", "", "configmaps", "helmhive-runner-claude", OWN),
    ("delete", "", "configmaps", "helmhive-runner-claude", OWN),
    ("patch", "networking.k8s.io", "networkpolicies", "helmhive-runner-claude", OWN),
    ("delete", "networking.k8s.io", "networkpolicies", "helmhive-runner-claude", OWN),
    ("patch", "apps", "statefulsets", "claude", OWN),
    ("patch", "apps", "statefulsets/scale", "claude", OWN),
    ("create", "", "serviceaccounts/token", "helmhive-runner-claude", OWN),
    ("create", RBAC, "roles", "", OWN),
    ("create", RBAC, "rolebindings", "", OWN),
    ("patch", RBAC, "roles", "helmhive-runner-claude", OWN),
    ("escalate", RBAC, "roles", "helmhive-runner-claude", OWN),
    ("bind", RBAC, "roles", "", OWN),
    # Nothing in another namespace, even what it may do in its own.
    ("get", H, "runners", "claude-0", OTHER),
    ("create", H, "runners", "", OTHER),
    ("patch", H, "runners/status", "claude-0", OTHER),
    ("create", COORD, "leases", "", OTHER),
    ("create", "", "events", "", OTHER),
    ("list", H, "agentjobs", "", OTHER),
    ("get", "", "configmaps", "job-a-artifacts", OTHER),
    ("get", "", "secrets", "helmhive-sessions-claude-0", OTHER),
    # Nothing cluster-wide: no list across namespaces, no admission policy, no CRD, no cluster RBAC.
    ("list", H, "runners", "", CLUSTER),
    ("list", H, "agentjobs", "", CLUSTER),
    ("list", "", "secrets", "", CLUSTER),
    ("list", "", "namespaces", "", CLUSTER),
    ("patch", H, "envelopes", "envelope-a", CLUSTER),
    ("patch", VAP, "validatingadmissionpolicies", "helmhive-runner-identity", CLUSTER),
    ("delete", VAP, "validatingadmissionpolicybindings", "helmhive-runner-execution", CLUSTER),
    ("update", "apiextensions.k8s.io", "customresourcedefinitions", "runners.helmhive.dev", CLUSTER),
    ("create", RBAC, "clusterrolebindings", "", CLUSTER),
)


def _can(authz: client.AuthorizationV1Api, verb: str, group: str, resource: str, name: str, namespace: str) -> bool:
    """The API server's RBAC decision for the caller (SelfSubjectAccessReview)."""
    plural, _, subresource = resource.partition("/")
    attributes = client.V1ResourceAttributes(
        verb=verb,
        group=group,
        resource=plural,
        subresource=subresource or None,
        name=name or None,
        namespace=namespace or None,
    )
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes))
    return bool(authz.create_self_subject_access_review(review).status.allowed)


def _refused(call: Callable[[], Any]) -> str:
    """The API server's message refusing ``call`` with 403."""
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body
    return str(json.loads(err.value.body)["message"])


async def _refused_to_runner(call: Awaitable[Any]) -> str:
    """The message of the 403 the runner's own door gets for ``call``."""
    with pytest.raises(Forbidden) as err:
        await call
    assert err.value.status == 403, err.value.message
    return err.value.message


def _runner_claude_0(kube: Kube, namespace: str, identities: IdentityFactory) -> tuple[Pool, Identity]:
    """A pool of two, and the token its runner claude-0 holds, once the API server allows every NEEDED call.

    The authorizer learns of a new RoleBinding through its informers, hence the wait; a row the
    Role does not grant fails it.
    """
    pool = make_pool(kube, identities, namespace, replicas=2)
    for kind, name in OWNED[:3]:
        wait_for(lambda k=kind, n=name: read(kube, k, n, namespace), timeout=30, describe=f"{kind} {name}")
    for index in (0, 1):
        wait_for(lambda i=index: read(kube, "Secret", f"helmhive-sessions-claude-{i}", namespace), timeout=30)
    pool.wait_pods(2)
    me = identities(namespace, pool.service_account, bound_pod="claude-0", create=False)
    who = client.AuthenticationV1Api(me.api_client()).create_self_subject_review(client.V1SelfSubjectReview())
    assert who.status.user_info.username == f"system:serviceaccount:{namespace}:helmhive-runner-claude"
    assert who.status.user_info.extra["authentication.kubernetes.io/pod-name"] == ["claude-0"]
    authz = client.AuthorizationV1Api(me.api_client())

    def needed_allowed() -> bool:
        missing = [row for row in NEEDED if not _can(authz, *row[:4], namespace)]
        assert missing == [], "the runner makes these calls, and its Role refuses them"
        return True

    wait_for(needed_allowed, timeout=30, describe="every call the runner makes to be allowed")
    return pool, me


def test_the_runner_role_allows_the_runners_calls_and_refuses_the_rest(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    # Every row of both tables, by SelfSubjectAccessReview (NEEDED in _runner_claude_0).
    _, me = _runner_claude_0(kube, namespace, service_account_identity)
    authz = client.AuthorizationV1Api(me.api_client())
    granted = [row for row in REFUSED if _can(authz, *row[:4], namespace if row[4] == OWN else row[4])]
    assert granted == [], "the runner must not make these calls, and its Role allows them"


def test_the_runners_real_calls_pass_and_the_forbidden_ones_are_refused(
    operator: OperatorProcess, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    pool, me = _runner_claude_0(kube, namespace, service_account_identity)

    # Real requests, as the runner makes them.
    door = RunnerKube(me.api_client(), namespace=namespace)
    raw = SimulatedRunner(identity=me, namespace=namespace, pool="claude", name="claude-0")  # plain clients, a report
    now = dt.datetime.now(dt.UTC)

    runner, created = asyncio.run(ensure_runner(kube=door, name="claude-0", pool="claude"))  # get (404), create
    assert (created, runner["spec"]["poolRef"]["name"]) == (True, "claude")
    seen: list[dict[str, Any] | None] = []
    errors: list[KubeError] = []
    watch = door.watch_runner("claude-0", on_object=seen.append, on_error=errors.append, stop=threading.Event())
    try:
        wait_for(lambda: seen, timeout=30, describe="the runner's watch to list its Runner")
        report = RunnerReport.model_validate(raw.build_report())
        written = asyncio.run(ReportPublisher(kube=door, name="claude-0").publish(report, now=now))
        assert written["status"]["report"]["podName"] == "claude-0"
        wait_for(
            lambda: any(obj and (obj.get("status") or {}).get("report") for obj in seen),
            timeout=30,
            describe="the report to reach the runner's watch",
        )
    finally:
        assert watch.join()
    assert errors == [], "a list or watch of the runner's Runner failed"

    async def heartbeat_and_event() -> tuple[int, str, bool, bool]:
        keeper = LeaseKeeper(kube=door, name="claude-0", duration_s=5)
        await keeper.acquire(now=now)  # get (404), create
        await keeper.renew(now=now + dt.timedelta(seconds=1))  # update
        holder = (await door.get_lease("claude-0"))["spec"]["holderIdentity"]
        posted = await door.post_event(runner=runner, reason="RoleChecked", message="the runner's Role", now=now)
        return keeper.writes, holder, await keeper.release(), posted  # delete

    assert asyncio.run(heartbeat_and_event()) == (2, "claude-0", True, True)

    listed = raw.custom.list_namespaced_custom_object(
        H, "v1alpha1", namespace, "agentjobs", field_selector="status.assignment.runner=claude-0"
    )
    assert listed["items"] == []
    stream = raw.custom.list_namespaced_custom_object(
        H,
        "v1alpha1",
        namespace,
        "agentjobs",
        field_selector="status.assignment.runner=claude-0",
        watch=True,
        timeout_seconds=1,
        _preload_content=False,
    )
    assert stream.status == 200
    stream.read()
    stream.release_conn()

    async def jobs_and_sessions() -> tuple[str, str | None, str, str]:
        with pytest.raises(NotFound):  # not Forbidden: the request passed authorization
            await door.get_object("agentjobs", "job-a")
        with pytest.raises(NotFound):
            await door.merge_patch_status("agentjobs", "job-a", {"status": {"attempts": 1}})
        with pytest.raises(NotFound):
            await door.get_object("memoryrecords", "memory-a")
        store = SessionStore(kube=door, runner="claude-0")
        spec = SessionBindingSpec(
            workspace="workspace-a",
            profile="profile-a",
            provider="anthropic",
            runner="claude-0",
            credential_generation=1,
            scope=SessionScope.WORKSPACE,
        )
        binding = await store.ensure_binding("binding-a", spec)  # get (404), create
        why = await store.store(
            binding="binding-a", session_id=SecretStr("native-1"), turns=1, new_chain=True, job="job-a", now=now
        )  # patch the Secret; get the binding, patch its status
        loaded = await store.load("binding-a")  # get the Secret
        owner = {"apiVersion": f"{H}/v1alpha1", "kind": "AgentJob", "name": "job-a", "uid": str(uuid.uuid4())}
        artifacts = {"metadata": {"name": "job-a-artifacts", "ownerReferences": [owner]}, "data": {"result": "{}"}}
        await door.create_config_map(artifacts)
        config = await door.get_config_map_data("helmhive-runner-claude")
        return binding["spec"]["runner"], why, loaded.get_secret_value() if loaded else "", config["runner.json"][:1]

    assert asyncio.run(jobs_and_sessions()) == ("claude-0", None, "native-1", "{")
    stored = kube.custom.get_namespaced_custom_object(H, "v1alpha1", namespace, "sessionbindings", "binding-a")
    assert (stored["status"]["stored"], stored["status"]["secretName"]) == (True, "helmhive-sessions-claude-0")

    # Refused by RBAC: the message is the authorizer's ("cannot <verb> resource ...").
    spec_patch = {"spec": {"controlState": "Active"}}
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="planted"))
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="planted"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
    )
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="claude-0"), spec=client.V1LeaseSpec())
    record = {"apiVersion": f"{H}/v1alpha1", "kind": "AuditRecord", "metadata": {"name": "planted"}}
    token = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    networking = client.NetworkingV1Api(me.api_client())
    rbac_refusals: list[tuple[str, str, Callable[[], Any]]] = [
        ("get", "secrets", lambda: raw.core.read_namespaced_secret(pool.secret, namespace)),
        ("list", "secrets", lambda: raw.core.list_namespaced_secret(namespace)),
        ("create", "secrets", lambda: raw.core.create_namespaced_secret(namespace, secret)),
        ("patch", "runners", lambda: raw.custom.patch_namespaced_custom_object(
            H, "v1alpha1", namespace, "runners", "claude-0", spec_patch)),
        ("delete", "runners", lambda: raw.custom.delete_namespaced_custom_object(
            H, "v1alpha1", namespace, "runners", "claude-0")),
        ("patch", "agentjobs", lambda: raw.custom.patch_namespaced_custom_object(
            H, "v1alpha1", namespace, "agentjobs", "job-a", {"spec": {}})),
        ("create", "auditrecords", lambda: raw.custom.create_namespaced_custom_object(
            H, "v1alpha1", namespace, "auditrecords", record)),
        ("create", "pods", lambda: raw.core.create_namespaced_pod(namespace, pod)),
        ("patch", "configmaps", lambda: raw.core.patch_namespaced_config_map(
            "helmhive-runner-claude", namespace, {"data": {"runner.json": "{}"}})),
        ("patch", "networkpolicies", lambda: networking.patch_namespaced_network_policy(
            "helmhive-runner-claude", namespace, {"spec": {"egress": [{}]}})),
        ("create", "serviceaccounts/token", lambda: raw.core.create_namespaced_service_account_token(
            pool.service_account, namespace, token)),
        ("get", "runners", lambda: raw.custom.get_namespaced_custom_object(
            H, "v1alpha1", OTHER, "runners", "claude-0")),
        ("create", "leases", lambda: raw.coordination.create_namespaced_lease(OTHER, lease)),
    ]  # fmt: skip
    wrong = []
    for verb, resource, call in rbac_refusals:
        message = _refused(call)
        if f'cannot {verb} resource "{resource}"' not in message:
            wrong.append((verb, resource, message))
    assert wrong == []

    # Allowed by RBAC, refused per pod by admission: another pod's Runner, Lease, sessions Secret, bindings.
    other_spec = {**stored["spec"], "runner": "claude-1"}
    other_binding = {"apiVersion": f"{H}/v1alpha1", "kind": "SessionBinding", "metadata": {"name": "binding-b"}}
    other_lease = build_lease(name="claude-1", duration_s=5, acquired_at=now, now=now)
    identity, execution = "helmhive-runner-identity", "helmhive-runner-execution"
    admission_refusals: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        (identity, lambda: door.create_runner(build_runner(name="claude-1", pool="claude"))),
        (identity, lambda: door.create_lease(other_lease)),
        (execution, lambda: door.merge_patch_secret("helmhive-sessions-claude-1", {"data": {"b": "eA=="}})),
        (execution, lambda: door.create_object("sessionbindings", {**other_binding, "spec": other_spec})),
    ]

    async def refuse_all() -> list[tuple[str, str]]:
        return [(policy, await _refused_to_runner(call())) for policy, call in admission_refusals]

    wrong = [(p, m) for p, m in asyncio.run(refuse_all()) if f"ValidatingAdmissionPolicy '{p}'" not in m]
    assert wrong == []

"""The execution RBAC and admission policy of ``docs/execution.md``: a runner pod writes only its own work.

Two runner pods of one pool share a ServiceAccount (and so the Role); the policy tells them apart
by the pod name bound to each token. No runner program runs here: the test writes as each pod.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness import wait_for

from .execution_harness import ExecutionRig
from .program_harness import GROUP, VERSION, RunnerRig

Write = Callable[[], Any]


def _pod_api(execution: ExecutionRig, index: int) -> client.ApiClient:
    rig = RunnerRig(
        kube=execution.kube,
        namespace=execution.namespace,
        identities=execution.identities,
        root=execution.root / f"pod-{index}",
        index=index,
    )
    rig.ensure_rbac()
    pod = rig.ensure_pod()
    execution.sessions_secret(rig.name)
    return execution.identities(execution.namespace, rig.service_account, bound_pod=pod, create=False).api_client()


def _refused(write: Write, *, status: int = 403, says: str = "") -> str:
    with pytest.raises(ApiException) as err:
        write()
    assert err.value.status == status, err.value.body
    assert says in (err.value.body or ""), err.value.body
    return str(err.value.body)


def test_a_runner_pod_writes_only_its_own_jobs_sessions_and_secret(execution: ExecutionRig) -> None:
    own_api = _pod_api(execution, 1)  # pod pool-a-1
    execution.sessions_secret("pool-a-0")  # its neighbour's
    custom, core = client.CustomObjectsApi(own_api), client.CoreV1Api(own_api)
    ns = execution.namespace
    execution.create_job("theirs", runner="pool-a-0")
    execution.create_job("mine", runner="pool-a-1")
    running = {"status": {"conditions": [_cond("Running", "True", "Started")]}}

    def patch_theirs() -> Any:
        return custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "agentjobs", "theirs", running)

    wait_for(
        lambda: "only of jobs assigned to it" in _refused(patch_theirs),
        timeout=30,
        describe="the execution admission policy to be in force",
    )
    # Its own job: the status may be written, but not the operator's assignment.
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "agentjobs", "mine", running)
    steal = {"status": {"assignment": {"model": "reference-large"}}}
    _refused(
        lambda: custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "agentjobs", "mine", steal),
        says="may not change the assignment",
    )
    # Its own sessions Secret, not its neighbour's (RBAC lets the pool's pods reach both).
    data = {"data": {"sb-00000000000000000000": "aWQ="}}
    core.patch_namespaced_secret("helmhive-sessions-pool-a-1", ns, data)
    _refused(
        lambda: core.patch_namespaced_secret("helmhive-sessions-pool-a-0", ns, data),
        says="may write only the Secret helmhive-sessions-pool-a-1",
    )
    _refused(lambda: core.list_namespaced_secret(ns))  # RBAC: no list, no other Secrets
    _refused(lambda: core.read_namespaced_secret("some-other-secret", ns))
    # Session bindings: only with itself as the runner.
    _refused(
        lambda: custom.create_namespaced_custom_object(GROUP, VERSION, ns, "sessionbindings", _binding("pool-a-0")),
        says="may write only its own session bindings",
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, "sessionbindings", _binding("pool-a-1"))
    # ConfigMaps: only artifacts owned by an AgentJob.
    plain = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="anything"), data={"a": "b"})
    _refused(lambda: core.create_namespaced_config_map(ns, plain), says="job artifact ConfigMaps")


def test_a_runner_pod_cannot_lower_its_bindings_compaction_count(execution: ExecutionRig) -> None:
    custom = client.CustomObjectsApi(_pod_api(execution, 1))
    ns = execution.namespace
    wait_for(  # the policy is in force once it refuses a neighbour's binding
        lambda: (
            "may write only its own session bindings"
            in _refused(
                lambda: custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, "sessionbindings", _binding("pool-a-0")
                )
            )
        ),
        timeout=30,
        describe="the execution policy to be in force",
    )
    created = custom.create_namespaced_custom_object(GROUP, VERSION, ns, "sessionbindings", _binding("pool-a-1"))
    name = created["metadata"]["name"]

    def compactions(count: int) -> Any:
        body = {"status": {"compactions": count}}
        return custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "sessionbindings", name, body)

    assert compactions(2)["status"]["compactions"] == 2  # counting up is the runner's to do
    _refused(lambda: compactions(1), says="status.compactions of session binding " + name + " only grows")
    assert execution.binding(name)["status"]["compactions"] == 2


def test_an_unbound_runner_token_writes_nothing(execution: ExecutionRig) -> None:
    _pod_api(execution, 0)  # the Role and the job's runner
    execution.create_job("job", runner="pool-a-0")
    unbound = execution.identities(execution.namespace, "helmhive-runner-pool-a", create=False).api_client()
    custom = client.CustomObjectsApi(unbound)
    body = {"status": {"conditions": [_cond("Running", "True", "Started")]}}
    wait_for(
        lambda: (
            "not bound to a pod"
            in _refused(
                lambda: custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, execution.namespace, "agentjobs", "job", body
                )
            )
        ),
        timeout=30,
        describe="the policy to refuse a token bound to no pod",
    )


def _cond(ctype: str, status: str, reason: str) -> dict[str, str]:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def _binding(runner: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SessionBinding",
        "metadata": {"generateName": "sb-"},
        "spec": {
            "workspace": "payments",
            "profile": "probe",
            "provider": "reference",
            "runner": runner,
            "credentialGeneration": 1,
            "scope": "workspace",
        },
    }

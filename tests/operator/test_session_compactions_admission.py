"""Only a binding's own runner writes its compaction history: the ``helmhive-session-compactions`` policy.

Against the real API server with the installed manifests: the runner pod named in the binding's
``spec.runner`` records a compaction; another ServiceAccount that RBAC allows to patch session
bindings' status, and the cluster admin (``system:masters``), are refused when they change
``status.compactions`` or ``status.lastCompaction`` -- raising, lowering or rewriting -- with the
policy's message, while their writes of other status fields still pass.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from runner_pod import runner_pod_api

from harness.kube import IdentityFactory, Kube
from harness.operator import IDENTITY
from harness.wait import wait_for

GROUP, VERSION, BINDINGS = "helmhive.dev", "v1alpha1", "sessionbindings"
NAME = "sb-0000000000000c0mpac7"
ONLY_ITS_RUNNER = "is written only by its runner pool-a-0"


def _binding(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SessionBinding",
        "metadata": {"name": name},
        "spec": {
            "workspace": "payments",
            "profile": "quick-review",
            "provider": "anthropic",
            "runner": "pool-a-0",
            "credentialGeneration": 1,
            "scope": "workspace",
        },
    }


def _last(method: str, before: int, after: int) -> dict[str, Any]:
    return {
        "method": method,
        "at": "2026-12-02T01:00:00Z",
        "job": "job-1",
        "usedBefore": before,
        "usedAfter": after,
        "contextSize": 200000,
        "reason": "context past the watermark",
    }


def _patch(custom: client.CustomObjectsApi, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, BINDINGS, name, {"status": status}
    )
    return found


def _refused(call: Callable[[], Any]) -> tuple[int, str]:
    with pytest.raises(ApiException) as info:
        call()
    return info.value.status, str(json.loads(info.value.body).get("message", ""))


def _other_account(kube: Kube, namespace: str, identities: IdentityFactory) -> client.CustomObjectsApi:
    """A ServiceAccount that RBAC allows everything on session bindings and their status."""
    rule = client.V1PolicyRule(
        api_groups=[GROUP], resources=[BINDINGS, f"{BINDINGS}/status"], verbs=["get", "list", "patch", "update"]
    )
    kube.rbac.create_namespaced_role(
        namespace, client.V1Role(metadata=client.V1ObjectMeta(name="sb-writer"), rules=[rule])
    )
    kube.rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="sb-writer"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="sb-writer"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="sb-writer", namespace=namespace)],
        ),
    )
    return client.CustomObjectsApi(identities(namespace, "sb-writer").api_client())


def test_only_the_bindings_runner_changes_its_compactions(
    helmhive_install: Any, kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> None:
    assert helmhive_install is IDENTITY  # the installed manifests, this policy among them
    for name in (NAME, "sb-00000000000000probe"):
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, BINDINGS, _binding(name))
    counts = itertools.count(1)  # each probe a change, even if an earlier one got through

    def probe() -> bool:
        status = {"compactions": next(counts)}
        return ONLY_ITS_RUNNER in _refused(lambda: _patch(kube.custom, namespace, "sb-00000000000000probe", status))[1]

    # The policy is in force once it refuses the admin on a binding kept for probing.
    wait_for(probe, timeout=30, describe="the session-compactions policy to be in force")
    runner = runner_pod_api(kube, namespace, service_account_identity)
    first = {"compactions": 1, "lastCompaction": _last("compact-command", 9000, 800)}
    recorded = wait_for(
        lambda: _patch(runner, namespace, NAME, first),
        timeout=30,
        describe="the runner's Role to take effect",
    )
    assert recorded["status"]["compactions"] == 1
    other = _other_account(kube, namespace, service_account_identity)
    wait_for(lambda: other.get_namespaced_custom_object(GROUP, VERSION, namespace, BINDINGS, NAME), timeout=30)

    forgeries = {
        "raise": {"compactions": 2, "lastCompaction": _last("archive", 9000, 100)},
        "lower": {"compactions": 0},
        "rewrite": {"lastCompaction": _last("compact-command", 9000, 10)},
        "clear": {"lastCompaction": None},
    }
    for who, custom in (("other", other), ("admin", kube.custom)):
        for what, status in forgeries.items():
            code, message = _refused(functools.partial(_patch, custom, namespace, NAME, status))
            assert code == 403, (who, what, message)
            assert ONLY_ITS_RUNNER in message and "may not change it" in message, (who, what, message)
        # Other status fields are still theirs to write (RBAC permitting).
        assert _patch(custom, namespace, NAME, {"turns": 3 if who == "other" else 4})["status"]["turns"] in (3, 4)

    status = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, BINDINGS, NAME)["status"]
    assert status["compactions"] == 1 and status["lastCompaction"] == _last("compact-command", 9000, 800)
    # The owner goes on counting.
    after = _patch(runner, namespace, NAME, {"compactions": 2, "lastCompaction": _last("archive", 9500, 700)})
    assert after["status"]["compactions"] == 2 and after["status"]["lastCompaction"]["method"] == "archive"

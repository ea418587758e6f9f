"""A runner pod's identity for tests that write a SessionBinding's status as its runner would.

Only the runner that owns a binding may change its compaction history (the
``helmhive-session-compactions`` admission policy), so a test that plays the runner writes with
a token of the pool's ServiceAccount (``helmhive-runner-<pool>``) bound to a Pod object named
like the binding's ``spec.runner``. The Pod stays Pending: there is no kubelet.
"""

from __future__ import annotations

import contextlib

from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.kube import IdentityFactory, Kube

GROUP = "helmhive.dev"


def runner_pod_api(
    kube: Kube, namespace: str, identities: IdentityFactory, *, pod: str = "pool-a-0", pool: str = "pool-a"
) -> client.CustomObjectsApi:
    """Custom-objects API as runner pod ``pod`` of ``pool``: it may read and patch session bindings' status."""
    account = f"helmhive-runner-{pool}"
    with contextlib.suppress(ApiException):  # 409: made for an earlier pod of the pool
        kube.core.create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account))
        )
        rule = client.V1PolicyRule(
            api_groups=[GROUP], resources=["sessionbindings", "sessionbindings/status"], verbs=["get", "patch"]
        )
        kube.rbac.create_namespaced_role(
            namespace, client.V1Role(metadata=client.V1ObjectMeta(name=account), rules=[rule])
        )
        kube.rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name=account),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=account),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)],
            ),
        )
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name=pod, labels={"helmhive.dev/pool": pool}),
        spec=client.V1PodSpec(
            service_account_name=account,
            automount_service_account_token=False,
            containers=[client.V1Container(name="runner", image="helmhive/runner:test")],
        ),
    )
    created = kube.core.create_namespaced_pod(namespace, body)
    return client.CustomObjectsApi(identities(namespace, account, bound_pod=created, create=False).api_client())

"""Helmhive's pytest harness: a real Kubernetes API for tests, never a mock.

Loaded as a plugin by ``tests/conftest.py``; tests only request fixtures and import
helpers from here. The pieces:

* :mod:`harness.plugin`: the ``--kubeconfig`` / ``--kind`` options and the fixtures
  ``cluster``, ``crds``, ``api_client``, ``core_v1``, ``custom_objects``, ``kube``,
  ``kubectl``, ``namespace`` and ``service_account_identity``.
* :mod:`harness.cluster`: where the cluster comes from (local control plane by default)
  and CRD installation.
* :mod:`harness.identity`: TokenRequest tokens (optionally bound to a Pod) and
  kubeconfigs / ApiClients for a ServiceAccount.
* :mod:`harness.wait`: ``wait_for``; use it instead of ``time.sleep``.
* :mod:`harness.kubectl`: run the matching kubectl against the cluster.

A minimal cluster test::

    from kubernetes import client
    from harness import wait_for

    def test_configmap_roundtrip(core_v1: client.CoreV1Api, namespace: str) -> None:
        core_v1.create_namespaced_config_map(
            namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"), data={"a": "1"})
        )
        cm = wait_for(lambda: core_v1.read_namespaced_config_map("x", namespace), describe="configmap x")
        assert cm.data == {"a": "1"}

Conventions for everyone writing cluster tests:

* Put each test's objects in the ``namespace`` fixture's namespace; cluster-scoped
  objects (CRDs aside) need unique names and their own cleanup.
* Request ``crds`` before touching a ``helmhive.dev`` resource.
* The local control plane has no scheduler and no kubelet: Pods are accepted and stored
  (and can be token-bound), but never run.
* Running ``pytest`` starts one control plane per session (about 10 s warm); point
  ``--kubeconfig`` at a ``helmhive dev cluster up`` cluster to skip even that.
"""

from harness.cluster import ClusterHandle, install_crds
from harness.identity import Identity, ensure_service_account, mint_token, token_kubeconfig
from harness.kube import IdentityFactory, Kube
from harness.kubectl import Kubectl, KubectlError
from harness.wait import WaitTimeout, wait_for

__all__ = [
    "ClusterHandle",
    "Identity",
    "IdentityFactory",
    "Kube",
    "Kubectl",
    "KubectlError",
    "WaitTimeout",
    "ensure_service_account",
    "install_crds",
    "mint_token",
    "token_kubeconfig",
    "wait_for",
]

"""ServiceAccount identities for tests: bound tokens, kubeconfigs and API clients.

A test that must act as someone other than the admin (a runner pod, an unprivileged
requester) mints a real token with the TokenRequest API and talks to the real API
server with it; RBAC, admission and ValidatingAdmissionPolicies see that identity.

With fixtures (see :mod:`harness.plugin`)::

    def test_runner_cannot_touch_secrets(namespace, service_account_identity):
        who = service_account_identity(namespace, "runner-a")          # creates the SA
        core = kubernetes.client.CoreV1Api(who.api_client())
        ...

    who = service_account_identity(namespace, "runner-a", bound_pod=pod)   # bound to a Pod
    who.kubeconfig                                                         # for kubectl/subprocesses

Without fixtures: :func:`mint_token` and :func:`token_kubeconfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

__all__ = ["Identity", "ensure_service_account", "mint_token", "token_kubeconfig"]


def ensure_service_account(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """Create ServiceAccount ``namespace/name`` unless it exists."""
    body = client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    try:
        core.create_namespaced_service_account(namespace, body)
    except ApiException as err:
        if err.status != 409:
            raise


def mint_token(
    core: client.CoreV1Api,
    namespace: str,
    service_account: str,
    *,
    bound_pod: client.V1Pod | str | None = None,
    audiences: list[str] | None = None,
    expiration_seconds: int = 600,
) -> str:
    """Return a token for ``namespace/service_account`` from the TokenRequest API.

    ``bound_pod`` (a V1Pod or a pod name in the same namespace) binds the token to that
    Pod: the API server then records the pod's name and uid in the user's ``extra`` and
    rejects the token once the pod is gone. ``audiences`` defaults to the API server's.
    The API server's minimum lifetime is 600 seconds.
    """
    bound: client.V1BoundObjectReference | None = None
    if bound_pod is not None:
        pod = core.read_namespaced_pod(bound_pod, namespace) if isinstance(bound_pod, str) else bound_pod
        bound = client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
        )
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=audiences or None,
            expiration_seconds=expiration_seconds,
            bound_object_ref=bound,
        )
    )
    response = core.create_namespaced_service_account_token(service_account, namespace, request)
    token: str = response.status.token
    return token


def _current_cluster_entry(admin_kubeconfig: Path) -> dict[str, Any]:
    """The ``cluster`` stanza of the admin kubeconfig's current context, with absolute paths."""
    doc = yaml.safe_load(admin_kubeconfig.read_text(encoding="utf-8"))
    context_name = doc["current-context"]
    context = next(c["context"] for c in doc["contexts"] if c["name"] == context_name)
    entry = dict(next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"]))
    ca = entry.get("certificate-authority")
    if ca and not Path(ca).is_absolute():
        entry["certificate-authority"] = str((admin_kubeconfig.parent / ca).resolve())
    return entry


def token_kubeconfig(
    admin_kubeconfig: Path, token: str, path: Path, *, user: str, namespace: str | None = None
) -> Path:
    """Write a kubeconfig at ``path`` for the admin's cluster that authenticates with ``token``."""
    context: dict[str, str] = {"cluster": "cluster", "user": user}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": _current_cluster_entry(admin_kubeconfig)}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    path.chmod(0o600)
    return path


@dataclass
class Identity:
    """A ServiceAccount token and what is needed to use it."""

    namespace: str
    service_account: str
    token: str
    kubeconfig: Path
    _clients: list[client.ApiClient] = field(default_factory=list, repr=False)

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def api_client(self) -> client.ApiClient:
        """A new ApiClient that authenticates as this identity (closed at fixture teardown)."""
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self._clients.append(api)
        return api

    def close(self) -> None:
        for api in self._clients:
            api.close()
        self._clients.clear()

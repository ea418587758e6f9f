"""Types the fixtures hand out: the ``kube`` bundle and the identity factory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kubernetes import client

from harness.identity import Identity

__all__ = ["IdentityFactory", "Kube"]


@dataclass(frozen=True)
class Kube:
    """Admin API objects over one shared ApiClient (the ``kube`` fixture)."""

    api_client: client.ApiClient
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    rbac: client.RbacAuthorizationV1Api
    apps: client.AppsV1Api
    apiextensions: client.ApiextensionsV1Api
    authentication: client.AuthenticationV1Api


class IdentityFactory(Protocol):
    """The ``service_account_identity`` fixture: make a ServiceAccount identity with a real token."""

    def __call__(
        self,
        namespace: str,
        name: str,
        *,
        bound_pod: client.V1Pod | str | None = None,
        audiences: list[str] | None = None,
        expiration_seconds: int = 600,
        create: bool = True,
    ) -> Identity: ...

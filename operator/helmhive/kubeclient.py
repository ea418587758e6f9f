"""The door to the Kubernetes API that the operator, the CLI and the runner share: clients and errors.

Owns loading an ``ApiClient`` (:func:`load_api_client`) and translating whatever a call through
the ``kubernetes`` client raises into the one error tree of :mod:`helmhive.api.kubeerrors`
(:func:`translate_api_error`): an answer by its HTTP status, no answer at all (a timeout, a
refused or reset connection) as ``Unavailable``. The other doors -- ``helmhive.controller.kube``
(the operator), ``helmhive.cli.kubeapi`` (the CLI), ``helmhive.runner.kube`` (the runner) and
``helmhive.devcluster.localpod`` (the dev cluster's stand-in kubelet) -- build on it; nothing
else in ``helmhive`` imports ``kubernetes`` (an import-linter contract and
``tests/unit/test_layering.py`` enforce it).
"""

from __future__ import annotations

import os
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from helmhive.api.kubeerrors import (
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    Unavailable,
    build_kube_error,
    build_unavailable,
)

__all__ = [
    "API_CONNECTIONS",
    "NETWORK_ERRORS",
    "Conflict",
    "Forbidden",
    "Invalid",
    "KubeError",
    "NotFound",
    "Unavailable",
    "load_api_client",
    "translate_api_error",
]

API_CONNECTIONS = 32
"""Connections kept per API client: as many as the operator's API threads, so none is discarded."""

NETWORK_ERRORS: tuple[type[BaseException], ...] = (ApiException, urllib3.exceptions.HTTPError, OSError)
"""What a call through the client raises when it fails: catch these, then :func:`translate_api_error`."""


def translate_api_error(exc: BaseException) -> KubeError:
    """Map a failed call's exception onto the tree (the caller chains it with ``from``).

    An ``ApiException`` is mapped by its status; anything else (urllib3's timeouts and
    connection errors, a socket's ``OSError``) got no answer and is ``Unavailable``.
    """
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        return build_kube_error(exc.status, exc.body, exc.reason)
    return build_unavailable(exc)


def load_api_client(kubeconfig: str | None = None, *, connections: int = API_CONNECTIONS) -> Any:
    """An ApiClient from ``kubeconfig`` (or ``$KUBECONFIG``), else the pod's in-cluster identity."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = client.Configuration()
    if path:
        config.load_kube_config(config_file=path, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)

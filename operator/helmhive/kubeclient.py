"""What the operator and the runner share about talking to the Kubernetes API: errors and clients.

One error tree, raised by both programs' API wrappers (``helmhive.controller.kube`` and
``helmhive.runner.kube``), with the library's exception chained::

    KubeError             any failed call; ``status`` (0 without one) and the server's ``message``
     ├── NotFound         404
     ├── Conflict         409: already exists, or a stale resourceVersion
     ├── Forbidden        401, 403
     ├── Invalid          400, 422: the API server refused the object; ``message`` says why
     └── Unavailable      429, 5xx, or no answer at all: worth retrying later
"""

from __future__ import annotations

import json
import os
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

__all__ = [
    "API_CONNECTIONS",
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
MAX_MESSAGE = 1024


class KubeError(RuntimeError):
    """An API call failed; ``status`` is the HTTP status (0 without one), ``message`` the server's words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Forbidden(KubeError):
    pass


class Invalid(KubeError):
    pass


class Unavailable(KubeError):
    pass


_BY_STATUS: dict[int, type[KubeError]] = {
    400: Invalid,
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
}


def translate_api_error(exc: ApiException) -> KubeError:
    """Map the client library's exception onto the tree (the caller chains it with ``from``)."""
    status = int(exc.status or 0)
    try:
        message = json.loads(exc.body or "{}").get("message", "") or str(exc.reason)
    except (ValueError, AttributeError):
        message = str(exc.reason)
    cls = _BY_STATUS.get(status, Unavailable if status == 429 or status >= 500 or status == 0 else KubeError)
    return cls(status, message[:MAX_MESSAGE])


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

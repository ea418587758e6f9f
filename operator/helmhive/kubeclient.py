"""The door to the Kubernetes API that the operator, the CLI and the runner share: clients and errors.

Owns loading an ``ApiClient`` (:func:`load_api_client`) and translating whatever a call through
the ``kubernetes`` client raises into the one error tree of :mod:`helmhive.api.kubeerrors`
(:func:`translate_api_error`): an answer by its HTTP status, no answer at all (a timeout, a
refused or reset connection) as ``Unavailable``. A client it loads reads its credentials again
at most once a second (:func:`throttle_credential_refresh`), for every door built on it.

The other doors -- ``helmhive.controller.kube.door`` (the operator), ``helmhive.cli.kubeapi`` (the
CLI), ``helmhive.runner.kube`` (the runner) and ``helmhive.devcluster.localpod`` (the dev
cluster's stand-in kubelet) -- build on it; nothing else in ``helmhive`` imports ``kubernetes``
(an import-linter contract and ``tests/unit/test_layering.py`` enforce it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
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
    "CREDENTIAL_REFRESH_SECONDS",
    "NETWORK_ERRORS",
    "Conflict",
    "Forbidden",
    "Invalid",
    "KubeError",
    "NotFound",
    "Unavailable",
    "credential_refresh_due",
    "load_api_client",
    "throttle_credential_refresh",
    "translate_api_error",
]

API_CONNECTIONS = 32
"""Connections kept per API client: as many as the operator's API threads, so none is discarded."""

CREDENTIAL_REFRESH_SECONDS = 1.0
"""How often a loaded client runs its credential refresh hook at most. The kubeconfig loader's hook
reloads the whole kubeconfig on every request (≈ 45 µs of CPU); a rotated token is used at most
this much later."""

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


class _ThrottledRefresh:
    """A configuration's refresh hook that runs at most once per ``every`` seconds of ``monotonic``.

    A hook that fails is not counted as a refresh: the next request runs it again. Threads may
    race at the boundary and both run it, as every request did before. A hook that replaces
    itself when it runs (the kubeconfig loader's does) stays throttled: its replacement is
    called from then on.
    """

    def __init__(self, hook: Callable[[Any], None], *, every: float, monotonic: Callable[[], float]) -> None:
        self.hook = hook
        self.every = every
        self.monotonic = monotonic
        self.refreshed_at: float | None = None

    def due(self) -> bool:
        """True when the next call runs the hook (so a caller on an event loop runs it in a thread)."""
        last = self.refreshed_at
        return last is None or not 0 <= self.monotonic() - last < self.every

    def __call__(self, configuration: Any) -> None:
        if not self.due():
            return
        now = self.monotonic()
        self.hook(configuration)
        # The kubeconfig loader's hook installs a fresh hook of its own each time it runs: keep that
        # one as the hook to call and this throttle in its place, or every later request runs it.
        installed = configuration.refresh_api_key_hook
        if installed is not None and installed is not self:
            self.hook = installed
            configuration.refresh_api_key_hook = self
        self.refreshed_at = now


def throttle_credential_refresh(
    configuration: Any,
    *,
    every: float = CREDENTIAL_REFRESH_SECONDS,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Make ``configuration``'s credential refresh hook (if it has one) run at most once per ``every`` seconds."""
    hook = configuration.refresh_api_key_hook
    if hook is not None and not isinstance(hook, _ThrottledRefresh):
        configuration.refresh_api_key_hook = _ThrottledRefresh(hook, every=every, monotonic=monotonic)


def credential_refresh_due(configuration: Any) -> bool:
    """True when reading ``configuration``'s credentials now runs its refresh hook (which may read a
    file or start a credential plugin): an unthrottled hook always, a throttled one once its second is up."""
    hook = configuration.refresh_api_key_hook
    if hook is None:
        return False
    return hook.due() if isinstance(hook, _ThrottledRefresh) else True


def load_api_client(kubeconfig: str | None = None, *, connections: int = API_CONNECTIONS) -> Any:
    """An ApiClient from ``kubeconfig`` (or ``$KUBECONFIG``), else the pod's in-cluster identity."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = client.Configuration()
    if path:
        config.load_kube_config(config_file=path, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = connections
    throttle_credential_refresh(configuration)
    return client.ApiClient(configuration)

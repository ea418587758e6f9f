"""Starts the Kopf operator: settings, injected runtime, handler registration, run loop.

Kopf keeps its bookkeeping (handler progress and the last-handled configuration) in
annotations under the ``helmhive.dev/`` prefix, so the strict CRD schemas never prune it
(status fields outside the schema would be dropped by the API server). Logs are JSON.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from helmhive.controller import envelopes
from helmhive.controller.kube import Kube, load_api_client
from helmhive.controller.runtime import OperatorConfig, Runtime
from helmhive.policy.envelopes import ENVELOPES

__all__ = ["configure_settings", "register_handlers", "run_operator"]

KOPF_PREFIX = "helmhive.dev"


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """Apply Helmhive's Kopf settings (annotation storage, standalone, quiet events)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration"
    )
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60


def register_handlers(runtime: Runtime) -> None:
    """Register every handler group with Kopf's default registry."""

    @kopf.on.startup()
    async def apply_settings(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)

    @kopf.on.login()
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # Kopf's own readers: a service-account token in a pod, else $KUBECONFIG.
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.probe(id="envelopes")
    async def envelope_probe(**_: Any) -> int:
        return len(ENVELOPES)

    envelopes.register(runtime)


def run_operator(*, kubeconfig: str | None, liveness: str | None, config: OperatorConfig, verbose: bool) -> None:
    """Run until interrupted."""
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON, log_prefix=False, log_refkey="object")
    runtime = Runtime(kube=Kube(load_api_client(kubeconfig)), config=config)
    register_handlers(runtime)
    asyncio.run(kopf.operator(clusterwide=True, standalone=True, liveness_endpoint=liveness))

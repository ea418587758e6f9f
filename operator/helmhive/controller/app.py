"""Starts the Kopf operator: settings, injected runtime, handler registration, run loop.

Kopf keeps its bookkeeping (handler progress and the last-handled configuration) in
annotations under the ``helmhive.dev/`` prefix, so the strict CRD schemas never prune it
(status fields outside the schema would be dropped by the API server). Logs are JSON.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from helmhive.controller import (
    changes,
    envelopes,
    jobs,
    lost,
    memory,
    memoryaudit,
    metrics,
    profiles,
    routing,
    runnerpools,
    runners,
    sessionaudit,
    workspaces,
)
from helmhive.controller.audit import patch_audit_retention
from helmhive.controller.kube import API_CONNECTIONS, Kube, load_api_client
from helmhive.controller.runtime import OperatorConfig, Runtime
from helmhive.controller.webhook import WebhookConfig, configure_webhook_server
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

    retention: list[asyncio.Task[None]] = []

    @kopf.on.startup()
    async def apply_settings(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
        configure_settings(settings)
        # Every Kube call runs the synchronous client in a thread. Python's default pool (cores + 4)
        # would make a burst of jobs queue on threads rather than on the API server.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=API_CONNECTIONS, thread_name_prefix="kube")
        )
        config = runtime.config
        if config.webhooks_enabled:
            configure_webhook_server(
                settings,
                WebhookConfig(addr=config.webhook_addr, port=config.webhook_port, host=config.webhook_host),
                now=runtime.clock(),
            )
        retention.append(asyncio.create_task(_audit_retention_loop(runtime, logger)))

    @kopf.on.cleanup()
    async def stop_background(**_: Any) -> None:
        for task in retention:
            task.cancel()

    @kopf.on.login()
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # Kopf's own readers: a service-account token in a pod, else $KUBECONFIG.
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.probe(id="envelopes")
    async def envelope_probe(**_: Any) -> int:
        return len(ENVELOPES)

    envelopes.register(runtime)
    runners.register(runtime)
    runnerpools.register(runtime)
    profiles.register(runtime, operator_username=runtime.config.username)
    memory.register(runtime)
    queue = jobs.register(runtime)
    workspaces.register(runtime)
    lost.register(runtime)
    router = routing.register(runtime)
    queue.handoff, router.rebind = router.submit_bound, queue.requeue  # bind and route in one write
    changes.register(runtime)
    sessionaudit.register(runtime)
    memoryaudit.register(runtime)

    @kopf.on.startup()
    async def bind_metrics(**_: Any) -> None:
        # The scrape-time gauges read the router and the queue step on this loop.
        metrics.STATE.bind(router=router, queue=queue, loop=asyncio.get_running_loop())

    @kopf.on.cleanup()
    async def unbind_metrics(**_: Any) -> None:
        metrics.STATE.unbind()


async def _audit_retention_loop(runtime: Runtime, logger: kopf.Logger, interval: float = 600.0) -> None:
    """Delete AuditRecords past retention (age, then count per namespace) every ``interval`` seconds."""
    config = runtime.config
    while True:
        try:
            deleted = await patch_audit_retention(
                runtime.kube,
                namespace=None,
                now=runtime.clock(),
                max_age=dt.timedelta(days=config.audit_max_age_days),
                max_count=config.audit_max_records,
            )
            if deleted:
                logger.info("audit retention removed %d records", deleted)
        except Exception as err:
            logger.warning("audit retention failed: %s", err)
        await asyncio.sleep(interval)


def run_operator(*, kubeconfig: str | None, liveness: str | None, config: OperatorConfig, verbose: bool) -> None:
    """Run until interrupted."""
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON, log_prefix=False, log_refkey="object")
    runtime = Runtime(kube=Kube(load_api_client(kubeconfig)), config=config)
    register_handlers(runtime)
    metrics.serve_metrics(addr=config.metrics_addr, port=config.metrics_port)
    asyncio.run(kopf.operator(clusterwide=True, standalone=True, liveness_endpoint=liveness))

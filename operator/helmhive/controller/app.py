"""Starts the Kopf operator: settings, injected runtime, handler registration, run loop.

Kopf keeps its bookkeeping (handler progress and the last-handled configuration) in
annotations under the ``helmhive.dev/`` prefix, so the strict CRD schemas never prune it
(status fields outside the schema would be dropped by the API server). Logs are JSON.

Without leader election one Kopf operator runs every handler. With ``--leader-election``
(:mod:`helmhive.controller.leader`, ``docs/ha.md``) the process runs a Kopf operator with only
the admission webhooks and the liveness endpoint for its whole life; once it holds the Lease it
runs a second one, beside it, with every other handler. The webhook port therefore never closes
when a standby becomes the leader (stopping the first run there left the API server's calls
refused for seconds, and with ``failurePolicy: Fail`` users' writes failed). Losing the Lease
exits the process (code 1).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
import signal
from collections.abc import Awaitable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import kopf

from helmhive.controller import changes, envelopes, metrics, profiles, sessionaudit, suggestions, workspaces
from helmhive.controller.audit import patch_audit_retention
from helmhive.controller.heap import limit_arenas
from helmhive.controller.jobs import failed, lost
from helmhive.controller.jobs import queueing as jobs
from helmhive.controller.jobs import watch as job_watch
from helmhive.controller.kube.door import API_CONNECTIONS, Kube, load_api_client
from helmhive.controller.leader import LeaderConfig, LeaderElector
from helmhive.controller.memory import injected as memoryaudit
from helmhive.controller.memory import records as memory
from helmhive.controller.router import handlers as routing
from helmhive.controller.router.gauges import build_state_snapshot
from helmhive.controller.runners import derived as runners
from helmhive.controller.runners import pools as runnerpools
from helmhive.controller.runtime import OperatorConfig, Runtime
from helmhive.controller.webhook import WebhookConfig, configure_webhook_server, keep_webhooks_when_stopped
from helmhive.policy.envelopes import ENVELOPES

__all__ = ["configure_settings", "register_handlers", "run_operator", "split_webhooks"]

log = logging.getLogger("helmhive.operator")

KOPF_PREFIX = "helmhive.dev"


class EventOnlyDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf's diff base, except for the busy kinds that only event handlers watch.

    Kopf builds every event's "essence" (a deep copy of the object) to detect changes, even for
    a kind with no change handler. Runners, Leases and job Pods have none (their handlers are
    ``on.event`` and indexes), so their essence is empty: no copy per event (issue 9: CPU per routed job).
    Kopf no longer watches AgentJobs at all (the operator's own watch,
    :mod:`helmhive.controller.jobs.watch`); they stay listed so a Kopf handler added on them later
    costs no copy either. A change handler added on one of these kinds must remove it from
    :attr:`EVENT_ONLY_KINDS`.
    """

    EVENT_ONLY_KINDS = frozenset({"AgentJob", "Runner", "Lease", "Pod"})

    def build(self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None) -> kopf.BodyEssence:
        if body.get("kind") in self.EVENT_ONLY_KINDS:
            return kopf.BodyEssence()
        return super().build(body=body, extra_fields=extra_fields)


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """Apply Helmhive's Kopf settings (annotation storage, standalone, quiet events)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = EventOnlyDiffBase(prefix=KOPF_PREFIX, key="last-handled-configuration")
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    # Kopf's default backoffs grow to 21 s: after an API-server outage the watches came back up to
    # that long after the server did, and the runners' heartbeats with them. Retry every 2 s at
    # most, for about five minutes (the heartbeat hold counts from the watches' return).
    settings.networking.error_backoffs = [0.5, 1.0, 1.0, *([2.0] * 150)]


def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # Kopf's own readers: a service-account token in a pod, else $KUBECONFIG.
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def register_handlers(runtime: Runtime, *, webhook: WebhookConfig | None = None) -> None:
    """Register every handler group with Kopf's default registry.

    ``webhook`` is where this operator serves the admission webhooks; None serves none here
    (they are dropped, or moved to another operator with :func:`split_webhooks`).
    """

    retention: list[asyncio.Task[None]] = []

    @kopf.on.startup()
    async def apply_settings(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
        configure_settings(settings)
        # The generated client's calls (a pool's objects, Secrets, Leases) run in threads; the JSON
        # calls go on the loop. Python's default pool (cores + 4) would queue a burst on threads.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=API_CONNECTIONS, thread_name_prefix="kube")
        )
        if webhook is not None:
            await configure_webhook_server(settings, webhook, now=runtime.clock(), kube=runtime.kube)
        retention.append(asyncio.create_task(_audit_retention_loop(runtime, logger)))

    @kopf.on.cleanup()
    async def stop_background(**_: Any) -> None:
        for task in retention:
            task.cancel()

    kopf.on.login()(_login)

    @kopf.on.probe(id="envelopes")
    async def envelope_probe(**_: Any) -> int:
        return len(ENVELOPES)

    envelopes.register(runtime)
    runner_wakes = runners.RunnerWakes()
    # A runner's pool loop hears of its qualification jobs, and of a freed slot a probe waits for.
    runtime.job_store.store.on_probe = runner_wakes.touched
    runtime.job_store.store.on_release = runner_wakes.slot_freed
    runners.register(runtime, runner_wakes)
    runnerpools.register(runtime, runner_wakes)
    profiles.register(runtime, operator_username=runtime.config.username)
    memory.register(runtime)
    watch = job_watch.register(runtime)
    queue = jobs.register(runtime)
    workspaces.register(runtime)
    lost_jobs = lost.register(runtime)
    failed.register(runtime)
    router = routing.register(runtime)
    router.on_unblocked = runner_wakes.slot_freed  # a user job stopped waiting: a due probe may start
    lost_jobs.audits = router.audits  # a lost run's lingering routing records are written before it is ended
    job_watch.register_runner_gate(watch)  # after routing's Runner handlers
    queue.handoff, router.rebind = router.submit_bound, queue.requeue  # bind and route in one write
    changes.register(runtime)
    sessionaudit.register(runtime)
    suggestions.register(runtime)
    memoryaudit.register(runtime)

    @kopf.on.startup()
    async def bind_metrics(**_: Any) -> None:
        # The scrape-time gauges read the router and the queue step on this loop.
        def read() -> metrics.StateSnapshot:
            return build_state_snapshot(router, waiting_for_reference=len(queue.room))

        metrics.STATE.bind(read=read, loop=asyncio.get_running_loop())

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


def split_webhooks(registry: kopf.OperatorRegistry, *, keep: bool = False) -> kopf.OperatorRegistry:
    """A new registry with ``registry``'s admission handlers; ``keep=False`` removes them from ``registry``.

    Kopf offers no public way to copy handlers between registries; the handler objects (frozen
    dataclasses) are shared unchanged (``tests/unit/test_webhook_config.py`` pins this against
    the installed Kopf).
    """
    webhooks = kopf.OperatorRegistry()
    for handler in registry._webhooks.get_all_handlers():
        webhooks._webhooks.append(handler)
    if not keep:
        registry._webhooks = type(webhooks._webhooks)()
    return webhooks


def _register_standby(
    registry: kopf.OperatorRegistry, runtime: Runtime, webhook: WebhookConfig | None, elector: LeaderElector
) -> None:
    """The standby operator of a leader-elected process: login, settings, webhook server, probe."""

    @kopf.on.startup(registry=registry)
    async def webhook_settings(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)
        if webhook is not None:
            await configure_webhook_server(settings, webhook, now=runtime.clock(), kube=runtime.kube)

    kopf.on.login(registry=registry)(_login)

    @kopf.on.probe(id="leader", registry=registry)
    def leader_probe(**_: Any) -> bool:
        return elector.is_leader


def _prepare_webhooks(registry: kopf.OperatorRegistry, webhook: WebhookConfig | None) -> None:
    if webhook is None:
        split_webhooks(registry)  # nothing serves them: drop them
    elif webhook.service_mode:
        keep_webhooks_when_stopped(registry)


def _set_leader_metric(leader: bool) -> None:
    metrics.LEADERSHIP.leader = leader


async def _until_first(*aws: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
    done, _ = await asyncio.wait(aws, return_when=asyncio.FIRST_COMPLETED)
    return done


class _Kopf:
    """One ``kopf.operator()`` run as a task, with its stop flag."""

    def __init__(self, registry: kopf.OperatorRegistry, liveness: str | None) -> None:
        self.stop_flag, self.ready = asyncio.Event(), asyncio.Event()
        self.task = asyncio.ensure_future(
            kopf.operator(
                registry=registry,
                clusterwide=True,
                standalone=True,
                liveness_endpoint=liveness,
                stop_flag=self.stop_flag,
                ready_flag=self.ready,
            )
        )

    async def started(self) -> None:
        await _until_first(asyncio.ensure_future(self.ready.wait()), self.task)

    async def stop(self) -> None:
        self.stop_flag.set()
        await asyncio.gather(self.task, return_exceptions=True)


_T = TypeVar("_T")


async def _closing(runtime: Runtime, main: Awaitable[_T]) -> _T:
    """Run ``main``, then close the door's HTTP session on the same loop (every handler has stopped by then)."""
    try:
        return await main
    finally:
        await runtime.kube.close()


async def _run_elected(
    *,
    full: kopf.OperatorRegistry,
    standby: kopf.OperatorRegistry,
    elector: LeaderElector,
    liveness: str | None,
) -> int:
    """Serve the webhooks from the start; once elected, run every other handler too. Return the exit code.

    Two Kopf runs share the loop once elected: ``standby`` (webhooks, liveness, the ``leader``
    probe) runs from the start to the end, ``full`` (every other handler, no webhook server, no
    liveness endpoint) from the election to the end, and is stopped first.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stopping = asyncio.ensure_future(stop.wait())

    def own_signals() -> None:
        # Each kopf.operator() installs its own SIGINT/SIGTERM handlers; ours stop in order.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

    serving = _Kopf(standby, liveness)
    await serving.started()
    own_signals()
    acquiring = asyncio.ensure_future(elector.acquire())
    done = await _until_first(acquiring, serving.task, stopping)
    if acquiring not in done:
        crashed = serving.task in done
        await serving.stop()
        acquiring.cancel()
        await asyncio.gather(acquiring, stopping, return_exceptions=True)
        elector.close()
        if crashed and not stop.is_set():
            log.error("the standby operator stopped unexpectedly; exiting")
            return 1
        return 0
    log.info("leader election: %s leads; starting the operator", elector.identity)
    acting = _Kopf(full, None)  # the serving run keeps the webhooks and the liveness endpoint
    await _until_first(asyncio.ensure_future(acting.ready.wait()), acting.task, serving.task, stopping)
    own_signals()
    holding = asyncio.ensure_future(elector.hold())
    done = await _until_first(holding, acting.task, serving.task, stopping)
    code = 0
    if holding in done:
        # client-go exits here; a standby may take over once lease_duration has passed since the
        # last renewal, so this process must have stopped acting by then, however it stops.
        code = 1
        grace = max(elector.config.lease_duration - elector.config.renew_deadline, 1.0)
        log.error("leader election: %s lost the Lease; exiting within %.0f s", elector.identity, grace)
        loop.call_later(grace, os._exit, 1)
    elif (acting.task in done or serving.task in done) and not stop.is_set():
        code = 1
        log.error("the operator stopped unexpectedly; exiting")
    holding.cancel()
    await acting.stop()
    await elector.release()
    await serving.stop()
    stopping.cancel()
    await asyncio.gather(holding, stopping, return_exceptions=True)
    elector.close()
    return code


# Kopf logs "Handler ... succeeded." and "... is processed: ..." at INFO for every handled event of
# every object: a line per job event on the hot path, saying nothing a condition does not. Our own
# handler lines on the same logger, and all warnings and errors, stay; --verbose keeps everything.
_ROUTINE = re.compile(r"^(Handler '[^']*' succeeded\.|(Creation|Updating|Resuming|Deletion) is processed: )")


def _drop_routine_kopf_lines(record: logging.LogRecord) -> bool:
    return record.levelno > logging.INFO or not _ROUTINE.match(str(record.msg))


def run_operator(
    *,
    kubeconfig: str | None,
    liveness: str | None,
    config: OperatorConfig,
    verbose: bool,
    webhook: WebhookConfig | None = None,
    leader: LeaderConfig | None = None,
) -> None:
    """Run until interrupted (or, with leader election, until the Lease is lost: exit code 1).

    ``webhook`` defaults to URL mode from ``config``'s ``webhook_*`` settings when webhooks are on.
    """
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    limit_arenas()  # before any thread allocates: see helmhive.controller.heap
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON, log_prefix=False, log_refkey="object")
    if not verbose:
        logging.getLogger("kopf.objects").addFilter(_drop_routine_kopf_lines)
    runtime = Runtime(kube=Kube(load_api_client(kubeconfig)), config=config)
    if webhook is None and config.webhooks_enabled:
        webhook = WebhookConfig(addr=config.webhook_addr, port=config.webhook_port, host=config.webhook_host)
    leader = leader or LeaderConfig()
    metrics.serve_metrics(addr=config.metrics_addr, port=config.metrics_port)
    # Elected, the webhooks are served by the standby's run alone: the full run gets no server.
    register_handlers(runtime, webhook=None if leader.enabled else webhook)
    full = kopf.get_default_registry()
    if not leader.enabled:
        _prepare_webhooks(full, webhook)
        _set_leader_metric(True)
        asyncio.run(_closing(runtime, kopf.operator(clusterwide=True, standalone=True, liveness_endpoint=liveness)))
        return
    _set_leader_metric(False)
    # Its own small connection pool: the elector never queues behind routing's API calls.
    elector = LeaderElector(leader, load_api_client(kubeconfig, connections=2), on_change=_set_leader_metric)
    standby = split_webhooks(full)  # the full run keeps none: the standby's run serves them all along
    _prepare_webhooks(standby, webhook)
    _register_standby(standby, runtime, webhook, elector)
    code = asyncio.run(_closing(runtime, _run_elected(full=full, standby=standby, elector=elector, liveness=liveness)))
    if code:
        raise SystemExit(code)

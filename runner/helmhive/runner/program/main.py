"""The runner process: register, keep the Lease, report, obey the control state, run jobs, shut down.

:class:`RunnerProcess` is the async main loop. Its collaborators are injected -- the API
wrapper (:class:`~helmhive.runner.kube.RunnerKube`), the :class:`Clock`, the adapter factory and
an optional :class:`JobSource` -- so tests run the real loop against a real API server with the
reference agent. Its life:

1. **Startup.** Create or adopt the Runner; refuse to start (exit 3) while it says Revoked for
   this credential generation; copy the credential; acquire the Lease; probe the adapter;
   write the report (reason ``Registration``) and post a ``Registered`` Event.
2. **Steady state**, four concurrent loops:
   - the Lease and the report (:class:`~helmhive.runner.program.reporting.Reporting`, the base class);
   - a watch on its own Runner feeds the control state (:class:`~helmhive.runner.program.control_loop.ControlLoop`,
     a base, deciding with :mod:`helmhive.runner.program.control`);
   - with a job source, jobs are taken while Active and a slot is free.
3. **Stop.** SIGTERM: take no more work, let jobs finish within the shutdown grace, cancel the
   rest, delete the Lease, exit 0. Revoked: cancel jobs, wipe the credential, remember the
   generation, delete the Lease, exit 0. The Runner deleted: as SIGTERM, exit 5 (the pod
   restarts and registers anew). Each way, the watch threads are stopped and joined before
   ``run()`` returns: none may outlive it (docs/runners.md, "Stopping").

Exit codes: 0 done, 2 bad configuration, 3 refused (revoked generation), 4 the API server
refused registration, 5 the Runner was deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helmhive.api.common import ControlState
from helmhive.api.egress import CredentialIsolation, decide_allowed_paths, provider_egress
from helmhive.api.jobpod import RUNNER_PROXY_PORT
from helmhive.api.runner import AuthReport, SandboxReport
from helmhive.runner.adapters.base import AdapterReport, AgentAdapter, TurnOutcome, TurnResult
from helmhive.runner.config import RunnerConfig
from helmhive.runner.credentials import CredentialHolder, read_revoked_generation, write_revoked_generation
from helmhive.runner.egress.proxy import EgressProxy, build_request_limits
from helmhive.runner.jobs.agents import AdapterFactory, build_adapter
from helmhive.runner.jobs.work import Clock, Job, JobRun, JobSource, SystemClock, WatchingJobSource
from helmhive.runner.kube import KubeError, RunnerKube, WatchThread
from helmhive.runner.logs import fields
from helmhive.runner.metrics import RunnerGauges, record_turn
from helmhive.runner.program.control import (
    accepts_jobs,
    decide_control_state,
    decide_startup,
    read_control_fields,
)
from helmhive.runner.program.control_loop import ControlLoop
from helmhive.runner.program.heartbeat import LeaseKeeper
from helmhive.runner.program.registration import ReportPublisher, ensure_runner
from helmhive.runner.program.reporting import Reporting
from helmhive.version import helmhive_version

__all__ = [
    "Clock",
    "ExitCode",
    "Job",
    "JobRun",
    "JobSource",
    "JobSourceFactory",
    "RunnerProcess",
    "SystemClock",
    "WatchingJobSource",
    "build_adapter",
]

log = logging.getLogger("helmhive.runner")

CANCEL_WAIT_S = 15.0
"""After cancelling jobs, how long to wait for their turns to end (the adapter kills agents sooner)."""


class ExitCode(enum.IntEnum):
    OK = 0
    CONFIG = 2
    REFUSED = 3
    REGISTRATION_FAILED = 4
    DEREGISTERED = 5


JobSourceFactory = Callable[["RunnerProcess"], JobSource]


class RunnerProcess(Reporting, ControlLoop):
    """One runner's whole life. ``run()`` returns the process exit code."""

    def __init__(
        self,
        *,
        config: RunnerConfig,
        kube: RunnerKube,
        clock: Clock,
        adapter_factory: AdapterFactory = build_adapter,
        jobs: JobSource | None = None,
        jobs_factory: JobSourceFactory | None = None,
        stop: asyncio.Event | None = None,
        on_secrets: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.config = config
        self.kube = kube
        self.clock = clock
        self.jobs = jobs
        self.stop = stop or asyncio.Event()
        self._adapter_factory = adapter_factory
        self._jobs_factory = jobs_factory
        self._on_secrets = on_secrets
        env = config.env
        self.name = env.runner_name
        self.credential = CredentialHolder(
            file=env.credential_file, directory=env.credential_dir, state_dir=env.state_dir
        )
        heartbeat = config.file.heartbeat
        self.lease = LeaseKeeper(kube=kube, name=self.name, duration_s=heartbeat.lease_duration_seconds)
        self.publisher = ReportPublisher(kube=kube, name=self.name)
        self.state = ControlState.ACTIVE
        self.probes = 0
        self._runner: dict[str, Any] = {}
        self._adapters: list[AgentAdapter] = []
        self._free: list[AgentAdapter] = []
        self._active: dict[str, Job] = {}
        self._adapter_report: AdapterReport | None = None
        self._authentication: AuthReport | None = None
        self._registered_at = clock.now()
        self._wake_report = asyncio.Event()
        self._wake_jobs = asyncio.Event()
        self._revoke = asyncio.Event()
        self._deregistered = asyncio.Event()
        self._watch_stop = threading.Event()
        self._runner_watch: WatchThread | None = None
        self.egress: EgressProxy | None = None
        self.sandbox_report: SandboxReport | None = None
        """What its jobs' sandbox enforces (set when the job source probes)."""

    # -- helpers -------------------------------------------------------------------------
    def _log(self, level: int, message: str, **extra: Any) -> None:
        log.log(level, message, extra=fields(runner=self.name, namespace=self.config.env.namespace, **extra))

    async def _event(self, reason: str, message: str, *, warning: bool = False) -> None:
        if self._runner:
            await self.kube.post_event(
                runner=self._runner,
                reason=reason,
                message=message,
                now=self.clock.now(),
                event_type="Warning" if warning else "Normal",
            )

    @property
    def active_jobs(self) -> int:
        return len(self._active)

    def metrics_view(self) -> RunnerGauges:
        """What the scrape-time gauges show (called from the metrics thread: plain reads only)."""
        report = self.publisher.last_report
        return RunnerGauges(
            provider=self.config.file.provider,
            adapter=self.config.file.adapter.type.value,
            version=helmhive_version(),
            control_state=self.state,
            auth_state=report.authentication.state.value if report is not None else None,
            active_jobs=len(self._active),
            slots=self.config.file.concurrency,
            last_heartbeat=self.lease.last_renewed_at,
        )

    # -- startup -------------------------------------------------------------------------
    async def run(self) -> int:
        env = self.config.env
        self._log(
            logging.INFO,
            "runner starting",
            pool=env.pool,
            adapter=self.config.file.adapter.type.value,
            credentialKind=self.credential.kind,
            credentialGeneration=env.credential_generation,
            helmhiveVersion=helmhive_version(),
        )
        try:
            self._runner, created = await ensure_runner(kube=self.kube, name=self.name, pool=env.pool)
        except KubeError as exc:
            self._log(
                logging.ERROR, "registration failed", status=exc.status, reason=type(exc).__name__, detail=exc.message
            )
            return ExitCode.REGISTRATION_FAILED
        view = read_control_fields(self._runner)
        self.state = decide_control_state(view=view)
        startup = decide_startup(
            state=self.state,
            reported_generation=view.reported_generation,
            generation=env.credential_generation,
            revoked_generation=read_revoked_generation(env.state_dir),
        )
        if not startup.start:
            wiped = self.credential.wipe()
            self._log(
                logging.ERROR,
                "refusing to start",
                reason=startup.reason,
                detail=startup.message,
                wiped=wiped.removed_entries,
            )
            await self._event(startup.reason, startup.message, warning=True)
            return ExitCode.REFUSED
        self.credential.prepare()
        if self._on_secrets is not None:
            self._on_secrets(self.credential.secret_values())
        try:
            await self._start_egress()
            if self.jobs is None and self._jobs_factory is not None:
                self.jobs = self._jobs_factory(self)
            return await self._serve(created=created)
        finally:
            await self._stop_watches()
            for adapter in self._adapters:
                with contextlib.suppress(Exception):
                    await adapter.close()
            if self.egress is not None:
                await self.egress.close()

    async def _start_egress(self) -> None:
        """With ``credentialIsolation: Proxy``, start the egress proxy the agents reach the provider through."""
        if self.config.isolation is not CredentialIsolation.PROXY:
            return
        egress = self.config.file.egress
        defaults = provider_egress(self.config.file.provider)
        upstream = egress.upstream or (defaults.upstream if defaults is not None else None)
        self.egress = EgressProxy(
            upstream=upstream,
            allowed_hosts=egress.allowed_hosts,
            credential=lambda: self.credential.value,
            ca_bundle=Path(egress.ca_bundle) if egress.ca_bundle else None,
            runner=self.name,
            allowed_paths=decide_allowed_paths(provider=self.config.file.provider, egress=egress),
            limits=build_request_limits(egress),
        )
        endpoint = await self.egress.start()
        self.credential.proxy_port = endpoint.port
        self._log(
            logging.INFO,
            "egress proxy listening",
            port=endpoint.port,
            upstream=urllib.parse.urlsplit(upstream).hostname if upstream else None,
            allowedHosts=len(egress.allowed_hosts),
        )
        if self.config.file.job_pods:  # its job pods' agents come through their shims' relays, on the pod network
            pods = await self.egress.start_pod_listener(port=RUNNER_PROXY_PORT)
            self._log(logging.INFO, "egress proxy listening for job pods", port=pods.port)

    def _new_adapter(self) -> AgentAdapter:
        adapter = self._adapter_factory(self.config, self.credential)
        self._adapters.append(adapter)
        return adapter

    async def _serve(self, *, created: bool) -> int:
        heartbeat = self.config.file.heartbeat
        self._registered_at = self.clock.now()
        await self._renew_lease(first=True)
        probe_adapter = self._new_adapter()
        self._free = [probe_adapter] + [self._new_adapter() for _ in range(self.config.file.concurrency - 1)]
        await self._probe(probe_adapter)
        try:
            await self._write_report_if_due()
        except KubeError as exc:
            self._log(
                logging.ERROR,
                "writing the report failed",
                status=exc.status,
                reason=type(exc).__name__,
                detail=exc.message,
            )
            await self.lease.release()
            return ExitCode.REGISTRATION_FAILED
        await self._event("Registered", f"runner {'created' if created else 'adopted'} its Runner and reported")
        self._start_watch()
        tasks = [
            asyncio.create_task(self._lease_loop(heartbeat.renew_interval_seconds), name="lease"),
            asyncio.create_task(self._report_loop(probe_adapter), name="report"),
        ]
        if self.jobs is not None:
            if isinstance(self.jobs, WatchingJobSource):
                self.jobs.start()
            tasks.append(asyncio.create_task(self._job_loop(), name="jobs"))
        self._apply_control(initial=True)
        waiters = {
            asyncio.create_task(self.stop.wait()): "stop",
            asyncio.create_task(self._revoke.wait()): "revoke",
            asyncio.create_task(self._deregistered.wait()): "deregistered",
        }
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        why = waiters[next(iter(done))]
        for waiter in waiters:
            waiter.cancel()
        return await self._shutdown(why=why, tasks=tasks)

    # -- jobs ----------------------------------------------------------------------------
    async def _job_loop(self) -> None:
        assert self.jobs is not None
        while True:
            if not (accepts_jobs(state=self.state) and self._free and not self.stop.is_set()):
                self._wake_jobs.clear()
                await self._wake_jobs.wait()
                continue
            job = await self.jobs.take()
            if not accepts_jobs(state=self.state) or not self._free or self.stop.is_set():
                why = "stopping" if self.stop.is_set() else self.state.value
                job.result = TurnResult(outcome=TurnOutcome.CANCELLED, message=f"not started: the runner is {why}")
                self.jobs.finish(job)
                continue
            adapter = self._free.pop()
            self._active[job.id] = job
            self._wake_report.set()
            task = asyncio.create_task(self._run_job(adapter, job), name=f"job-{job.id}")
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _run_job(self, adapter: AgentAdapter, job: Job) -> None:
        self._log(logging.INFO, "job started", job=job.id)
        try:
            if job.run is not None:
                job.result = await job.run(adapter, job.cancel)
            else:
                assert job.request is not None
                job.result = await adapter.run_turn(job.request, job.cancel)
                record_turn(config=self.config, result=job.result)
        finally:
            self._active.pop(job.id, None)
            self._free.append(adapter)
            self._wake_report.set()
            self._wake_jobs.set()
            outcome = job.result.outcome.value if job.result else "Abandoned"
            self._log(logging.INFO, "job finished", job=job.id, outcome=outcome)
            if self.jobs is not None:
                self.jobs.finish(job)

    async def _wait_jobs(self, seconds: float) -> bool:
        deadline = asyncio.get_running_loop().time() + seconds
        while self._active and asyncio.get_running_loop().time() < deadline:
            self._wake_jobs.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_jobs.wait(), max(0.0, deadline - asyncio.get_running_loop().time()))
        return not self._active

    # -- shutdown ------------------------------------------------------------------------
    async def _shutdown(self, *, why: str, tasks: list[asyncio.Task[None]]) -> int:
        revoked = why == "revoke"
        self._log(logging.INFO, "shutting down", why=why, activeJobs=self.active_jobs)
        self._wake_jobs.set()
        if self.jobs is not None:
            if isinstance(self.jobs, WatchingJobSource):
                self.jobs.stop()
            for task in tasks:
                if task.get_name() == "jobs":
                    task.cancel()
        if not revoked and self._active:
            grace = self.config.env.shutdown_grace_seconds
            if not await self._wait_jobs(grace):
                self._log(
                    logging.WARNING,
                    "jobs still running after the shutdown grace; cancelling",
                    activeJobs=self.active_jobs,
                )
        for job in self._active.values():
            job.cancel.set()
        await self._wait_jobs(CANCEL_WAIT_S)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if revoked:
            wiped = self.credential.wipe()
            write_revoked_generation(self.config.env.state_dir, self.config.env.credential_generation)
            self._log(
                logging.WARNING,
                "credential wiped after revocation",
                credentialKind=wiped.kind,
                removedEntries=wiped.removed_entries,
                credentialGeneration=self.config.env.credential_generation,
            )
            await self._event(
                "CredentialWiped",
                f"Revoked: the {wiped.kind} credential of generation {self.config.env.credential_generation} was wiped",
                warning=True,
            )
        try:
            released = await self.lease.release()
        except KubeError as exc:
            self._log(logging.WARNING, "releasing the Lease failed", status=exc.status, detail=exc.message)
            released = False
        self._log(
            logging.INFO,
            "runner stopped",
            why=why,
            leaseReleased=released,
            reportWrites=self.publisher.writes,
            leaseWrites=self.lease.writes,
            probes=self.probes,
        )
        return ExitCode.DEREGISTERED if why == "deregistered" else ExitCode.OK

"""The runner's heartbeat and report: keep the Lease, probe the adapter, write the report when due.

:class:`Reporting` is a part of :class:`~helmhive.runner.program.main.RunnerProcess` (its base), kept
apart because it is a life of its own beside the jobs:

- the Lease is renewed every ``renewIntervalSeconds``, annotated with the digest of the
  report's catalogue and authentication (a new digest is written right after the report);
- the adapter is probed every ``HELMHIVE_PROBE_INTERVAL_SECONDS`` and at least every quarter of
  ``authMaxAgeSeconds`` (re-verification; on a spare adapter when the probe adapter is busy),
  and the report is written only when :func:`~helmhive.runner.program.report.decide_report_write` says
  so (content changed, or ``reportRefreshSeconds`` passed).

The attributes it reads are the process's own, declared here for the type checker.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from typing import Any

from helmhive.api.runner import AuthReport, RunnerReport, SandboxReport, build_report_digest
from helmhive.runner.adapters.base import AdapterReport, AgentAdapter, AuthReason, AuthState
from helmhive.runner.config import RunnerConfig
from helmhive.runner.credentials import CredentialHolder
from helmhive.runner.jobs.agents import AdapterFactory, agent_env
from helmhive.runner.jobs.work import Clock
from helmhive.runner.kube import KubeError
from helmhive.runner.logs import fields
from helmhive.runner.metrics import record_heartbeat, record_probe, record_report_write
from helmhive.runner.program.heartbeat import LeaseKeeper
from helmhive.runner.program.registration import ReportPublisher
from helmhive.runner.program.report import (
    build_fingerprint,
    build_report,
    decide_auth_report,
    decide_learnt,
    decide_report_write,
    decide_verified_at,
    reverify_interval,
)
from helmhive.version import helmhive_version

__all__ = ["Reporting"]

log = logging.getLogger("helmhive.runner")


class Reporting:
    """The Lease and the report of one runner process (see the module docstring)."""

    name: str
    config: RunnerConfig
    clock: Clock
    credential: CredentialHolder
    lease: LeaseKeeper
    publisher: ReportPublisher
    probes: int
    _adapter_factory: AdapterFactory
    _free: list[AgentAdapter]
    _adapter_report: AdapterReport | None
    _authentication: AuthReport | None
    _registered_at: dt.datetime
    _wake_report: asyncio.Event
    sandbox_report: SandboxReport | None

    @property
    def active_jobs(self) -> int:
        raise NotImplementedError

    def _log(self, level: int, message: str, **extra: Any) -> None:
        raise NotImplementedError

    # -- lease ---------------------------------------------------------------------------
    async def _renew_lease(self, *, first: bool = False) -> None:
        try:
            if first:
                await self.lease.acquire(now=self.clock.now())
            else:
                await self.lease.renew(now=self.clock.now())
        except KubeError as exc:
            record_heartbeat(ok=False)
            self._log(
                logging.WARNING,
                "renewing the Lease failed",
                status=exc.status,
                reason=type(exc).__name__,
                detail=exc.message,
            )
        else:
            record_heartbeat(ok=True)
            log.debug("lease renewed", extra=fields(runner=self.name, leaseWrites=self.lease.writes))

    async def _lease_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self._renew_lease()

    # -- probe and report ----------------------------------------------------------------
    async def _probe(self, adapter: AgentAdapter) -> None:
        """Probe ``adapter`` and decide the authentication it shows, verified now."""
        timeout = self.config.env.probe_timeout_seconds
        try:
            report = await asyncio.wait_for(adapter.probe(), timeout)
        except TimeoutError:
            report = AdapterReport(
                adapter=adapter.name,
                adapter_version=helmhive_version(),
                auth=AuthState.FAILING,
                auth_reason=AuthReason.AGENT_UNRESPONSIVE,
                auth_message=f"the probe did not finish within {timeout:g}s",
            )
        self.probes += 1
        record_probe(config=self.config, auth=report.auth.value)
        report = decide_learnt(previous=self._adapter_report, current=report)
        self._adapter_report = report
        verdict = decide_auth_report(adapter=report, credential_present=self.credential.present())
        verified_at = decide_verified_at(
            previous=self._authentication,
            current=verdict,
            probed_at=self.clock.now(),
            auth_max_age_seconds=self.config.file.heartbeat.auth_max_age_seconds,
        )
        self._authentication = verdict.model_copy(update={"verified_at": verified_at})
        self._log(
            logging.INFO,
            "adapter probed",
            agent=report.agent_name,
            agentVersion=report.agent_version,
            auth=report.auth.value,
            authReason=report.auth_reason.value,
            models=len(report.models),
        )

    def _current_report(self) -> RunnerReport:
        assert self._adapter_report is not None
        adapter = self._adapter_report
        file = self.config.file
        spec = file.adapter
        env, secret_env = agent_env(self.config, self.credential)
        command = spec.acp.command if spec.acp else (spec.claude_cli.path if spec.claude_cli else "claude")
        args = list(spec.acp.args) if spec.acp else list(spec.claude_cli.extra_args if spec.claude_cli else [])
        fingerprint = build_fingerprint(
            image=self.config.env.image,
            helmhive_version=helmhive_version(),
            adapter_type=spec.type,
            agent_name=adapter.agent_name,
            agent_version=adapter.agent_version,
            provider=file.provider,
            command=command,
            args=args,
            env_names=[*env, *secret_env],
            credential_kind=self.credential.kind,
        )
        assert self._authentication is not None
        authentication = self._authentication
        return build_report(
            file=file,
            runner_name=self.name,
            adapter=adapter,
            authentication=authentication,
            active_jobs=self.active_jobs,
            fingerprint=fingerprint,
            credential_generation=self.config.env.credential_generation,
            registered_at=self._registered_at,
            now=self.clock.now(),
            credential_isolation=self.config.isolation,
            sandbox=self.sandbox_report,
        )

    async def _write_report_if_due(self) -> dt.datetime:
        """Write the report if the rule says so; return when the next refresh is due.

        A new digest goes onto the Lease at once, after the report (the report first, so the
        operator sees the two agree as soon as it can; a failed report write leaves the new
        digest on the Lease, which the operator reads as a stale report and fails closed).
        """
        now = self.clock.now()
        current = self._current_report()
        self.lease.digest = build_report_digest(current)
        try:
            return await self._write_report(current, now=now)
        finally:
            if self.lease.written_digest != self.lease.digest:
                await self._renew_lease()

    async def _write_report(self, current: RunnerReport, *, now: dt.datetime) -> dt.datetime:
        refresh = dt.timedelta(seconds=self.config.file.heartbeat.report_refresh_seconds)
        decision = decide_report_write(
            previous=self.publisher.last_report,
            current=current,
            last_written_at=self.publisher.last_written_at,
            now=now,
            refresh=refresh,
        )
        if decision.write:
            assert decision.reason is not None
            try:
                await self.publisher.publish(current, now=now)
            except KubeError:
                record_report_write(reason=decision.reason.value, ok=False)
                raise
            record_report_write(reason=decision.reason.value, ok=True)
            self._log(
                logging.INFO,
                "report written",
                reason=decision.reason.value,
                reportWrites=self.publisher.writes,
                leaseWrites=self.lease.writes,
                auth=current.authentication.state.value,
                activeJobs=current.active_jobs,
            )
        assert decision.next_refresh_at is not None
        return decision.next_refresh_at

    async def _probe_anyway(self, probe_adapter: AgentAdapter) -> None:
        """Probe on the probe adapter, or -- while a job holds it -- on a spare one, closed afterwards.

        Re-verification must not wait for a long job: the bound on ``verifiedAt`` holds regardless.
        """
        if probe_adapter in self._free:
            await self._probe(probe_adapter)
            return
        spare = self._adapter_factory(self.config, self.credential)
        try:
            await self._probe(spare)
        finally:
            with contextlib.suppress(Exception):
                await spare.close()

    async def _report_loop(self, probe_adapter: AgentAdapter) -> None:
        probe_every = min(
            dt.timedelta(seconds=self.config.env.probe_interval_seconds),
            reverify_interval(self.config.file.heartbeat.auth_max_age_seconds),
        )
        next_probe = self.clock.now() + probe_every
        next_refresh = self.clock.now() + dt.timedelta(seconds=self.config.file.heartbeat.report_refresh_seconds)
        while True:
            wake_at = min(next_probe, next_refresh)
            timeout = max(0.0, (wake_at - self.clock.now()).total_seconds())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_report.wait(), timeout)
            self._wake_report.clear()
            if self.clock.now() >= next_probe:
                await self._probe_anyway(probe_adapter)
                next_probe = self.clock.now() + probe_every
            try:
                next_refresh = await self._write_report_if_due()
            except KubeError as exc:
                self._log(logging.WARNING, "writing the report failed", status=exc.status, detail=exc.message)
                next_refresh = self.clock.now() + dt.timedelta(
                    seconds=min(30, self.config.file.heartbeat.report_refresh_seconds)
                )

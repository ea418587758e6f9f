"""What the runner holds for one job while it runs, outside its sandbox: its listener on the egress
proxy and its cgroup.

:func:`ensure_job_resources` opens them before the job's sandbox is planned (the plan names the
listener's port or socket, and the cgroup the launcher joins); :meth:`JobResources.close` ends them
after the job, whatever happened: the listener stops and the cgroup is emptied (every process left
in it killed) and removed. The listener is revoked before that (:meth:`JobResources.revoke`), the
moment the job is cancelled or its agent's last turn ends, so nothing the job left behind reaches
the provider through it, even while the agent is given its grace to exit.

- With ``credentialIsolation: Proxy`` the job gets a listener of its own (its rate and concurrency
  are counted there: :mod:`helmhive.runner.egress.limits`): where the launcher can make network
  namespaces, the UNIX socket ``<state>/egress/<uid>.sock`` (never granted to any sandbox), which
  the relay in the agent's namespace connects to; otherwise a TCP port of its own on ``127.0.0.1``.
- Where the runner can make cgroups (:mod:`helmhive.runner.sandbox.cgroups`), a cgroup with the pool's
  ``jobLimits`` as the job's totals.
- Its disk (:func:`disk_paths`: workspace, HOME, TMPDIR), measured against ``jobLimits.diskBytes``
  (:mod:`helmhive.runner.sandbox.disk`; :func:`measure_disk_hit`).

A job in a job pod (``execution.mode: JobPod``) gets neither: its pod is its box. Its phantom key on
the job pods' listener (:attr:`JobResources.pod_egress`) is revoked and closed the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from helmhive.api.runnerpool import JobLimits
from helmhive.runner.egress.proxy import EgressProxy, JobEgress, PodJobEgress
from helmhive.runner.logs import fields
from helmhive.runner.sandbox.cgroups import JobCgroup, ensure_job_cgroup, remove_job_cgroup
from helmhive.runner.sandbox.disk import decide_disk_hit, measure_usage
from helmhive.runner.sandbox.limits import LimitSupport
from helmhive.runner.sandbox.plan import SandboxPlan

__all__ = ["EGRESS_DIR", "JobResources", "disk_paths", "ensure_job_resources", "measure_disk_hit"]

EGRESS_DIR = "egress"
"""Below the runner's state dir: the jobs' UNIX sockets on the egress proxy."""
log = logging.getLogger("helmhive.runner.jobs.resources")


@dataclass(kw_only=True)
class JobResources:
    egress: JobEgress | None = None
    cgroup: JobCgroup | None = None
    pod_egress: PodJobEgress | None = None
    """A job pod's phantom key (JobPod mode), once its pod's address is known."""

    def revoke(self) -> None:
        """Refuse the job's requests to the provider from now on (:meth:`JobEgress.revoke`): the job has
        ended or is ending, and whatever it left running must not spend the key (idempotent)."""
        if self.egress is not None:
            self.egress.revoke()
        if self.pod_egress is not None:
            self.pod_egress.revoke()

    async def close(self) -> None:
        """Stop the job's listener, empty and remove its cgroup (idempotent)."""
        egress, self.egress = self.egress, None
        if egress is not None:
            with contextlib.suppress(Exception):
                await egress.close()
        pod_egress, self.pod_egress = self.pod_egress, None
        if pod_egress is not None:
            await pod_egress.close()
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None and not await asyncio.to_thread(remove_job_cgroup, cgroup):
            log.warning("a job cgroup could not be removed", extra=fields(cgroup=str(cgroup.dirs[0])))


async def ensure_job_resources(
    *,
    egress: EgressProxy | None,
    support: LimitSupport,
    limits: JobLimits,
    state_dir: Path,
    cgroup_prefix: str,
    uid: str,
) -> JobResources:
    """Open the job's listener and make its cgroup. Raises :class:`OSError` if either fails (the
    job then fails in the runner, having started nothing)."""
    resources = JobResources()
    try:
        if egress is not None:
            socket_path = None
            if support.network_namespace:
                directory = state_dir / EGRESS_DIR
                await asyncio.to_thread(directory.mkdir, mode=0o700, parents=True, exist_ok=True)
                socket_path = directory / (uid.replace("-", "")[:32] + ".sock")
            resources.egress = await egress.open_job(socket_path=socket_path)
        resources.cgroup = await asyncio.to_thread(
            ensure_job_cgroup, support=support.cgroups, prefix=cgroup_prefix, uid=uid, limits=limits
        )
    except BaseException:
        await resources.close()
        raise
    return resources


def disk_paths(plan: SandboxPlan) -> tuple[Path, ...]:
    """What counts against the job's disk limit: its workspace, HOME and TMPDIR."""
    return (plan.workdir, plan.home, plan.tmpdir)


async def measure_disk_hit(*, plan: SandboxPlan, limit: int) -> str | None:
    """Why the job is over its disk limit now (its directories measured), or None."""
    used = await asyncio.to_thread(measure_usage, disk_paths(plan))
    return decide_disk_hit(used=used, limit=limit)

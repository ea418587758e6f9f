"""A job's agent in its job pod (``RunnerPool.spec.execution.mode: JobPod``): the runner's side, once the pod runs.

:class:`PodRun` drives one pod the runner claimed or created for a job (:mod:`.podclaim`) and
that runs, over the link to its shim (:class:`~helmhive.runner.jobpod.link.JobPodLink`: one
authenticated connection per step, with the pool's key; the first claims the shim for the job):

1. :meth:`PodRun.open` mints the job's phantom key on the egress proxy, honoured from the pod's
   address only (:mod:`helmhive.runner.egress.pods`), and says where the agent runs (:class:`PodAgent`:
   ``helmhive-jobpod attach`` as the adapter's wrapper, the pod's paths, the shim's relay);
2. :meth:`PodRun.put_trees` puts the job's tree (checked out by the runner, :mod:`.governed`) and
   HOME (a session binding's, so resume and fork work as in the runner) into the pod, retrying the
   connection until the shim listens (:attr:`JobPodSettings.connect_window_s`);
3. the adapter drives the agent through the wrapper: the shim starts one agent per pod, so one ACP
   process serves the job's turns (the repair turn and compaction included);
4. after the agent exited, :meth:`PodRun.end_agent` has revoked the key; :meth:`PodRun.take_back`
   brings a tree back (an implementation's, for its patch; a binding's HOME), :meth:`PodRun.run_checks`
   runs the checks in the pod, and :meth:`PodRun.close` sends FINISH (the shim kills what is left
   and exits) and forgets the key.

The order is :class:`~helmhive.runner.jobs.execution.JobExecution`'s; the pod itself (claim, wait,
outcome, deletion) is :mod:`.podclaim`'s. Every failure of the link is a
:class:`~helmhive.runner.jobpod.frames.LinkError`; :func:`decide_link_failure` names the job's ending.
No key is ever logged: the link key is read per job and held as bytes, the phantom key as a SecretStr.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from helmhive.api.governed import CheckEvidence, CheckSpec
from helmhive.api.jobpod import EGRESS_RELAY_PORT, JOB_HOME, JOB_ROOT, JOB_TMP, JOB_WORKSPACE, LINK_PORT
from helmhive.api.reasons import Reason, detailed
from helmhive.runner.egress.limits import RequestLimits
from helmhive.runner.egress.listeners import authority
from helmhive.runner.egress.proxy import EgressProxy, PodJobEgress
from helmhive.runner.jobpod.auth import read_key
from helmhive.runner.jobpod.frames import LinkError, LinkReason, TreePart
from helmhive.runner.jobpod.link import JobPodLink, TreeStats
from helmhive.runner.jobs.agents import PodAgent
from helmhive.runner.jobs.status import JobEnding
from helmhive.runner.logs import fields
from helmhive.runner.source.checks import ChecksRun

__all__ = [
    "JOBPOD_COMMAND",
    "JobPodSettings",
    "PodRun",
    "PodTarget",
    "build_attach_wrapper",
    "decide_link_failure",
    "jobpod_command",
]

log = logging.getLogger("helmhive.runner.jobs.jobpod")

JOBPOD_COMMAND = "helmhive-jobpod"
_RETRY_S = 0.5
_RECONNECT_S = 5.0
"""Once the shim has listened, how long a later connection is retried (its answer, not its start, is awaited)."""
_EXIT_WINDOW_S = 30.0
"""After the adapter closed, how long the shim may take to see the agent's exit (GET_TREE answers ``running``)."""
_UNREACHABLE = frozenset({LinkReason.CONNECT, LinkReason.TIMEOUT, LinkReason.CLOSED, LinkReason.EOF})


def jobpod_command() -> str:
    """``helmhive-jobpod`` beside this interpreter (the runner image's), else as ``PATH`` finds it."""
    beside = Path(sys.executable).with_name(JOBPOD_COMMAND)
    return str(beside) if beside.is_file() else JOBPOD_COMMAND


@dataclass(frozen=True, kw_only=True)
class PodTarget:
    """A running job pod: its name and address, and the contract's ports and paths in it."""

    name: str
    ip: str
    link_port: int = LINK_PORT
    relay_port: int = EGRESS_RELAY_PORT
    job_root: str = JOB_ROOT
    """Where the shim keeps the job's tree, HOME and tmp (the contract's ``/job``; a test's own directory)."""

    @property
    def address(self) -> str:
        return authority(self.ip, self.link_port)

    @property
    def workspace(self) -> str:
        return JOB_WORKSPACE if self.job_root == JOB_ROOT else f"{self.job_root}/workspace"

    @property
    def home(self) -> str:
        return JOB_HOME if self.job_root == JOB_ROOT else f"{self.job_root}/home"

    @property
    def tmp(self) -> str:
        return JOB_TMP if self.job_root == JOB_ROOT else f"{self.job_root}/tmp"


@dataclass(frozen=True, kw_only=True)
class JobPodSettings:
    """What every job pod of one runner shares."""

    key_file: Path
    """The runner's copy of the pool's link key (:data:`~helmhive.api.jobpod.LINK_KEY_FILE`)."""
    egress_target: str
    """``host:port`` of the runner's job pods' listener, which the shim's relay connects to."""
    limits: RequestLimits
    """Each job's bounds on the proxy (the pool's ``egress``)."""
    command: str = JOBPOD_COMMAND
    connect_window_s: float = 120.0
    """How long a running pod's shim may take to listen (its image started, Python importing)."""
    io_timeout_s: float = 60.0
    """Bounds each connect, handshake and wait for a frame of a tree."""
    link_port: int = LINK_PORT
    relay_port: int = EGRESS_RELAY_PORT
    job_root: str = JOB_ROOT
    """The contract's port and paths in every job pod; other values only where the "pods" are local
    processes on loopback (tests)."""

    def target(self, *, name: str, ip: str) -> PodTarget:
        """Job pod ``name`` at ``ip``, with these ports and paths."""
        return PodTarget(name=name, ip=ip, link_port=self.link_port, relay_port=self.relay_port, job_root=self.job_root)


def build_attach_wrapper(*, settings: JobPodSettings, target: PodTarget, job_uid: str) -> tuple[str, ...]:
    """The argv the adapter puts before the agent's command: run it in ``target`` as if it were local."""
    return (
        settings.command,
        "attach",
        *("--address", target.address),
        *("--pod", target.name),
        *("--key-file", str(settings.key_file)),
        *("--job-uid", job_uid),
        *("--cwd", target.workspace),
        *("--egress-target", settings.egress_target),
        "--",
    )


def decide_link_failure(error: LinkError, *, pod: str) -> JobEnding:
    """The job's ending when the link failed and the pod's state said nothing: unreachable is the pod
    lost (an infrastructure failure, retried); anything else (a key or protocol the shim refuses) fails again."""
    if error.reason in _UNREACHABLE:
        reason, why = detailed(Reason.JOB_POD_LOST, "Unreachable"), "the runner lost the link to"
    else:
        reason, why = detailed(Reason.JOB_POD_FAILED, f"Link_{error.reason}"), "the link was refused by"
    return JobEnding(succeeded=False, reason=reason, message=f"{why} pod {pod}: {error.reason}: {error.message}"[:1000])


class PodRun:
    """One job's running pod, from its address on (see the module). :meth:`close` always, once."""

    def __init__(
        self, *, target: PodTarget, settings: JobPodSettings, job: str, job_uid: str, egress: EgressProxy
    ) -> None:
        self.target = target
        self._settings = settings
        self._job = job
        self._uid = job_uid
        self._proxy = egress
        self._key: bytes | None = None
        self.egress: PodJobEgress | None = None
        self.claimed_link = False
        """Whether a connection got through (the shim is the job's: FINISH is worth sending)."""

    def _log(self, level: int, message: str, **extra: object) -> None:
        log.log(level, message, extra=fields(job=self._job, pod=self.target.name, **extra))

    async def open(self, *, local_cwd: Path, local_home: Path) -> PodAgent:
        """Read the link key, mint the job's phantom key; where and how its agent runs.
        Raises LinkError (the key file), ValueError (another open job's pod has this address)."""
        self._key = await asyncio.to_thread(read_key, self._settings.key_file)
        self.egress = self._proxy.open_pod_job(job=self._job, pod_ip=self.target.ip, limits=self._settings.limits)
        return PodAgent(
            wrapper=build_attach_wrapper(settings=self._settings, target=self.target, job_uid=self._uid),
            workspace=self.target.workspace,
            home=self.target.home,
            tmp=self.target.tmp,
            relay_port=self.target.relay_port,
            key=self.egress.key,
            local_cwd=local_cwd,
            local_home=local_home,
        )

    async def _connect(self, window_s: float) -> JobPodLink:
        """An authenticated connection, retried while nothing listens yet (a shim still starting)."""
        assert self._key is not None, "open() first"
        deadline = time.monotonic() + window_s
        while True:
            try:
                link = await JobPodLink.connect(
                    self.target.ip,
                    self.target.link_port,
                    key=self._key,
                    pod=self.target.name,
                    job_uid=self._uid,
                    timeout=self._settings.io_timeout_s,
                )
            except LinkError as exc:
                if exc.reason not in (LinkReason.CONNECT, LinkReason.TIMEOUT) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(_RETRY_S)
                continue
            self.claimed_link = True
            return link

    async def put_trees(self, *, workspace: Path, home: Path) -> tuple[TreeStats, TreeStats]:
        """The job's tree and HOME into the pod, before its agent starts; what the shim wrote of each."""
        link = await self._connect(self._settings.connect_window_s)
        try:
            tree = await link.put_tree("workspace", workspace)
            kept = await link.put_tree("home", home)
        finally:
            await link.close()
        self._log(logging.INFO, "job pod ready", treeFiles=tree.files, treeBytes=tree.bytes, homeFiles=kept.files)
        return tree, kept

    def end_agent(self) -> None:
        """The agent's last turn is over: its key is refused from now on (idempotent)."""
        if self.egress is not None:
            self.egress.revoke()

    async def take_back(self, part: TreePart, into: Path) -> TreeStats:
        """Replace ``into`` with the pod's ``part`` (its copy after the agent exited), whole or not at all."""
        incoming = into.with_name(into.name + ".incoming")
        deadline = time.monotonic() + _EXIT_WINDOW_S
        try:
            while True:
                await asyncio.to_thread(_fresh_dir, incoming)
                link = await self._connect(_RECONNECT_S)
                try:
                    stats = await link.get_tree(part, incoming)
                    break
                except LinkError as exc:  # ``running``: the shim has not seen the agent's exit yet
                    if exc.reason != LinkReason.RUNNING or time.monotonic() > deadline:
                        raise
                finally:
                    await link.close()
                await asyncio.sleep(_RETRY_S)
        except BaseException:
            await asyncio.to_thread(_remove_tree, incoming)  # ``into`` stays as it was
            raise
        await asyncio.to_thread(_swap, incoming, into)
        self._log(logging.INFO, "tree taken back", part=part, files=stats.files, bytes=stats.bytes)
        return stats

    async def run_checks(self, specs: Sequence[CheckSpec], *, cancel: asyncio.Event) -> ChecksRun:
        """Run every check in order in the pod's copy of the tree; stop (``cancelled``) when ``cancel`` is set."""
        evidence: list[CheckEvidence] = []
        link = await self._connect(_RECONNECT_S)
        try:
            for spec in specs:
                if cancel.is_set():
                    return ChecksRun(evidence=evidence, cancelled=True)
                running = asyncio.ensure_future(link.run_check(spec))
                stopped = asyncio.ensure_future(cancel.wait())
                await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if not running.done():  # the pod goes with the job: its check with it
                    running.cancel()
                    with contextlib.suppress(asyncio.CancelledError, LinkError):
                        await running
                    return ChecksRun(evidence=evidence, cancelled=True)
                evidence.append(running.result().to_evidence())
        finally:
            await link.close()
        return ChecksRun(evidence=evidence, cancelled=False)

    async def close(self) -> None:
        """FINISH (best effort: the pod is deleted next in any case) and forget the phantom key."""
        try:
            if self.claimed_link:
                link = await self._connect(_RECONNECT_S)
                try:
                    await link.finish()
                finally:
                    await link.close()
        except LinkError as exc:
            self._log(logging.INFO, "job pod not finished over the link", reason=str(exc.reason))
        finally:
            egress, self.egress = self.egress, None
            if egress is not None:
                await egress.close()
            self._key = None


def _remove_tree(path: Path) -> None:
    """Remove ``path`` whole, read-only directories too (an agent's caches often are)."""

    def writable(func: Callable[[str], object], name: str, _: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
            func(name)

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=writable)


def _fresh_dir(path: Path) -> None:
    _remove_tree(path)
    path.mkdir(mode=0o700)


def _swap(incoming: Path, into: Path) -> None:
    """``incoming`` in place of ``into``, with its mode (renames in one directory; the old tree removed after)."""
    old = into.with_name(into.name + ".old")
    _remove_tree(old)
    if into.exists():
        incoming.chmod(into.stat().st_mode & 0o777)
        into.rename(old)
    incoming.rename(into)
    _remove_tree(old)

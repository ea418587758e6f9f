"""The operator's own store of AgentJob facts: jobs by the runner they hold, implementations by change. Pure.

Kopf's indexes on AgentJobs cost O(N²) at start-up (Kopf makes a readiness toggle per listed
object and every toggle change wakes every waiting worker: over 10,000 jobs a restarted operator
routed nothing for 12 minutes), so the operator keeps these facts itself. A
:class:`JobStore` is filled by the operator's own AgentJob watch
(:mod:`helmhive.controller.jobs.watch`): a paginated LIST
(:mod:`helmhive.controller.job_store_sync`), then the watch's events, then a LIST again after a
410 (whose missing jobs are dropped: :func:`helmhive.policy.agentjob.watch.decide_vanished`); it
answers what the routing and lost-runner indexes used to:

- :meth:`JobStore.held_on`: the jobs holding a slot on a runner (assigned, not finished;
  :attr:`helmhive.policy.agentjob.life.AgentJob.held_runner`);
- :meth:`JobStore.implementation_provider`: which provider ran a change's implementation
  (:func:`helmhive.policy.routing.inputs.decide_implementation_provider`);
- :meth:`JobStore.revisions_in_use`: the revisions of a profile that unfinished jobs are bound
  to (the profile handler never prunes them), so a profile event does not LIST every job;
- :meth:`JobStore.probes_of`: a runner's qualification jobs
  (:func:`helmhive.policy.runners.qualification.parse_probe_job`), for its pool's loop.

Two optional listeners tell the operator what changed, by runner: :attr:`JobStore.on_release`
(a job stopped holding a slot on it) and :attr:`JobStore.on_probe` (one of its qualification
jobs changed).

It holds only these slim facts and each job's ``resourceVersion``, never whole objects.

**Order.** The LIST and the watch that follows it are one ordered stream, but a caller may feed
copies from elsewhere (and the watch resumes across reconnects), so every job keeps the
``resourceVersion`` it was last updated from, and an older copy is ignored. This assumes what etcd
gives today and Kubernetes documents as opaque: that the resourceVersions of one kind compare as
integers (etcd's revision counter). A version that is not an integer is applied as if newest. A
deleted job leaves the store at once; until the LIST is complete, its deletion is remembered (a
tombstone) so an older listed copy of it cannot bring it back.

The store never undercounts a runner's jobs because of the LIST: a copy is only ever replaced
by a newer one. Slots the router assigned and not yet seen here are the router's own
reservations (:mod:`helmhive.controller.router.capacity`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from helmhive.api.qualification import QUALIFICATION_LABEL
from helmhive.policy.agentjob.life import AgentJob, parse_agent_job
from helmhive.policy.routing.inputs import decide_implementation_provider
from helmhive.policy.routing.route import RunnerKey
from helmhive.policy.runners.qualification import ProbeJobView, parse_probe_job

__all__ = [
    "ImplementationKey",
    "JobFacts",
    "JobKey",
    "JobStore",
    "ProfileKey",
    "build_job_facts",
    "job_binding",
    "parse_resource_version",
]

JobKey = tuple[str, str]
ImplementationKey = tuple[str, str, int]
"""(namespace, change, iteration)."""
ProfileKey = tuple[str, str]
"""(profile, revision) of a job's binding."""


class JobFacts(NamedTuple):
    """What the store keeps of one job."""

    version: int | None
    """``metadata.resourceVersion`` as an integer; None when it is not one (then applied as newest)."""
    runner: RunnerKey | None
    """The runner it holds a slot on (assigned, not finished)."""
    implementation: tuple[ImplementationKey, str] | None
    """For a change's assigned implementation job: its key and the provider it ran on."""
    binding: ProfileKey | None = None
    """For a job bound to a profile revision and not finished: (profile, revision)."""
    probe: tuple[RunnerKey, ProbeJobView] | None = None
    """For a qualification job: the runner it qualifies, and its outcome so far."""


def parse_resource_version(body: Mapping[str, Any]) -> int | None:
    """``metadata.resourceVersion`` as an integer (see the module docstring), None if it is not one."""
    raw = (body.get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(raw))
    except (TypeError, ValueError):
        return None


def _intern_key(key: tuple[str, str]) -> tuple[str, str]:
    # Runner namespaces and names repeat across thousands of jobs: share the strings.
    return (sys.intern(key[0]), sys.intern(key[1]))


def build_job_facts(body: Mapping[str, Any]) -> JobFacts:
    """The slim facts of one job object."""
    job = parse_agent_job(body)
    runner = job.held_runner
    meta = body.get("metadata") or {}
    return JobFacts(
        version=parse_resource_version(body),
        runner=_intern_key(runner) if runner is not None else None,
        implementation=decide_implementation_provider(body),
        binding=job_binding(job),
        probe=parse_probe_job(body) if QUALIFICATION_LABEL in (meta.get("labels") or {}) else None,
    )


def job_binding(job: AgentJob) -> ProfileKey | None:
    """(profile, revision) of a bound, unfinished job; None otherwise."""
    profile = job.profile_name
    if profile is None or job.finished:
        return None
    revision = job.raw_status["profile"].get("revision")
    return _intern_key((profile, str(revision))) if revision else None


def _job_key(body: Mapping[str, Any]) -> JobKey:
    meta = body.get("metadata") or {}
    return (sys.intern(str(meta.get("namespace") or "")), str(meta.get("name") or ""))


def _newer(version: int | None, than: int | None) -> bool:
    """True unless ``version`` is known to be older than ``than`` (equal re-applies: harmless)."""
    return version is None or than is None or version >= than


class JobStore:
    """Jobs by runner and implementations by change, kept from a LIST and watch events (see the module docstring)."""

    def __init__(self) -> None:
        self._facts: dict[JobKey, JobFacts] = {}
        self._by_runner: dict[RunnerKey, set[JobKey]] = {}
        self._counts: dict[RunnerKey, int] = {}
        """len() of each ``_by_runner`` set, kept with it: every decision copies it in one C call."""
        self._implementations: dict[ImplementationKey, dict[JobKey, str]] = {}
        self._bindings: dict[tuple[str, str], dict[JobKey, str]] = {}
        """(namespace, profile) -> unfinished job -> the revision it is bound to."""
        self._probes: dict[RunnerKey, dict[str, ProbeJobView]] = {}
        self._tombstones: dict[JobKey, int | None] = {}
        self.listing = False
        self.synced = False
        self.on_release: Callable[[RunnerKey], None] | None = None
        """Called when a job stops holding a slot on a runner (finished, deleted, re-assigned)."""
        self.on_probe: Callable[[RunnerKey], None] | None = None
        """Called when one of a runner's qualification jobs is added, changed or deleted."""

    # Reads ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._facts)

    def facts(self, key: JobKey) -> JobFacts | None:
        return self._facts.get(key)

    @property
    def jobs_by_runner(self) -> Mapping[RunnerKey, set[JobKey]]:
        """Runner -> the jobs holding a slot on it (a live view; do not modify)."""
        return self._by_runner

    @property
    def counts_by_runner(self) -> Mapping[RunnerKey, int]:
        """Runner -> how many jobs hold a slot on it, never 0 (a live view; do not modify)."""
        return self._counts

    def held_on(self, runner: RunnerKey) -> set[JobKey]:
        return self._by_runner.get(runner) or set()

    def versions(self) -> dict[JobKey, int | None]:
        """Every job held, with the version it was last updated from (a copy)."""
        return {key: facts.version for key, facts in self._facts.items()}

    def implementation_provider(self, key: ImplementationKey) -> str | None:
        providers = self._implementations.get(key)
        return next(iter(providers.values()), None) if providers else None

    def revisions_in_use(self, namespace: str, profile: str) -> set[str]:
        """The revisions of ``profile`` that unfinished jobs in ``namespace`` are bound to."""
        return set((self._bindings.get((namespace, profile)) or {}).values())

    def probes_of(self, runner: RunnerKey) -> Mapping[str, ProbeJobView]:
        """The qualification jobs of ``runner``, by job name."""
        return self._probes.get(runner) or {}

    # Writes -----------------------------------------------------------------------------------
    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Take one watch event (type None: a listed object). False when it was older than the store's copy."""
        key = _job_key(body)
        if event_type == "DELETED":
            version = parse_resource_version(body)
            current = self._facts.get(key)
            if current is not None and not _newer(version, current.version):
                return False
            self._drop(key)
            if not self.synced:
                self._tombstones[key] = version
            return True
        return self._put(key, build_job_facts(body))

    def begin_listing(self) -> None:
        """The LIST starts: deletions seen from now on are remembered until :meth:`finish_listing`."""
        self.listing = True

    def add_listed(self, items: Iterable[Mapping[str, Any]]) -> int:
        """Take one page of the LIST; returns how many copies were newer than the store's."""
        return sum(1 for item in items if self._put(_job_key(item), build_job_facts(item)))

    def finish_listing(self) -> None:
        """Every page is in: the store is synced, and its tombstones are no longer needed."""
        self.listing = False
        self.synced = True
        self._tombstones.clear()

    def _put(self, key: JobKey, facts: JobFacts) -> bool:
        if key in self._tombstones and not _newer(facts.version, self._tombstones[key]):
            return False
        if key in self._tombstones and facts.version is not None:
            del self._tombstones[key]  # re-created under the same name
        current = self._facts.get(key)
        if current is not None and not _newer(facts.version, current.version):
            return False
        self._drop(key, replaced_by=facts)
        self._facts[key] = facts
        if facts.runner is not None:
            jobs = self._by_runner.setdefault(facts.runner, set())
            jobs.add(key)
            self._counts[facts.runner] = len(jobs)
        if facts.implementation is not None:
            change, provider = facts.implementation
            self._implementations.setdefault(change, {})[key] = provider
        if facts.binding is not None:
            profile, revision = facts.binding
            self._bindings.setdefault((key[0], profile), {})[key] = revision
        if facts.probe is not None:
            runner, view = facts.probe
            self._probes.setdefault(runner, {})[key[1]] = view
            if self.on_probe is not None:
                self.on_probe(runner)
        return True

    def _drop(self, key: JobKey, *, replaced_by: JobFacts | None = None) -> None:
        current = self._facts.pop(key, None)
        if current is None:
            return
        if current.runner is not None:
            jobs = self._by_runner.get(current.runner)
            if jobs is not None:
                jobs.discard(key)
                if jobs:
                    self._counts[current.runner] = len(jobs)
                else:
                    del self._by_runner[current.runner]
                    self._counts.pop(current.runner, None)
            released = replaced_by is None or replaced_by.runner != current.runner
            if released and self.on_release is not None:
                self.on_release(current.runner)
        if current.probe is not None:
            runner = current.probe[0]
            probes = self._probes.get(runner)
            if probes is not None:
                probes.pop(key[1], None)
                if not probes:
                    del self._probes[runner]
            moved = replaced_by is None or replaced_by.probe is None or replaced_by.probe[0] != runner
            if moved and self.on_probe is not None:
                self.on_probe(runner)
        if current.implementation is not None:
            change = current.implementation[0]
            providers = self._implementations.get(change)
            if providers is not None:
                providers.pop(key, None)
                if not providers:
                    del self._implementations[change]
        if current.binding is not None:
            bound = (key[0], current.binding[0])
            revisions = self._bindings.get(bound)
            if revisions is not None:
                revisions.pop(key, None)
                if not revisions:
                    del self._bindings[bound]

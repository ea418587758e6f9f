"""The runner's side of governed work: the exact source, the reviewed patch, the patch and checks.

A job with ``spec.source`` gets its tree from the runner, outside the sandbox and before the
agent starts (:func:`ensure_job_tree`):

* the exact commit is fetched with :func:`helmhive.runner.source.fetch.ensure_source` into the job's
  ``work/`` (git dir ``source.git/`` beside it, objects cached in ``<state>/source-cache``);
  its :class:`~helmhive.runner.source.fetch.SourceError` ends the job with its own reason;
* a review job's patch (``spec.patch``) is read from the implementation job's artifacts
  ConfigMap and checked against its SHA-256 *before* the job runs (:func:`load_review_patch`:
  ``PatchUnavailable``, ``PatchDigestMismatch``), then applied to the fresh checkout
  (``PatchDoesNotApply``); the prompt shows it in a ``## Patch`` section;
* only then is the filesystem mode applied (read-only for planning and review).

A governed job without ``spec.source`` fails closed (``SourceRequired``); a review job without
``spec.patch`` too (``PatchUnavailable``). After an implementation turn that met its contract,
:func:`run_implementation_steps` computes the patch (``NoChanges``, ``PatchTooLarge``,
``PatchNotText``) and runs the checks. ``decide_*``/``build_*`` are pure.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from helmhive.api.common import FilesystemAccess, JobKind
from helmhive.api.governed import CheckSpec, PatchRef, SourceRef
from helmhive.api.job import AgentJobSpec
from helmhive.api.reasons import Reason
from helmhive.policy.envelopes import is_governed
from helmhive.runner.config import RunnerConfig
from helmhive.runner.jobs.status import JobEnding
from helmhive.runner.kube import NotFound, RunnerKube
from helmhive.runner.sandbox.workdir import SandboxPlan, create_sandbox, seal_sandbox, source_cache_dir
from helmhive.runner.source.checks import ChecksRun, build_checks_message, run_checks
from helmhive.runner.source.fetch import GitCredentials, SourceError, ensure_source
from helmhive.runner.source.patches import (
    ComputedPatch,
    GitTree,
    PatchError,
    build_patch_ref,
    build_patch_section,
    run_patch_apply,
    run_patch_diff,
)

__all__ = [
    "ChecksRunner",
    "ImplementationSteps",
    "ReviewPatch",
    "build_git_tree",
    "build_implementation_result",
    "decide_governed_problem",
    "decide_patch_digest",
    "display_repository",
    "ensure_job_tree",
    "ensure_job_workspace",
    "git_credential_dir",
    "load_review_patch",
    "run_implementation_steps",
]


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def git_credential_dir(config: RunnerConfig) -> Path | None:
    """Where the pool's git credentials Secret is mounted (None: public repositories only)."""
    return config.env.source_credentials_dir


def display_repository(url: str) -> str:
    """The repository URL without any user or password in it (for messages and logs)."""
    return _USERINFO.sub(r"\1", url)


def decide_governed_problem(*, spec: AgentJobSpec, filesystem: FilesystemAccess) -> JobEnding | None:
    """Why the job may not run as specified (None: it may). Governed work never runs without its source."""
    kind = spec.job_kind
    if is_governed(kind) and spec.source is None:
        message = f"a {kind.value} job needs spec.source (a repository and an exact commit); it has none"
        return JobEnding(succeeded=False, reason=Reason.SOURCE_REQUIRED, message=message)
    if spec.source is not None and filesystem is FilesystemAccess.NONE:
        message = "spec.source is set, but the job's profile gives it no filesystem to check it out into"
        return JobEnding(succeeded=False, reason=Reason.INVALID_SPEC, message=message)
    if kind is JobKind.CHANGE_REVIEW and spec.patch is None:
        message = "a change-review job needs spec.patch (the implementation's patch and its SHA-256); it has none"
        return JobEnding(succeeded=False, reason=Reason.PATCH_UNAVAILABLE, message=message)
    return None


def decide_patch_digest(*, text: str, ref: PatchRef) -> JobEnding | None:
    """``PatchDigestMismatch`` unless the stored text is exactly the bytes ``ref`` names."""
    raw = text.encode()
    digest = hashlib.sha256(raw).hexdigest()
    if digest == ref.sha256 and len(raw) == ref.bytes:
        return None
    message = (
        f"the patch in ConfigMap {ref.config_map} (key {ref.key}) is {len(raw)} bytes with sha256 {digest}; "
        f"spec.patch names {ref.bytes} bytes with sha256 {ref.sha256}"
    )
    return JobEnding(succeeded=False, reason=Reason.PATCH_DIGEST_MISMATCH, message=message)


@dataclass(frozen=True, kw_only=True)
class ReviewPatch:
    """A review job's verified patch and the prompt section that shows it."""

    text: str
    ref: PatchRef
    section: str


async def load_review_patch(*, kube: RunnerKube, ref: PatchRef) -> ReviewPatch | JobEnding:
    """Read the patch ``ref`` names from its ConfigMap (the job's namespace) and verify it."""
    try:
        data = await kube.get_config_map_data(ref.config_map)
    except NotFound:
        message = f"the patch's ConfigMap {ref.config_map} does not exist (was the implementation job deleted?)"
        return JobEnding(succeeded=False, reason=Reason.PATCH_UNAVAILABLE, message=message)
    text = data.get(ref.key)
    if text is None:
        message = f"the ConfigMap {ref.config_map} has no key {ref.key}"
        return JobEnding(succeeded=False, reason=Reason.PATCH_UNAVAILABLE, message=message)
    mismatch = decide_patch_digest(text=text, ref=ref)
    if mismatch is not None:
        return mismatch
    return ReviewPatch(text=text, ref=ref, section=build_patch_section(text=text, sha256=ref.sha256))


def build_git_tree(plan: SandboxPlan) -> GitTree:
    return GitTree(git_dir=plan.git_dir, work_tree=plan.workdir, scratch=plan.scratch)


def ensure_job_tree(
    *,
    plan: SandboxPlan,
    state_dir: Path,
    source: SourceRef,
    credential_dir: Path | None,
    patch: ReviewPatch | None,
) -> JobEnding | None:
    """Check out the exact source into the (created, not yet sealed) sandbox, then apply a review's
    patch; the verdict that ends the job if either fails. Synchronous: run it in a thread.

    ``credential_dir`` is the pool's mounted git credentials Secret (read here, used only by the
    fetch: never the agent's, never in a message)."""
    try:
        credentials = GitCredentials.from_dir(credential_dir) if credential_dir is not None else None
        ensure_source(
            cache_dir=source_cache_dir(state_dir),
            repository=source.repository,
            commit=source.commit,
            git_dir=plan.git_dir,
            work_tree=plan.workdir,
            credentials=credentials,
        )
    except SourceError as exc:
        return JobEnding(succeeded=False, reason=exc.reason, message=exc.message[:1000])
    if patch is not None:
        try:
            run_patch_apply(tree=build_git_tree(plan), text=patch.text)
        except PatchError as exc:
            return JobEnding(succeeded=False, reason=exc.reason, message=exc.message[:1000])
    return None


async def ensure_job_workspace(
    *, plan: SandboxPlan, source: SourceRef | None, patch: ReviewPatch | None, config: RunnerConfig
) -> JobEnding | None:
    """The job's directories; with a source, its checkout (and a review's patch) before the
    filesystem mode is applied. The verdict that ends the job if any step fails."""
    try:
        await asyncio.to_thread(create_sandbox, plan)
    except OSError as exc:
        why = f"the job's working directory could not be prepared: {exc.strerror or exc}"
        return JobEnding(succeeded=False, reason=Reason.SANDBOX_UNAVAILABLE, message=why)
    if source is not None:
        failed = await asyncio.to_thread(
            ensure_job_tree,
            plan=plan,
            state_dir=config.env.state_dir,
            source=source,
            credential_dir=git_credential_dir(config),
            patch=patch,
        )
        if failed is not None:
            return failed
    try:
        await asyncio.to_thread(seal_sandbox, plan)
    except OSError as exc:
        why = f"the job's working directory could not be made {plan.fs_access}-only: {exc.strerror or exc}"
        return JobEnding(succeeded=False, reason=Reason.SANDBOX_UNAVAILABLE, message=why)
    return None


class ChecksRunner(Protocol):
    """Where an implementation's checks run, if not in the runner's sandbox (a job pod's shim:
    :meth:`helmhive.runner.jobs.jobpod.PodRun.run_checks`)."""

    async def __call__(self, specs: Sequence[CheckSpec], *, cancel: asyncio.Event) -> ChecksRun: ...


@dataclass(frozen=True, kw_only=True)
class ImplementationSteps:
    """What an implementation job adds to a successful turn: its patch and its checks' evidence."""

    patch: ComputedPatch
    checks: ChecksRun


async def run_implementation_steps(
    *,
    plan: SandboxPlan,
    spec: AgentJobSpec,
    landlock_abi: int,
    cancel: asyncio.Event,
    checks: ChecksRunner | None = None,
) -> ImplementationSteps | JobEnding:
    """Compute the patch against the exact commit, then run the checks on the patched tree (in the
    runner's sandbox, or with ``checks``)."""
    assert spec.source is not None
    try:
        patch = await asyncio.to_thread(run_patch_diff, tree=build_git_tree(plan), commit=spec.source.commit)
    except PatchError as exc:
        return JobEnding(succeeded=False, reason=exc.reason, message=exc.message[:1000])
    if patch is None:
        message = f"the agent's turn left the tree exactly as commit {spec.source.commit} (no patch)"
        return JobEnding(succeeded=False, reason=Reason.NO_CHANGES, message=message)
    if checks is not None:
        ran = await checks(spec.checks, cancel=cancel)
    else:
        ran = await run_checks(spec.checks, plan=plan, landlock_abi=landlock_abi, cancel=cancel)
    return ImplementationSteps(patch=patch, checks=ran)


def build_implementation_result(*, steps: ImplementationSteps, config_map: str) -> tuple[dict[str, Any], str]:
    """``status.result.patch`` and ``.checks`` of an implementation, and the note for its message."""
    patch = build_patch_ref(patch=steps.patch, config_map=config_map)
    evidence = steps.checks.evidence
    fields = {"patch": patch.to_wire(), "checks": [e.to_wire() for e in evidence]}
    note = (
        f"patch of {patch.files} file(s), {patch.bytes} bytes, sha256 {patch.sha256}; {build_checks_message(evidence)}"
    )
    return fields, note

"""Governed jobs on a real runner: a real git server, a test repository, and helpers to read patches back.

:class:`GovernedRig` serves repositories made with :class:`harness.gitserver.GitRepo` over a real
``git daemon`` on loopback and creates the governed AgentJobs (source, change, checks, patch) on
an :class:`~tests.runner.execution_harness.ExecutionRig`, routed to a runner as the operator
would. :func:`tree_manifest` lists a tree's files with their SHA-256 (what a check prints in
the sandbox, and what a fresh clone with the stored patch applied must match).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.gitserver import GitDaemon, GitRepo
from helmhive.api.common import JobKind

from .execution_harness import ExecutionRig, Runner

MANIFEST_CHECK = [
    "sh",
    "-c",
    "find . -type f ! -path './.pytest_cache/*' | LC_ALL=C sort | while read -r f; do sha256sum \"$f\"; done",
]
"""A check that prints ``<sha256>  ./<path>`` for every file of the tree it runs in, sorted."""

STAGES = {
    JobKind.CHANGE_PLANNING: "planning",
    JobKind.CHANGE_IMPLEMENTATION: "implementation",
    JobKind.CHANGE_REVIEW: "review",
}


def stage_prompt(kind: JobKind, *lines: str) -> str:
    """A governed request as the operator writes it (stage line first), with the test's directives."""
    return "\n".join(
        [
            f"Governed change stage: {STAGES[kind]}",
            "Change: demo   Iteration: 1",
            "",
            "## Change request",
            "Title: a governed test change",
            "Change the repository as the directives say.",
            *lines,
            "",
            "## Confirmed criteria",
            "1. The directives are applied.",
        ]
    )


def tree_manifest(root: Path) -> str:
    """What :data:`MANIFEST_CHECK` prints for ``root`` (its ``.git``, if any, left out)."""
    paths = [
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and p.relative_to(root).parts[0] != ".git"
    ]
    lines = [f"{hashlib.sha256((root / path).read_bytes()).hexdigest()}  ./{path}" for path in paths]
    return "\n".join(sorted(lines, key=lambda line: line.split("  ", 1)[1].encode())) + "\n"


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
        "GIT_ALLOW_PROTOCOL": "file:git",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, input=stdin, capture_output=True, check=False)


def fresh_clone(repo: GitRepo, commit: str, into: Path) -> Path:
    """A clone of ``repo`` at ``commit`` (its own ``.git``: the test's, not the runner's)."""
    into.mkdir(parents=True)
    assert git(into, "init", "-q", ".").returncode == 0
    fetched = git(into, "fetch", "-q", str(repo.path), commit)
    assert fetched.returncode == 0, fetched.stderr
    checkout = git(into, "checkout", "-q", "--detach", commit)
    assert checkout.returncode == 0, checkout.stderr
    return into


@dataclass
class GovernedRig:
    execution: ExecutionRig
    daemon: GitDaemon
    root: Path
    repos: dict[str, GitRepo] = field(default_factory=dict)

    def repo(self, name: str, files: Mapping[str, str | bytes | None]) -> GitRepo:
        made = GitRepo.create(root=self.root, name=name, files=files)
        self.repos[name] = made
        return made

    def source(self, repo: GitRepo | str, commit: str | None = None) -> dict[str, str]:
        if isinstance(repo, str):
            return {"repository": self.daemon.url_for(repo), "commit": commit or "0" * 40}
        return {"repository": self.daemon.url_for(repo), "commit": commit or repo.head}

    def create(
        self,
        name: str,
        *,
        runner: Runner,
        kind: JobKind,
        directives: tuple[str, ...] = (),
        source: dict[str, str] | None = None,
        checks: list[dict[str, Any]] | None = None,
        patch: dict[str, Any] | None = None,
        timeout: int = 120,
    ) -> dict[str, Any]:
        extra: dict[str, Any] = {"change": {"name": "demo", "stage": STAGES[kind], "iteration": 1}}
        if source is not None:
            extra["source"] = source
        if checks is not None:
            extra["checks"] = checks
        if patch is not None:
            extra["patch"] = patch
        return self.execution.create_job(
            name,
            runner=runner,
            kind=kind,
            prompt=stage_prompt(kind, *directives),
            profile=f"governed-{STAGES[kind]}",
            timeout=timeout,
            spec_extra=extra,
        )

    def config_map(self, name: str) -> dict[str, str]:
        found = self.execution.kube.core.read_namespaced_config_map(name, self.execution.namespace)
        return dict(found.data or {})

    def stored_patch(self, job: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """The job's ``result.patch`` and the patch text read back from its ConfigMap through the API."""
        ref: dict[str, Any] = job["status"]["result"]["patch"]
        return ref, self.config_map(ref["configMap"])[ref["key"]]


@pytest.fixture
def governed(execution: ExecutionRig, tmp_path: Path) -> Iterator[GovernedRig]:
    root = tmp_path / "git-served"
    with GitDaemon(root=root) as daemon:
        yield GovernedRig(execution=execution, daemon=daemon, root=root)

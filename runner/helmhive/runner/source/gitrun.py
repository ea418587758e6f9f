"""How the runner's source fetch runs git: an environment of its own, a deadline, redaction.

Owns :class:`Git` (the git runs of one :func:`helmhive.runner.source.fetch.ensure_source` call: the
environment for the server and the one for local copies, one deadline, the secrets to redact)
and :func:`run_git_until`, which runs one git command with exactly the environment given and kills its
whole process group at the deadline. :func:`build_fetch_failure` turns a failed fetch into a
:class:`~helmhive.runner.source.rules.SourceError` with its named reason. The rules themselves
(the environment, which reason a git error means, redaction) are pure, in
:mod:`helmhive.runner.source.rules`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from helmhive.api.reasons import Reason
from helmhive.runner.source.rules import (
    LOCAL_PROTOCOLS,
    REMOTE_PROTOCOLS,
    DeadlinePassed,
    GitCredentials,
    SourceError,
    build_git_env,
    decide_failure,
    decide_sends_credentials,
    describe_git_error,
)

__all__ = ["Git", "GitResult", "build_fetch_failure", "run_git_until"]


@dataclass(frozen=True)
class GitResult:
    code: int
    stdout: str
    stderr: str


def run_git_until(
    args: Sequence[str], *, env: Mapping[str, str], deadline: float, cwd: Path | None = None
) -> GitResult:
    """Run git with exactly ``env``; kill its whole process group at ``deadline``.

    Not gitpython's ``Git.execute``: it merges the runner's entire environment into git's, and
    a stray ``GIT_*`` variable there (a trace, a proxy command, an askpass) must not reach a
    fetch that carries a credential. The process group matters: ``git fetch`` over http runs
    ``git-remote-http`` as a child that would otherwise outlive a timeout.
    """
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise DeadlinePassed()
    with subprocess.Popen(
        ["git", *args],
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise DeadlinePassed() from None
    return GitResult(process.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


class Git:
    """git runs for one :func:`~helmhive.runner.source.fetch.ensure_source` call: environment, deadline, redaction."""

    def __init__(
        self, *, home: Path, credentials: GitCredentials | None, repository: str, deadline: float, timeout_s: float
    ) -> None:
        path = os.environ.get("PATH", os.defpath)
        authorization = credentials.authorization() if credentials and decide_sends_credentials(repository) else None
        self.remote_env = build_git_env(home=home, path=path, config=REMOTE_PROTOCOLS, authorization=authorization)
        self.local_env = build_git_env(home=home, path=path, config=LOCAL_PROTOCOLS)
        self.secrets = credentials.secrets() if credentials is not None else []
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.repository = repository

    def local(self, *args: str) -> GitResult:
        return self._run(args, self.local_env)

    def remote(self, *args: str) -> GitResult:
        return self._run(args, self.remote_env)

    def _run(self, args: Sequence[str], env: Mapping[str, str]) -> GitResult:
        try:
            return run_git_until(args, env=env, deadline=self.deadline)
        except DeadlinePassed:
            raise SourceError(
                Reason.SOURCE_UNAVAILABLE,
                f"fetching {self.repository} did not finish within {self.timeout_s:g} s",
            ) from None

    def check(self, result: GitResult, what: str) -> GitResult:
        """``result`` if git succeeded; else a SourceError (SourceUnavailable) saying ``what`` failed."""
        if result.code == 0:
            return result
        raise SourceError(Reason.SOURCE_UNAVAILABLE, f"{what} failed: {self.said(result.stderr)}")

    def said(self, stderr: str) -> str:
        return describe_git_error(stderr, self.secrets) or "git printed nothing"


def build_fetch_failure(git: Git, result: GitResult, commit: str) -> SourceError:
    """The error of a failed fetch: its named reason (:func:`decide_failure`) and what git said, redacted."""
    reason = decide_failure(result.stderr)
    said = git.said(result.stderr)
    repo = git.repository
    messages = {
        Reason.SOURCE_AUTH_FAILED: (
            f"{repo} refused the git credentials: {said}"
            if git.secrets
            else f"{repo} needs credentials and this runner has none (RunnerPool spec.source.credentialsSecret): {said}"
        ),
        Reason.REPOSITORY_NOT_FOUND: f"repository {repo} was not found: {said}",
        Reason.COMMIT_NOT_FOUND: f"commit {commit} was not found in {repo}: {said}",
        Reason.SOURCE_UNAVAILABLE: f"{repo} could not be fetched: {said}",
    }
    if reason is Reason.SOURCE_AUTH_FAILED and git.secrets and not decide_sends_credentials(repo):
        messages[reason] = f"{repo} needs credentials, and they are sent only over https: {said}"
    return SourceError(reason, messages.get(reason, f"{repo}: {said}"))

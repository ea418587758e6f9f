"""The exact source of a governed change: one commit, fetched by the runner before the agent starts.

:func:`ensure_source` puts exactly ``commit`` of ``repository`` into a job's work tree, outside
the sandbox and before the agent runs (``docs/source.md``):

1. **Cache.** Each runner keeps an object cache under ``cache_dir``: one bare repository per
   repository URL and object format, named by a hash of them (``<hash>.git``). A fetched commit
   is kept under ``refs/helmhive/<commit>``; a later job at that commit is served from the cache
   without contacting the server.
2. **Fetch.** ``git fetch --depth=1 <url> <commit>``: that commit and its tree, nothing else.
   A server that refuses a want by id (protocol v0 without ``uploadpack.allow*SHA1InWant``), or
   shallow fetches, gets one full fetch of its branches and tags instead; the commit must then
   be there.
3. **Materialise.** A fresh git dir outside the work tree takes that one commit from the cache
   (a local shallow fetch: its own objects, so evicting the cache later cannot break a running
   job); the work tree is checked out from it, detached, and ``HEAD`` must equal ``commit``.
4. **Bound.** After a fetch, least-recently-used repositories are evicted while the cache is
   over ``max_cache_bytes``; never the one in use, nor one another job holds at that moment.

Errors: everything that goes wrong with the source is a :class:`SourceError` whose ``reason``
is a fixed :class:`~helmhive.api.reasons.Reason`::

    SourceError
      reason RepositoryNotFound   the server has no such repository (404, "not exported")
             CommitNotFound       the repository has no such commit (or other object format)
             SourceUnavailable    server down, unreachable, timed out, cache busy
             SourceAuthFailed     401/403, or the credentials Secret is unusable
             SourceMismatch       HEAD is not the requested commit after checkout
             InvalidSpec          an unsupported or credential-bearing URL, a malformed commit

Safety. git runs with an environment built here, not inherited: no system or global config,
``HOME`` an empty directory (so no ``.netrc``), no terminal prompt, no credential helper or
askpass, no hooks, only the ``https``/``http``/``git`` transports for the server (``file`` only
for the local copy from the cache), objects checked with ``transfer.fsckObjects``, no
submodules. Git credentials go only into that environment (``GIT_CONFIG_*`` -> an
``http.extraHeader``): never into a URL, argv, a git config file or the work tree, and only
over https (or plain http to a loopback address). Whatever git says is redacted before it
reaches a message or a log.

Pure helpers (``build_*`` / ``decide_*``) are in :mod:`helmhive.runner.source.rules`; how git is
run, in :mod:`helmhive.runner.source.gitrun`; the cache's lock, size and eviction, in
:mod:`helmhive.runner.source.cache`. :func:`ensure_source` does the I/O (synchronous: callers run
it in a thread).
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from helmhive.api.reasons import Reason
from helmhive.runner.logs import fields
from helmhive.runner.source.cache import USED_MARKER, evict, locked, tree_size
from helmhive.runner.source.gitrun import Git, build_fetch_failure
from helmhive.runner.source.rules import (
    DEFAULT_MAX_CACHE_BYTES,
    REFUSES_SHALLOW_BY_ID,
    SOURCE_REF,
    CacheEntry,
    DeadlinePassed,
    GitCredentials,
    SourceCheckout,
    SourceError,
    build_cache_key,
    build_git_env,
    decide_evictions,
    decide_failure,
    decide_object_format,
    decide_repository_problem,
)

__all__ = [
    "DEFAULT_MAX_CACHE_BYTES",
    "SOURCE_REF",
    "CacheEntry",
    "GitCredentials",
    "SourceCheckout",
    "SourceError",
    "build_cache_key",
    "build_git_env",
    "decide_evictions",
    "decide_failure",
    "decide_repository_problem",
    "ensure_source",
]

log = logging.getLogger("helmhive.runner.source.fetch")

_CACHE_REF = "refs/helmhive/"
_URL_MARKER = "helmhive-repository"


def _has_commit(git: Git, cache: Path, commit: str) -> bool:
    return git.local(f"--git-dir={cache}", "cat-file", "-e", f"{commit}^{{commit}}").code == 0


def _cached(git: Git, cache: Path, commit: str) -> bool:
    """Whether the cache holds ``commit`` whole: under its own ref, or on a branch of an earlier full fetch.

    A bare object is not enough: only what a ref reaches passed git's connectivity check.
    """
    ref = f"{_CACHE_REF}{commit}"
    if git.local(f"--git-dir={cache}", "rev-parse", "--verify", "--quiet", ref).code == 0:
        return True
    if not _has_commit(git, cache, commit):
        return False
    upstream = git.local(
        f"--git-dir={cache}", "for-each-ref", "--count=1", "--format=%(refname)", "--contains", commit, "refs/upstream/"
    )
    if upstream.code != 0 or not upstream.stdout.strip():
        return False
    git.check(git.local(f"--git-dir={cache}", "update-ref", ref, commit), "recording the commit in the cache")
    return True


def _fetch(git: Git, *, cache: Path, commit: str) -> None:
    """Fetch ``commit`` into the cache (shallow by id, else everything) and keep it under a ref."""
    common = ("fetch", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head", "--no-auto-gc")
    ref = f"{_CACHE_REF}{commit}"
    shallow = git.remote(
        f"--git-dir={cache}", *common, "--depth=1", "--end-of-options", git.repository, f"+{commit}:{ref}"
    )
    if shallow.code == 0:
        return
    if not any(needle in shallow.stderr.lower() for needle in REFUSES_SHALLOW_BY_ID):
        raise build_fetch_failure(git, shallow, commit)
    log.info(
        "source: the server refuses a shallow fetch by id; fetching all branches and tags",
        extra=fields(repository=git.repository, commit=commit),
    )
    full = git.remote(
        f"--git-dir={cache}",
        *common,
        "--end-of-options",
        git.repository,
        "+refs/heads/*:refs/upstream/heads/*",
        "+refs/tags/*:refs/upstream/tags/*",
    )
    if full.code != 0:
        raise build_fetch_failure(git, full, commit)
    if not _has_commit(git, cache, commit):
        raise SourceError(
            Reason.COMMIT_NOT_FOUND,
            f"commit {commit} is not on any branch or tag of {git.repository} (fetched in full)",
        )
    git.check(git.local(f"--git-dir={cache}", "update-ref", ref, commit), "recording the commit in the cache")


def _materialise(git: Git, *, cache: Path, commit: str, object_format: str, git_dir: Path, work_tree: Path) -> None:
    """A fresh git dir holding only ``commit`` (from the cache), and the work tree checked out at it.

    The work tree has no ``.git``: the git dir lives elsewhere, out of the agent's reach, so the
    agent can neither rewrite history nor misreport its changes -- the runner later diffs the
    work tree against this commit with ``git --git-dir=<git_dir> --work-tree=<work_tree>``.
    """
    init = git.local("init", "--quiet", "--bare", "--template=", f"--object-format={object_format}", str(git_dir))
    git.check(init, f"creating the git dir ({object_format})")
    git.check(git.local(f"--git-dir={git_dir}", "config", "core.bare", "false"), "configuring the git dir")
    copy = git.local(
        f"--git-dir={git_dir}",
        "fetch",
        "--no-tags",
        "--no-recurse-submodules",
        "--no-write-fetch-head",
        "--no-auto-gc",
        "--depth=1",
        "--end-of-options",
        cache.resolve().as_uri(),
        f"+{_CACHE_REF}{commit}:{SOURCE_REF}",
    )
    git.check(copy, "copying the commit from the cache")
    work_tree.mkdir(parents=True, exist_ok=True)
    tree = (f"--git-dir={git_dir}", f"--work-tree={work_tree}")
    git.check(git.local(*tree, "checkout", "--quiet", "--force", "--detach", SOURCE_REF), "checking out the commit")
    head = git.local(f"--git-dir={git_dir}", "rev-parse", "--verify", "HEAD^{commit}")
    if head.code != 0 or head.stdout.strip() != commit:
        got = head.stdout.strip() or "nothing"
        raise SourceError(Reason.SOURCE_MISMATCH, f"the work tree's HEAD is {got}, not the requested {commit}")


def _check_paths(git_dir: Path, work_tree: Path) -> None:
    g, w = git_dir.resolve(), work_tree.resolve()
    if g == w or g.is_relative_to(w) or w.is_relative_to(g):
        raise ValueError(f"git_dir {git_dir} and work_tree {work_tree} must be separate, neither inside the other")
    if git_dir.exists() and any(git_dir.iterdir()):
        raise ValueError(f"git_dir {git_dir} must be absent or empty")
    if work_tree.exists() and any(work_tree.iterdir()):
        raise ValueError(f"work_tree {work_tree} must be absent or empty")


def ensure_source(
    *,
    cache_dir: Path,
    repository: str,
    commit: str,
    git_dir: Path,
    work_tree: Path,
    credentials: GitCredentials | None,
    timeout_s: float = 300.0,
    max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES,
) -> SourceCheckout:
    """Check out exactly ``commit`` of ``repository`` into ``work_tree``, its git dir at ``git_dir``.

    Served from the runner's cache under ``cache_dir`` when that commit was fetched before (no
    server contact); otherwise fetched shallow (or in full from a server that cannot do that),
    then the cache is bounded to ``max_cache_bytes``. ``timeout_s`` bounds the whole call,
    waiting for the cache included. ``git_dir`` and ``work_tree`` must be absent or empty and
    separate (else ValueError). Raises :class:`SourceError` with a named reason otherwise.
    """
    problem = decide_repository_problem(repository)
    if problem is not None:
        raise SourceError(Reason.INVALID_SPEC, problem)
    object_format = decide_object_format(commit)
    if object_format is None:
        raise SourceError(Reason.INVALID_SPEC, "the commit must be a full 40- or 64-hex lowercase object id")
    _check_paths(git_dir, work_tree)
    started = time.monotonic()
    deadline = started + timeout_s
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = build_cache_key(repository, object_format)
    cache = cache_dir / key
    context = {"repository": repository, "commit": commit, "cache_key": key}
    # An empty HOME for git (no .netrc, no config), inside the cache the agent cannot reach.
    with tempfile.TemporaryDirectory(prefix=".home-", dir=cache_dir) as home:
        git = Git(
            home=Path(home), credentials=credentials, repository=repository, deadline=deadline, timeout_s=timeout_s
        )
        try:
            with locked(cache_dir / f"{key}.lock", deadline=deadline):
                if not (cache / "HEAD").exists():
                    created = git.local(
                        "init", "--quiet", "--bare", "--template=", f"--object-format={object_format}", str(cache)
                    )
                    git.check(created, f"creating the source cache ({object_format})")
                    (cache / _URL_MARKER).write_text(repository + "\n")
                fetched: int | None = None
                if _cached(git, cache, commit):
                    log.info("source: served from the runner's cache", extra=fields(**context))
                else:
                    log.info("source: fetching", extra=fields(**context))
                    before = tree_size(cache / "objects")
                    _fetch(git, cache=cache, commit=commit)
                    fetched = max(0, tree_size(cache / "objects") - before)
                (cache / USED_MARKER).touch()  # its mtime is the last use, for eviction
                _materialise(
                    git, cache=cache, commit=commit, object_format=object_format, git_dir=git_dir, work_tree=work_tree
                )
        except DeadlinePassed:
            raise SourceError(
                Reason.SOURCE_UNAVAILABLE,
                f"the runner's source cache for {repository} stayed busy for {timeout_s:g} s",
            ) from None
        except SourceError as err:
            log.warning("source: failed", extra=fields(**context, reason=err.reason.value, error=err.message))
            raise
    if fetched is not None:
        evict(cache_dir, max_bytes=max_cache_bytes, keep=key)
    seconds = round(time.monotonic() - started, 3)
    log.info(
        "source: checked out",
        extra=fields(**context, fetched=fetched is not None, bytes_fetched=fetched, seconds=seconds),
    )
    return SourceCheckout(
        git_dir=git_dir, work_tree=work_tree, commit=commit, fetched=fetched is not None, bytes_fetched=fetched
    )

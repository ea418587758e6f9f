"""The pure rules of fetching a governed change's exact source: what is refused, how git is run, what failed.

Everything here is a function of its arguments (no I/O, no clock): whether a repository URL is
acceptable (:func:`decide_repository_problem`), the environment git runs with
(:func:`build_git_env`), which named reason a git error means (:func:`decide_failure`), which
cache entries to evict (:func:`decide_evictions`), and redaction of whatever git says.
:mod:`helmhive.runner.source.fetch` does the fetching with them; ``docs/source.md`` explains both.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr

from helmhive.api.governed import COMMIT_PATTERN
from helmhive.api.reasons import Reason
from helmhive.runner.adapters.decisions import redact

__all__ = [
    "DEFAULT_MAX_CACHE_BYTES",
    "LOCAL_PROTOCOLS",
    "MAX_CREDENTIAL_CHARS",
    "MAX_GIT_MESSAGE",
    "REFUSES_SHALLOW_BY_ID",
    "REMOTE_PROTOCOLS",
    "SCHEMES",
    "SOURCE_REF",
    "CacheEntry",
    "DeadlinePassed",
    "GitCredentials",
    "SourceCheckout",
    "SourceError",
    "build_cache_key",
    "build_git_env",
    "decide_evictions",
    "decide_failure",
    "decide_object_format",
    "decide_repository_problem",
    "decide_sends_credentials",
    "describe_git_error",
]

DEFAULT_MAX_CACHE_BYTES = 2 * 1024**3
SCHEMES = ("https", "http", "git")
MAX_CREDENTIAL_CHARS = 4096
MAX_GIT_MESSAGE = 600
SOURCE_REF = "refs/helmhive/source"
"""In the job's git dir: the commit that was checked out (the runner diffs against it)."""

# Applied to every git run (through GIT_CONFIG_*, never argv): nothing user-configured, nothing
# interactive, nothing that executes a program named by a repository or the environment.
_SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("credential.helper", ""),
    ("core.askPass", ""),
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("core.autocrlf", "false"),
    ("core.symlinks", "true"),
    ("protocol.version", "2"),
    ("transfer.fsckObjects", "true"),
    ("fetch.recurseSubmodules", "false"),
    ("submodule.recurse", "false"),
    ("fetch.unpackLimit", "1"),  # keep packs: a fetch cut short leaves nothing half-written
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("advice.detachedHead", "false"),
)
# Which transports git may use. The repository URL comes from a Change, so a local path or
# file:// (the runner's own files) and ext:: (a command) must never be fetched from.
REMOTE_PROTOCOLS = (("protocol.allow", "never"), *((f"protocol.{s}.allow", "always") for s in SCHEMES))
LOCAL_PROTOCOLS = (("protocol.allow", "never"), ("protocol.file.allow", "always"))

# What git prints for each failure (LANG=C). Checked in this order; the first match wins.
_FAILURES: tuple[tuple[Reason, tuple[str, ...]], ...] = (
    (
        Reason.SOURCE_AUTH_FAILED,
        (
            "could not read username",
            "could not read password",
            "authentication failed",
            "returned error: 401",
            "returned error: 403",
        ),
    ),
    (
        Reason.REPOSITORY_NOT_FOUND,
        (
            "returned error: 404",
            "' not found",
            "does not appear to be a git repository",
            "repository not exported",
            "no such repository",
            "repository not found",
        ),
    ),
    (
        Reason.COMMIT_NOT_FOUND,
        (
            "not our ref",
            "couldn't find remote ref",
            "no such remote ref",
            "mismatched algorithms",
            "unadvertised object",
        ),
    ),
)
# A server that cannot serve one commit by id, or shallow: fetch everything instead.
REFUSES_SHALLOW_BY_ID = (
    "does not allow request for unadvertised object",
    "does not support shallow",
    "dumb http transport does not support shallow",
)


class DeadlinePassed(Exception):
    """A fetch's deadline passed: git still running, or the cache's lock still held by another job.
    :func:`~helmhive.runner.source.fetch.ensure_source` turns it into a ``SourceUnavailable`` error."""


class SourceError(Exception):
    """The source could not be provided; ``reason`` is fixed, ``message`` never holds a credential."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True, kw_only=True)
class GitCredentials:
    """A username and password (or token) for a private repository over HTTPS (Basic auth)."""

    username: str
    password: SecretStr

    def __post_init__(self) -> None:
        problem = _credential_problem(self.username, self.password.get_secret_value())
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def from_dir(cls, path: Path) -> GitCredentials | None:
        """Read ``username`` and ``password`` from a mounted Secret; None if ``path`` is not a directory.

        A present directory without both keys, or with unusable values, is a
        :class:`SourceError` (``SourceAuthFailed``) naming the key, never showing a value.
        """
        if not path.is_dir():
            return None
        values: dict[str, str] = {}
        for key in ("username", "password"):
            try:
                raw = (path / key).read_bytes()[: MAX_CREDENTIAL_CHARS + 2]
            except OSError as exc:
                raise SourceError(
                    Reason.SOURCE_AUTH_FAILED,
                    f"the git credentials Secret mounted at {path} has no readable key {key!r} "
                    f"({exc.strerror or type(exc).__name__})",
                ) from None
            # Secrets made with `echo` end with a newline; nothing else is trimmed from a password.
            values[key] = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        problem = _credential_problem(values["username"].strip(), values["password"])
        if problem is not None:
            raise SourceError(Reason.SOURCE_AUTH_FAILED, f"the git credentials Secret mounted at {path}: {problem}")
        return cls(username=values["username"].strip(), password=SecretStr(values["password"]))

    def authorization(self) -> str:
        """The ``Authorization`` header value (secret: only for git's environment)."""
        pair = f"{self.username}:{self.password.get_secret_value()}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")

    def secrets(self) -> list[str]:
        """Every form in which this credential could show up in git's output."""
        password = self.password.get_secret_value()
        return [password, self.authorization(), self.authorization().removeprefix("Basic "), _b64(password)]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def _credential_problem(username: str, password: str) -> str | None:
    if not username:
        return "the key 'username' is empty"
    if not password:
        return "the key 'password' is empty"
    if ":" in username:
        return "the username may not contain ':' (Basic auth)"
    if len(username) > MAX_CREDENTIAL_CHARS or len(password) > MAX_CREDENTIAL_CHARS:
        return f"username and password are limited to {MAX_CREDENTIAL_CHARS} characters"
    # A control character would split the header git sends (header injection).
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in username + password):
        return "username and password may not contain control characters or line breaks"
    return None


@dataclass(frozen=True, kw_only=True)
class SourceCheckout:
    """Where the source is: a git dir outside the work tree, and the work tree at ``commit``."""

    git_dir: Path
    work_tree: Path
    commit: str
    fetched: bool
    """False when served from this runner's cache without contacting the server."""
    bytes_fetched: int | None
    """Bytes the fetch added to the cache (the packs received); None when nothing was fetched."""


@dataclass(frozen=True, kw_only=True)
class CacheEntry:
    """One cached repository: its key (directory name), size on disk and last use (epoch seconds)."""

    key: str
    size: int
    last_used: float


# --- pure -------------------------------------------------------------------------------------


def decide_repository_problem(repository: str) -> str | None:
    """Why ``repository`` cannot be fetched from, or None. Never repeats a credential it carries."""
    if len(repository) > 2048:
        return "the repository URL is longer than 2048 characters"
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in repository):
        return "the repository URL contains whitespace or control characters"
    try:
        parts = urlsplit(repository)
        _ = parts.port
    except ValueError:
        return "the repository URL is not a valid URL"
    if parts.scheme not in SCHEMES:
        shown = parts.scheme or "a local path"
        return f"unsupported repository URL scheme {shown!r}: use {', '.join(SCHEMES)}"
    if "@" in parts.netloc:
        return (
            "the repository URL carries credentials: remove them and name a git credentials Secret "
            "in the RunnerPool (spec.source.credentialsSecret)"
        )
    if not parts.hostname:
        return "the repository URL has no host"
    if parts.query or parts.fragment or repository.endswith(("?", "#")):
        return "the repository URL may not have a query or fragment"
    return None


def build_cache_key(repository: str, object_format: str) -> str:
    """The cache directory's name for a repository URL and object format (a hash, no URL text)."""
    digest = hashlib.sha256(f"{object_format}\0{repository}".encode()).hexdigest()[:32]
    return f"{digest}.git"


def decide_object_format(commit: str) -> str | None:
    if not re.fullmatch(COMMIT_PATTERN, commit):
        return None
    return "sha1" if len(commit) == 40 else "sha256"


def decide_sends_credentials(repository: str) -> bool:
    """Credentials go over https, or plain http to a loopback address; never to git:// or other http."""
    parts = urlsplit(repository)
    if parts.scheme == "https":
        return True
    if parts.scheme != "http" or parts.hostname is None:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


def build_git_env(
    *, home: Path, path: str, config: Sequence[tuple[str, str]] = (), authorization: str | None = None
) -> dict[str, str]:
    """git's whole environment: nothing inherited but ``PATH``; ``config`` and the safe defaults
    through ``GIT_CONFIG_*``; ``authorization`` (a header value) as an ``http.extraHeader``."""
    entries = [*_SAFE_CONFIG, *config]
    if authorization is not None:
        # Redirects would carry the header to another host; with credentials, none are followed.
        entries += [("http.followRedirects", "false"), ("http.extraHeader", f"Authorization: {authorization}")]
    env = {
        "PATH": path,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home),
        "LANG": "C",
        "LC_ALL": "C",
        "LANGUAGE": "C",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_CONFIG_COUNT": str(len(entries)),
    }
    for index, (key, value) in enumerate(entries):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


def decide_failure(stderr: str) -> Reason:
    """The reason for a failed fetch from what git printed (LANG=C); unknown failures are unavailability."""
    text = stderr.lower()
    for reason, needles in _FAILURES:
        if any(needle in text for needle in needles):
            return reason
    return Reason.SOURCE_UNAVAILABLE


def decide_evictions(entries: Sequence[CacheEntry], *, max_bytes: int, keep: str) -> list[str]:
    """The keys to evict, least recently used first, until the total fits ``max_bytes``; never ``keep``."""
    total = sum(entry.size for entry in entries)
    evicted: list[str] = []
    for entry in sorted(entries, key=lambda e: (e.last_used, e.key)):
        if total <= max_bytes:
            break
        if entry.key == keep:
            continue
        evicted.append(entry.key)
        total -= entry.size
    return evicted


_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_BASIC = re.compile(r"(?i)(basic|bearer)\s+[A-Za-z0-9+/=._~-]+")


def _redacted(text: str, secrets: Sequence[str]) -> str:
    text = redact(text, secrets)
    text = _USERINFO.sub(r"\1", text)
    return _BASIC.sub(r"\1 [REDACTED]", text)


def describe_git_error(stderr: str, secrets: Sequence[str]) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    text = _redacted(" / ".join(lines), secrets)
    return text if len(text) <= MAX_GIT_MESSAGE else "..." + text[-MAX_GIT_MESSAGE:]


# --- I/O --------------------------------------------------------------------------------------

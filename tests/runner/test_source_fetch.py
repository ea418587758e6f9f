"""The runner fetches exactly one commit (``helmhive.runner.source.fetch``), against real git servers.

Every fetch here goes over loopback to ``git daemon`` or to ``git http-backend`` behind a small
HTTP server with Basic auth (``harness.gitserver``), started by the test. The pure helpers are
covered by tables at the end.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from pydantic import SecretStr

from harness.gitserver import GitDaemon, GitHttpServer, GitRepo, SilentServer
from helmhive.api.reasons import Reason
from helmhive.runner.source.fetch import (
    CacheEntry,
    GitCredentials,
    SourceCheckout,
    SourceError,
    build_cache_key,
    build_git_env,
    decide_evictions,
    decide_failure,
    decide_repository_problem,
    ensure_source,
)

USERNAME = "helmhive-bot"
CANARY = "canary-Pw-7f3c9e1d-do-not-leak"
BINARY = bytes(range(256)) * 8 + b"\x00\xff\x00 not text \r\n\r\n"
FIRST_FILES: dict[str, str | bytes | None] = {
    "README.md": "# demo\n",
    "src/app.py": "print('v1')\n",
    "assets/logo.bin": BINARY,
}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


CANARY_FORMS = (CANARY, _b64(CANARY), _b64(f"{USERNAME}:{CANARY}"))


@pytest.fixture
def served(tmp_path: Path) -> Path:
    path = tmp_path / "served"
    path.mkdir()
    return path


@pytest.fixture
def repo(served: Path) -> GitRepo:
    """Two commits: the first has a text file, a nested file and a binary file; the second changes one."""
    made = GitRepo.create(root=served, name="demo", files=FIRST_FILES)
    made.commit({"src/app.py": "print('v2')\n", "NEW.txt": "only in the second commit\n"}, message="second")
    return made


@pytest.fixture
def daemon(served: Path) -> Iterator[GitDaemon]:
    with GitDaemon(root=served) as server:
        yield server


@pytest.fixture
def http(served: Path) -> Iterator[GitHttpServer]:
    with GitHttpServer(root=served) as server:
        yield server


@pytest.fixture
def auth_http(served: Path) -> Iterator[GitHttpServer]:
    with GitHttpServer(root=served, username=USERNAME, password=CANARY) as server:
        yield server


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "runner-state" / "source-cache"


class Jobs:
    """Each call is one job: its own git dir and work tree, the runner's one cache."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.root = root
        self.cache = cache
        self.count = 0

    def dirs(self) -> tuple[Path, Path]:
        self.count += 1
        job = self.root / f"job-{self.count}"
        return job / "git", job / "work"

    def fetch(self, url: str, commit: str, **kwargs: Any) -> SourceCheckout:
        git_dir, work_tree = self.dirs()
        settings: dict[str, Any] = {"credentials": None, "timeout_s": 120.0, **kwargs}
        return ensure_source(
            cache_dir=self.cache, repository=url, commit=commit, git_dir=git_dir, work_tree=work_tree, **settings
        )

    def fails(self, url: str, commit: str, **kwargs: Any) -> SourceError:
        with pytest.raises(SourceError) as caught:
            self.fetch(url, commit, **kwargs)
        return caught.value


@pytest.fixture
def jobs(tmp_path: Path, cache: Path) -> Jobs:
    return Jobs(tmp_path / "jobs", cache)


def tree_files(work_tree: Path) -> dict[str, bytes]:
    found = {}
    for directory, _, names in os.walk(work_tree):
        for name in names:
            path = Path(directory) / name
            found[str(path.relative_to(work_tree))] = path.read_bytes()
    return found


def git(*args: str) -> str:
    env = {"PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}
    out = subprocess.run(["git", *args], env=env, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


def expected_first() -> dict[str, bytes]:
    return {k: v.encode() if isinstance(v, str) else v for k, v in FIRST_FILES.items() if v is not None}


def assert_exact_checkout(checkout: SourceCheckout, commit: str, files: dict[str, bytes]) -> None:
    assert checkout.commit == commit
    assert tree_files(checkout.work_tree) == files
    # No .git in the work tree: the agent cannot reach history or the index.
    assert not (checkout.work_tree / ".git").exists()
    assert not checkout.git_dir.is_relative_to(checkout.work_tree)
    assert git(f"--git-dir={checkout.git_dir}", "rev-parse", "HEAD") == commit
    status = git(f"--git-dir={checkout.git_dir}", f"--work-tree={checkout.work_tree}", "status", "--porcelain")
    assert status == ""


# --- happy paths -------------------------------------------------------------------------------


def test_fetches_exactly_one_commit_over_git_daemon(jobs: Jobs, repo: GitRepo, daemon: GitDaemon) -> None:
    first, second = repo.commits
    checkout = jobs.fetch(daemon.url_for(repo), first)
    assert_exact_checkout(checkout, first, expected_first())
    assert checkout.fetched is True
    assert checkout.bytes_fetched is not None and checkout.bytes_fetched > len(BINARY) // 8
    # Only what was needed: the job's git dir holds that one commit, the cache lacks the newer one.
    assert git(f"--git-dir={checkout.git_dir}", "rev-list", "--count", "HEAD") == "1"
    cache_repo = jobs.cache / build_cache_key(daemon.url_for(repo), "sha1")
    missing = subprocess.run(
        ["git", f"--git-dir={cache_repo}", "cat-file", "-e", second], capture_output=True, check=False
    )
    assert missing.returncode != 0


def test_fetches_a_binary_file_byte_for_byte_over_http(jobs: Jobs, repo: GitRepo, http: GitHttpServer) -> None:
    checkout = jobs.fetch(http.url_for(repo), repo.head)
    files = tree_files(checkout.work_tree)
    assert files["assets/logo.bin"] == BINARY
    assert files["src/app.py"] == b"print('v2')\n"
    assert files["NEW.txt"] == b"only in the second commit\n"


def test_fetches_over_http_with_basic_auth(jobs: Jobs, repo: GitRepo, auth_http: GitHttpServer) -> None:
    credentials = GitCredentials(username=USERNAME, password=SecretStr(CANARY))
    checkout = jobs.fetch(auth_http.url_for(repo), repo.commits[0], credentials=credentials)
    assert_exact_checkout(checkout, repo.commits[0], expected_first())
    assert auth_http.requests, "the server saw no request"
    assert all(request.authorized for request in auth_http.requests)


def test_a_server_that_refuses_wants_by_id_gets_a_full_fetch(jobs: Jobs, served: Path) -> None:
    repo = GitRepo.create(root=served, name="strict", files=FIRST_FILES, allow_sha_wants=False)
    repo.commit({"later.txt": "x\n"})
    with GitHttpServer(root=served, legacy_protocol=True) as server:
        checkout = jobs.fetch(server.url_for(repo), repo.commits[0])
        assert_exact_checkout(checkout, repo.commits[0], expected_first())
        # A full fetch: the whole history came along, and the cache now serves both commits.
        assert jobs.fetch(server.url_for(repo), repo.commits[1]).fetched is False
        missing = jobs.fails(server.url_for(repo), "0" * 40)
    assert missing.reason is Reason.COMMIT_NOT_FOUND
    assert "fetched in full" in missing.message


def test_sha256_repositories_are_fetched_by_their_64_hex_ids(jobs: Jobs, served: Path, daemon: GitDaemon) -> None:
    repo = GitRepo.create(root=served, name="modern", files=FIRST_FILES, object_format="sha256")
    assert len(repo.head) == 64
    checkout = jobs.fetch(daemon.url_for(repo), repo.head)
    assert_exact_checkout(checkout, repo.head, expected_first())
    assert git(f"--git-dir={checkout.git_dir}", "rev-parse", "--show-object-format") == "sha256"


def test_a_64_hex_id_in_a_sha1_repository_is_commit_not_found(jobs: Jobs, repo: GitRepo, daemon: GitDaemon) -> None:
    error = jobs.fails(daemon.url_for(repo), "a" * 64)
    assert error.reason is Reason.COMMIT_NOT_FOUND


def test_the_runners_environment_does_not_reach_git(
    jobs: Jobs, repo: GitRepo, daemon: GitDaemon, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Inherited, any of these would break or redirect the fetch.
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'url.git://127.0.0.1:1/.insteadof'='git://'")
    monkeypatch.setenv("GIT_TRACE", "1")
    checkout = jobs.fetch(daemon.url_for(repo), repo.commits[0])
    assert_exact_checkout(checkout, repo.commits[0], expected_first())


# --- the cache ---------------------------------------------------------------------------------


def test_a_second_job_at_the_same_commit_does_not_contact_the_server(
    jobs: Jobs, repo: GitRepo, daemon: GitDaemon
) -> None:
    url = daemon.url_for(repo)
    first = jobs.fetch(url, repo.commits[0])
    daemon.stop()
    second = jobs.fetch(url, repo.commits[0])
    assert (second.fetched, second.bytes_fetched) == (False, None)
    assert second.git_dir != first.git_dir
    assert_exact_checkout(second, repo.commits[0], expected_first())
    # The server really is gone: another commit cannot be had.
    assert jobs.fails(url, repo.commits[1]).reason is Reason.SOURCE_UNAVAILABLE


def test_concurrent_jobs_at_one_commit_fetch_it_once(jobs: Jobs, repo: GitRepo, http: GitHttpServer) -> None:
    url = http.url_for(repo)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: jobs.fetch(url, repo.head), range(2)))
    assert sorted(result.fetched for result in results) == [False, True]
    assert tree_files(results[0].work_tree) == tree_files(results[1].work_tree)


def cache_sizes(cache: Path) -> dict[str, int]:
    return {
        repo.name: sum(p.stat().st_size for p in repo.rglob("*") if p.is_file() and not p.is_symlink())
        for repo in cache.glob("*.git")
    }


def test_the_cache_is_bounded_least_recently_used_first(jobs: Jobs, served: Path, daemon: GitDaemon) -> None:
    # Incompressible content of one size, so each cached repository is about as large as the others.
    repos = [
        GitRepo.create(root=served, name=name, files={"blob.bin": os.urandom(64 * 1024)}) for name in ("a", "b", "c")
    ]
    key = {r.name: build_cache_key(daemon.url_for(r), "sha1") for r in repos}
    a, b, c = repos
    jobs.fetch(daemon.url_for(a), a.head)
    jobs.fetch(daemon.url_for(b), b.head)
    assert jobs.fetch(daemon.url_for(a), a.head).fetched is False  # a is now the more recently used
    sizes = cache_sizes(jobs.cache)
    bound = sizes[key["a"]] + sizes[key["b"]] + 4096  # room for two
    jobs.fetch(daemon.url_for(c), c.head, max_cache_bytes=bound)
    assert set(cache_sizes(jobs.cache)) == {key["a"], key["c"]}
    assert sum(cache_sizes(jobs.cache).values()) <= bound
    # The repository in use stays even when it alone is over the bound; the rest go.
    checkout = jobs.fetch(daemon.url_for(b), b.head, max_cache_bytes=1)
    assert checkout.fetched is True
    assert set(cache_sizes(jobs.cache)) == {key["b"]}
    # An evicted repository is simply fetched again.
    assert jobs.fetch(daemon.url_for(a), a.head).fetched is True


def test_a_tampered_cache_is_a_source_mismatch(jobs: Jobs, repo: GitRepo, daemon: GitDaemon) -> None:
    first, second = repo.commits
    jobs.fetch(daemon.url_for(repo), first)
    jobs.fetch(daemon.url_for(repo), second)
    cache_repo = jobs.cache / build_cache_key(daemon.url_for(repo), "sha1")
    git(f"--git-dir={cache_repo}", "update-ref", f"refs/helmhive/{first}", second)
    error = jobs.fails(daemon.url_for(repo), first)
    assert error.reason is Reason.SOURCE_MISMATCH
    assert second in error.message and first in error.message


# --- each failure has its own reason -------------------------------------------------------------


@pytest.fixture(params=["daemon", "http"])
def server(request: pytest.FixtureRequest, served: Path) -> Iterator[GitDaemon | GitHttpServer]:
    made: GitDaemon | GitHttpServer = (
        GitDaemon(root=served) if request.param == "daemon" else GitHttpServer(root=served)
    )
    with made:
        yield made


def test_a_repository_that_does_not_exist(jobs: Jobs, repo: GitRepo, server: GitDaemon | GitHttpServer) -> None:
    error = jobs.fails(server.url_for("no-such-repo"), repo.head)
    assert error.reason is Reason.REPOSITORY_NOT_FOUND
    assert "no-such-repo" in error.message


def test_a_commit_that_does_not_exist(jobs: Jobs, repo: GitRepo, server: GitDaemon | GitHttpServer) -> None:
    missing = "0123456789abcdef" * 2 + "01234567"
    error = jobs.fails(server.url_for(repo), missing)
    assert error.reason is Reason.COMMIT_NOT_FOUND
    assert missing in error.message


def test_a_server_that_is_down(jobs: Jobs, repo: GitRepo, server: GitDaemon | GitHttpServer) -> None:
    # The server's own URL, moved to a port this test holds bound and not listening: a connection
    # to it is refused, and no server of a parallel test can take it. (Re-binding the server's port
    # after stopping it raced with the daemon's exit: EADDRINUSE.)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        url = urlsplit(server.url_for(repo))._replace(netloc=f"127.0.0.1:{held.getsockname()[1]}").geturl()
        server.stop()
        error = jobs.fails(url, repo.head)
    assert error.reason is Reason.SOURCE_UNAVAILABLE


def test_a_server_that_never_answers_times_out(jobs: Jobs, repo: GitRepo) -> None:
    with SilentServer() as silent:
        error = jobs.fails(silent.url_for(repo), repo.head, timeout_s=2.0)
    assert error.reason is Reason.SOURCE_UNAVAILABLE
    assert "within 2 s" in error.message


def test_a_wrong_credential_is_source_auth_failed(jobs: Jobs, repo: GitRepo, auth_http: GitHttpServer) -> None:
    wrong = GitCredentials(username=USERNAME, password=SecretStr("not-" + CANARY))
    error = jobs.fails(auth_http.url_for(repo), repo.head, credentials=wrong)
    assert error.reason is Reason.SOURCE_AUTH_FAILED
    assert "refused the git credentials" in error.message
    assert [r.status for r in auth_http.requests] and all(r.status == 401 for r in auth_http.requests)


def test_no_credential_for_a_private_repository_is_source_auth_failed(
    jobs: Jobs, repo: GitRepo, auth_http: GitHttpServer
) -> None:
    error = jobs.fails(auth_http.url_for(repo), repo.head)
    assert error.reason is Reason.SOURCE_AUTH_FAILED
    assert "credentialsSecret" in error.message


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc",
        "/var/lib/helmhive",
        "ext::sh -c touch% /tmp/pwned",
        "ssh://git@example.com/repo.git",
        f"https://{USERNAME}:{CANARY}@example.com/repo.git",
        "https://example.com/repo.git?token=abc",
        "https://example.com/repo .git",
    ],
    ids=["file", "path", "ext", "ssh", "userinfo", "query", "space"],
)
def test_unsupported_repository_urls_are_refused_before_git_runs(jobs: Jobs, url: str) -> None:
    error = jobs.fails(url, "a" * 40)
    assert error.reason is Reason.INVALID_SPEC
    assert CANARY not in str(error)
    assert not jobs.cache.exists()


@pytest.mark.parametrize("commit", ["main", "v1.0", "abc1234", "A" * 40, "a" * 41])
def test_anything_but_a_full_commit_id_is_refused(jobs: Jobs, commit: str) -> None:
    assert jobs.fails("https://example.com/repo.git", commit).reason is Reason.INVALID_SPEC


def test_git_dir_inside_the_work_tree_is_a_programming_error(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(ValueError, match="separate"):
        ensure_source(
            cache_dir=cache,
            repository="https://example.com/repo.git",
            commit="a" * 40,
            git_dir=tmp_path / "work" / ".git",
            work_tree=tmp_path / "work",
            credentials=None,
        )


# --- the credential never shows --------------------------------------------------------------------


def assert_no_canary(text: str, where: str) -> None:
    for form in CANARY_FORMS:
        assert form not in text, f"the canary ({form[:6]}...) is in {where}"


def assert_no_canary_in_files(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            for form in CANARY_FORMS:
                assert form.encode() not in data, f"the canary is in {path}"


def test_the_credential_appears_nowhere(
    jobs: Jobs, repo: GitRepo, auth_http: GitHttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    credentials = GitCredentials(username=USERNAME, password=SecretStr(CANARY))
    url = auth_http.url_for(repo)
    checkout = jobs.fetch(url, repo.commits[0], credentials=credentials)
    wrong = GitCredentials(username=USERNAME, password=SecretStr(CANARY + "-wrong"))
    errors = [
        jobs.fails(url, repo.commits[1], credentials=wrong),
        jobs.fails(url, "0" * 40, credentials=credentials),
        jobs.fails(auth_http.url_for("missing"), repo.head, credentials=credentials),
    ]
    assert [e.reason for e in errors] == [
        Reason.SOURCE_AUTH_FAILED,
        Reason.COMMIT_NOT_FOUND,
        Reason.REPOSITORY_NOT_FOUND,
    ]
    for error in errors:
        assert_no_canary(f"{error} {error.message!r} {error!r} {error.args!r}", "an exception")
    assert caplog.records, "nothing was logged"
    for record in caplog.records:
        assert_no_canary(f"{record.getMessage()} {record.__dict__!r}", f"the log record {record.getMessage()!r}")
    assert_no_canary(repr(credentials), "repr(credentials)")
    assert_no_canary_in_files(jobs.cache)
    assert_no_canary_in_files(checkout.git_dir)
    assert_no_canary_in_files(checkout.work_tree)
    assert "extraheader" not in (checkout.git_dir / "config").read_text().lower()


def test_credentials_are_not_sent_over_plain_http_to_another_host(tmp_path: Path) -> None:
    env_https = build_git_env(home=tmp_path, path="/usr/bin", authorization="Basic abc")
    assert "Authorization: Basic abc" in env_https.values()
    assert env_https["GIT_TERMINAL_PROMPT"] == "0"
    assert env_https["GIT_CONFIG_NOSYSTEM"] == "1"
    assert ("http.followRedirects", "false") in _config(env_https)
    from helmhive.runner.source.rules import decide_sends_credentials as _sends_credentials

    assert _sends_credentials("https://git.example.com/r.git")
    assert _sends_credentials("http://127.0.0.1:8080/r.git")
    assert not _sends_credentials("http://git.example.com/r.git")
    assert not _sends_credentials("git://git.example.com/r.git")


def _config(env: dict[str, str]) -> list[tuple[str, str]]:
    count = int(env["GIT_CONFIG_COUNT"])
    return [(env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"]) for i in range(count)]


# --- credentials from a mounted Secret ---------------------------------------------------------------


def test_credentials_from_a_mounted_secret(tmp_path: Path) -> None:
    assert GitCredentials.from_dir(tmp_path / "absent") is None
    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "username").write_text(USERNAME + "\n")
    (mount / "password").write_text(CANARY + "\n")
    credentials = GitCredentials.from_dir(mount)
    assert credentials is not None
    assert (credentials.username, credentials.password.get_secret_value()) == (USERNAME, CANARY)
    assert_no_canary(repr(credentials), "repr")


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ({"username": USERNAME}, "no readable key 'password'"),
        ({"username": USERNAME, "password": ""}, "'password' is empty"),
        ({"username": "a:b", "password": CANARY}, "may not contain ':'"),
        ({"username": USERNAME, "password": CANARY + "\nX-Injected: 1"}, "control characters"),
    ],
    ids=["missing-key", "empty", "colon", "header-injection"],
)
def test_an_unusable_credentials_secret_is_source_auth_failed(
    tmp_path: Path, files: dict[str, str], problem: str
) -> None:
    for name, value in files.items():
        (tmp_path / name).write_text(value)
    with pytest.raises(SourceError) as caught:
        GitCredentials.from_dir(tmp_path)
    assert caught.value.reason is Reason.SOURCE_AUTH_FAILED
    assert problem in caught.value.message
    assert_no_canary(str(caught.value), "the error")


# --- pure helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        ("fatal: could not read Username for 'http://h': terminal prompts disabled", Reason.SOURCE_AUTH_FAILED),
        ("fatal: Authentication failed for 'https://h/r.git/'", Reason.SOURCE_AUTH_FAILED),
        ("fatal: unable to access 'https://h/r/': The requested URL returned error: 403", Reason.SOURCE_AUTH_FAILED),
        ("fatal: repository 'http://h/missing.git/' not found", Reason.REPOSITORY_NOT_FOUND),
        ("fatal: remote error: access denied or repository not exported: /x.git", Reason.REPOSITORY_NOT_FOUND),
        ("fatal: 'x' does not appear to be a git repository", Reason.REPOSITORY_NOT_FOUND),
        ("fatal: remote error: upload-pack: not our ref 1111", Reason.COMMIT_NOT_FOUND),
        ("fatal: couldn't find remote ref 1111", Reason.COMMIT_NOT_FOUND),
        ("fatal: mismatched algorithms: client sha256; server sha1", Reason.COMMIT_NOT_FOUND),
        ("fatal: unable to connect to h:\nh[0: 127.0.0.1]: errno=Connection refused", Reason.SOURCE_UNAVAILABLE),
        ("fatal: unable to access 'https://h/': Could not resolve host: h", Reason.SOURCE_UNAVAILABLE),
        ("fatal: the remote end hung up unexpectedly", Reason.SOURCE_UNAVAILABLE),
        ("", Reason.SOURCE_UNAVAILABLE),
    ],
)
def test_decide_failure(stderr: str, reason: Reason) -> None:
    assert decide_failure(stderr) is reason


def test_decide_evictions_least_recently_used_first_never_the_one_in_use() -> None:
    entries = [
        CacheEntry(key="old.git", size=50, last_used=1.0),
        CacheEntry(key="in-use.git", size=50, last_used=0.5),
        CacheEntry(key="new.git", size=50, last_used=3.0),
        CacheEntry(key="mid.git", size=50, last_used=2.0),
    ]
    assert decide_evictions(entries, max_bytes=200, keep="in-use.git") == []
    assert decide_evictions(entries, max_bytes=150, keep="in-use.git") == ["old.git"]
    assert decide_evictions(entries, max_bytes=100, keep="in-use.git") == ["old.git", "mid.git"]
    assert decide_evictions(entries, max_bytes=0, keep="in-use.git") == ["old.git", "mid.git", "new.git"]


def test_decide_repository_problem_accepts_the_supported_schemes() -> None:
    for url in ("https://git.example.com/org/repo.git", "http://127.0.0.1:9/r.git", "git://h/r"):
        assert decide_repository_problem(url) is None, url
    problem = decide_repository_problem(f"https://{USERNAME}:{CANARY}@h/r.git")
    assert problem is not None and CANARY not in problem


def test_the_cache_key_is_a_hash_without_the_url() -> None:
    key = build_cache_key("https://git.example.com/org/repo.git", "sha1")
    assert key.endswith(".git") and "example" not in key
    assert key != build_cache_key("https://git.example.com/org/repo.git", "sha256")

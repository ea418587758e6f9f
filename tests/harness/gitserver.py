"""Real git servers on loopback for tests: repositories a test builds, served by ``git daemon``
and by smart HTTP (``git http-backend`` as CGI behind a small threaded Python server).

Nothing here is a fake: the client under test talks the real git protocols to real git server
programs, on ``127.0.0.1`` and free ports, and every server is stopped when its ``with`` block
(or fixture) ends. The pieces:

* :class:`GitRepo`: a bare repository ``<root>/<name>.git`` with a ``main`` branch, built with
  plumbing (no work tree needed); :meth:`GitRepo.commit` adds a commit from a mapping of paths to
  contents (bytes are kept as they are, ``None`` deletes). ``allow_sha_wants`` sets
  ``uploadpack.allowAnySHA1InWant`` / ``allowReachableSHA1InWant`` so a shallow fetch of one
  commit by its id works (turn it off to get a server that refuses wants by id).
* :class:`GitDaemon`: ``git daemon`` exporting every repository under a root.
* :class:`GitHttpServer`: smart HTTP for every repository under a root, with optional Basic
  auth; :attr:`GitHttpServer.requests` records each request (method, path, status, whether it
  was authorised -- never the header itself).
* :class:`SilentServer`: accepts TCP connections and never answers (for timeouts).

Each server has ``url_for(repo)``. A minimal test::

    def test_fetch(tmp_path: Path) -> None:
        repo = GitRepo.create(root=tmp_path / "git", name="demo", files={"README": "hi\\n"})
        with GitDaemon(root=tmp_path / "git") as daemon:
            url = daemon.url_for(repo)          # git://127.0.0.1:<port>/demo.git
            ...

The fixtures at the end (``git_root``, ``git_daemon``, ``git_http``) wrap the same classes; a
conftest makes them available with ``pytest_plugins = ["harness.gitserver"]`` or by importing them.
The git processes run with a pinned environment (no system or global config, fixed author and
dates) so results do not depend on the machine.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Self

import git
import pytest

from harness.wait import wait_for

__all__ = [
    "GitDaemon",
    "GitHttpServer",
    "GitRepo",
    "RecordedRequest",
    "SilentServer",
    "git_daemon",
    "git_http",
    "git_root",
]

LOOPBACK = "127.0.0.1"
BRANCH = "main"


def _git_env(home: Path) -> dict[str, str]:
    """A pinned environment for the server-side git processes: no user or system config."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home),
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "Helmhive Test",
        "GIT_AUTHOR_EMAIL": "test@helmhive.invalid",
        "GIT_COMMITTER_NAME": "Helmhive Test",
        "GIT_COMMITTER_EMAIL": "test@helmhive.invalid",
    }


def _empty_home(root: Path) -> Path:
    home = root.parent / f".{root.name}-home"
    home.mkdir(parents=True, exist_ok=True)
    return home


class GitRepo:
    """A bare repository under ``root``, served as ``<name>.git``; commits are made with plumbing."""

    def __init__(self, *, root: Path, name: str) -> None:
        """Open an existing repository made by :meth:`create`."""
        self.root = root
        self.name = name
        self.path = root / f"{name}.git"
        self.commits: list[str] = []
        self._env = _git_env(_empty_home(root))
        self._git = git.Git(str(self.path))

    @classmethod
    def create(
        cls,
        *,
        root: Path,
        name: str,
        files: Mapping[str, str | bytes | None] | None = None,
        object_format: str = "sha1",
        allow_sha_wants: bool = True,
    ) -> GitRepo:
        """Make ``<root>/<name>.git`` (``object_format`` ``sha1`` or ``sha256``); commit ``files`` if given."""
        root.mkdir(parents=True, exist_ok=True)
        repo = cls(root=root, name=name)
        if repo.path.exists():
            raise FileExistsError(f"{repo.path} exists")
        git.Git(str(root)).execute(
            [
                "git",
                "init",
                "--quiet",
                "--bare",
                f"--object-format={object_format}",
                f"--initial-branch={BRANCH}",
                str(repo.path),
            ],
            env=repo._env,
        )
        repo.set_allow_sha_wants(allow_sha_wants)
        if files:
            repo.commit(files, message="initial commit")
        return repo

    def run(self, *args: str, stdin_path: Path | None = None) -> str:
        """``git --git-dir=<path> <args>`` in the pinned environment; its stdout."""
        command = ["git", f"--git-dir={self.path}", *args]
        if stdin_path is None:
            return str(self._git.execute(command, env=self._env))
        with stdin_path.open("rb") as stream:
            return str(self._git.execute(command, env=self._env, istream=stream))

    def set_allow_sha_wants(self, allowed: bool) -> None:
        """Whether the server lets a client fetch a commit by its id (needed for a shallow fetch by id)."""
        value = "true" if allowed else "false"
        self.run("config", "uploadpack.allowAnySHA1InWant", value)
        self.run("config", "uploadpack.allowReachableSHA1InWant", value)

    @property
    def head(self) -> str:
        """The newest commit on ``main``."""
        return self.run("rev-parse", f"refs/heads/{BRANCH}")

    @property
    def object_format(self) -> str:
        return self.run("rev-parse", "--show-object-format")

    def commit(self, files: Mapping[str, str | bytes | None], *, message: str = "change") -> str:
        """Commit ``files`` on top of ``main`` (str is UTF-8, bytes as given, None deletes); its id."""
        parent = self.head if self._has_head() else None
        index = self.path / "index"
        env_index = {"GIT_INDEX_FILE": str(index)}
        if parent is not None:
            self._run_env(env_index, "read-tree", parent)
        else:
            index.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(prefix="gitrepo-blob-") as scratch:
            blob_file = Path(scratch) / "blob"
            for path, content in files.items():
                if content is None:
                    self._run_env(env_index, "update-index", "--force-remove", "--", path)
                    continue
                blob_file.write_bytes(content.encode() if isinstance(content, str) else content)
                blob = self.run("hash-object", "-w", "--no-filters", str(blob_file))
                self._run_env(env_index, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
        tree = self._run_env(env_index, "write-tree")
        parents = ["-p", parent] if parent is not None else []
        # Distinct, increasing dates: the commit ids stay reproducible and ordered.
        when = f"{1_700_000_000 + 60 * len(self.commits)} +0000"
        dated = {**env_index, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
        commit = self._run_env(dated, "commit-tree", tree, *parents, "-m", message)
        self.run("update-ref", f"refs/heads/{BRANCH}", commit)
        self.commits.append(commit)
        return commit

    def _has_head(self) -> bool:
        try:
            self.run("rev-parse", "--verify", "--quiet", f"refs/heads/{BRANCH}")
        except git.GitCommandError:
            return False
        return True

    def _run_env(self, extra: Mapping[str, str], *args: str) -> str:
        command = ["git", f"--git-dir={self.path}", *args]
        return str(self._git.execute(command, env={**self._env, **extra}))


def _repo_name(repo: GitRepo | str) -> str:
    return repo.name if isinstance(repo, GitRepo) else repo


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((LOOPBACK, port)) == 0


class _Server:
    """Start on ``__enter__``, stop on ``__exit__``; :meth:`stop` is idempotent."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class GitDaemon(_Server):
    """``git daemon`` exporting every repository under ``root`` on 127.0.0.1 (``git://``)."""

    def __init__(self, *, root: Path, informative_errors: bool = False) -> None:
        self.root = root
        self.informative_errors = informative_errors
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log = root.parent / f".{root.name}-daemon.log"

    def url_for(self, repo: GitRepo | str) -> str:
        return f"git://{LOOPBACK}:{self.port}/{_repo_name(repo)}.git"

    def start(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        env = _git_env(_empty_home(self.root))
        # A free port can be taken between probing and binding; try a few.
        for _ in range(5):
            self.port = _free_port()
            command = [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--verbose",
                f"--base-path={self.root}",
                f"--listen={LOOPBACK}",
                f"--port={self.port}",
                "--init-timeout=10",
                "--timeout=60",
                *(["--informative-errors"] if self.informative_errors else []),
                str(self.root),
            ]
            with self._log.open("ab") as log:
                process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            self._process = process
            if self._wait_listening(process):
                return self
            self.stop()
        raise RuntimeError(f"git daemon did not start; log: {self.log_text()[-2000:]}")

    def _wait_listening(self, process: subprocess.Popen[bytes]) -> bool:
        def ready() -> bool:
            # An exited daemon (port taken) ends the wait at once; the caller retries.
            return process.poll() is not None or _accepts(self.port)

        try:
            wait_for(ready, timeout=30, describe=f"git daemon listening on port {self.port}")
        except AssertionError:
            return False
        return process.poll() is None

    def log_text(self) -> str:
        try:
            return self._log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass(frozen=True)
class RecordedRequest:
    """One request the HTTP server handled. ``authorized`` is None when the server has no auth."""

    method: str
    path: str
    status: int
    authorized: bool | None


class _GitHttpHandler(BaseHTTPRequestHandler):
    server: _GitHttpd
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def log_message(self, format: str, *args: object) -> None:
        return  # the server's own record is :attr:`GitHttpServer.requests`

    def _authorized(self) -> bool | None:
        expected = self.server.expected_authorization
        if expected is None:
            return None
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), expected.encode())

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        authorized = self._authorized()
        path, _, query = self.path.partition("?")
        if authorized is False:
            self.server.record(RecordedRequest(self.command, path, 401, False))
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="helmhive-test"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self._body()
        env = {
            **self.server.git_env,
            "GIT_PROJECT_ROOT": str(self.server.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "REMOTE_USER": "test" if authorized else "",
        }
        if self.headers.get("Git-Protocol") and not self.server.legacy_protocol:
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        result = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=120, check=False
        )
        head, _, payload = result.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = result.stdout.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        if result.returncode != 0 and not head:
            status = 500
        self.server.record(RecordedRequest(self.command, path, status, authorized))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _GitHttpd(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, *, root: Path, expected_authorization: str | None, git_env: dict[str, str], legacy_protocol: bool
    ) -> None:
        super().__init__((LOOPBACK, 0), _GitHttpHandler)
        self.root = root
        self.legacy_protocol = legacy_protocol
        self.expected_authorization = expected_authorization
        self.git_env = git_env
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)


class GitHttpServer(_Server):
    """Smart HTTP (``git http-backend``) for every repository under ``root``, on 127.0.0.1.

    With ``username`` and ``password`` every request must carry that Basic authorization, else
    it gets 401 with a ``WWW-Authenticate`` challenge. ``legacy_protocol`` ignores the client's
    request for protocol v2 and speaks v0, as an old server does (where a repository without
    ``allow_sha_wants`` refuses a fetch of an unadvertised commit by its id).
    """

    def __init__(
        self,
        *,
        root: Path,
        username: str | None = None,
        password: str | None = None,
        legacy_protocol: bool = False,
    ) -> None:
        if (username is None) != (password is None):
            raise ValueError("give both username and password, or neither")
        self.root = root
        self.legacy_protocol = legacy_protocol
        self.port = 0
        self._expected = (
            "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode() if username is not None else None
        )
        self._httpd: _GitHttpd | None = None
        self._thread: threading.Thread | None = None
        self._requests: list[RecordedRequest] = []

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request handled so far (also after :meth:`stop`)."""
        return list(self._httpd.requests) if self._httpd is not None else list(self._requests)

    def url_for(self, repo: GitRepo | str) -> str:
        return f"http://{LOOPBACK}:{self.port}/{_repo_name(repo)}.git"

    def start(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        httpd = _GitHttpd(
            root=self.root,
            expected_authorization=self._expected,
            git_env=_git_env(_empty_home(self.root)),
            legacy_protocol=self.legacy_protocol,
        )
        self.port = int(httpd.server_address[1])
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), name="git-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        self._requests = list(httpd.requests)
        if self._thread is not None:
            self._thread.join(timeout=10)


class SilentServer(_Server):
    """Accepts TCP connections on 127.0.0.1 and never answers (a fetch through it can only time out)."""

    def __init__(self) -> None:
        self.port = 0
        self._sock: socket.socket | None = None
        self._held: list[socket.socket] = []
        self._thread: threading.Thread | None = None

    def url_for(self, repo: GitRepo | str, *, scheme: str = "http") -> str:
        return f"{scheme}://{LOOPBACK}:{self.port}/{_repo_name(repo)}.git"

    def start(self) -> Self:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((LOOPBACK, 0))
        sock.listen(16)
        self.port = int(sock.getsockname()[1])
        self._sock = sock
        self._thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)
        self._thread.start()
        return self

    def _accept(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self._held.append(conn)

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        for conn in self._held:
            conn.close()
        if self._thread is not None:
            self._thread.join(timeout=10)


@pytest.fixture
def git_root(tmp_path: Path) -> Iterator[Path]:
    """A directory for :class:`GitRepo` s, served by ``git_daemon`` and ``git_http``."""
    root = tmp_path / "git-served"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def git_daemon(git_root: Path) -> Iterator[GitDaemon]:
    """``git daemon`` for ``git_root``."""
    with GitDaemon(root=git_root) as daemon:
        yield daemon


@pytest.fixture
def git_http(git_root: Path) -> Iterator[GitHttpServer]:
    """Smart HTTP without auth for ``git_root`` (build a :class:`GitHttpServer` yourself for Basic auth)."""
    with GitHttpServer(root=git_root) as server:
        yield server

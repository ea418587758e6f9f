"""``helmhive change|sessions`` on bad input or a bad server: one plain line, a non-zero exit, no traceback.

A refused connection, a silent API server or one that keeps answering 429 with a long
``Retry-After`` is reported in words within a bounded time; without
``-n`` the namespace is the kubeconfig context's, as kubectl's is; an unknown ``-o`` is a usage
error. Only the command line is used here (no helper of the implementation is imported), so
every test also runs against the code before the fix, and fails there.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_kubeconfig import write_kubeconfig
from typer.testing import CliRunner

from helmhive.cli.main import app

TIMEOUT_ENV = "HELMHIVE_CLI_TIMEOUT_SECONDS"
runner = CliRunner()


# No answer ---------------------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize(
    "args",
    [
        ["change", "status", "refund-idempotency"],
        ["change", "patch", "refund-idempotency"],
        ["change", "approve", "refund-idempotency"],
        ["sessions", "list"],
        ["sessions", "reset", "sb-1"],
    ],
)
def test_a_refused_connection_is_one_plain_line_in_the_contexts_namespace(tmp_path: Path, args: list[str]) -> None:
    port = _closed_port()
    result = runner.invoke(app, [*args, "--kubeconfig", str(write_kubeconfig(tmp_path, f"https://127.0.0.1:{port}"))])
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in result.output
    assert line.endswith(f"the API server at 127.0.0.1:{port} could not be reached: connection refused"), line
    assert "MaxRetryError" not in line and "urllib3" not in line and ": 0 " not in line
    assert "demo/" in line or "in demo:" in line  # the context's namespace, not default
    assert "not-a-secret" not in result.output


def test_an_explicit_namespace_wins_over_the_contexts(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path, f"https://127.0.0.1:{_closed_port()}")
    result = runner.invoke(app, ["change", "status", "c", "-n", "team-a", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 1 and result.stderr.startswith("change team-a/c: the API server at"), result.stderr


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    for conn in accepted:
        conn.close()
    listener.close()


@pytest.mark.parametrize("scheme", ["https", "http"])  # silent in the TLS handshake, or after the request
def test_a_silent_api_server_is_given_up_on_after_the_timeout(silent_server: int, tmp_path: Path, scheme: str) -> None:
    kubeconfig = write_kubeconfig(tmp_path, f"{scheme}://127.0.0.1:{silent_server}")
    done = subprocess.run(
        [sys.executable, "-m", "helmhive", "change", "status", "refund-idempotency", "--kubeconfig", str(kubeconfig)],
        env={**os.environ, TIMEOUT_ENV: "2"},
        capture_output=True,
        text=True,
        timeout=60,  # generous: without a timeout it never returns
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        f"change demo/refund-idempotency: the API server did not answer within 2 s (127.0.0.1:{silent_server})"
    )
    assert done.stdout == ""


# An answer that stays "busy" ------------------------------------------------------------------------
BUSY_MESSAGE = "Too many requests, please try again later."


class _Busy(http.server.BaseHTTPRequestHandler):
    """Every request: 429 and ``Retry-After: 60``, as an overloaded API server or a proxy in front of it says."""

    requests: list[str]

    def _answer(self) -> None:
        self.requests.append(self.command)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = (
            '{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "TooManyRequests", '
            f'"code": 429, "message": "{BUSY_MESSAGE}"}}'
        ).encode()
        self.send_response(429)
        self.send_header("Retry-After", "60")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def busy_server() -> Iterator[tuple[int, list[str]]]:
    """A plain-HTTP server answering every request 429 with ``Retry-After: 60``; yields its port and the requests."""
    requests: list[str] = []
    handler = type("Busy", (_Busy,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield server.server_address[1], requests
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.mark.parametrize(
    ("args", "what", "code"),
    [
        (["sessions", "list"], "listing session bindings in demo", 1),
        (["change", "status", "x"], "change demo/x", 1),
        (["explain-routing", "x"], "error: agentjob demo/x", 4),  # 4: the cluster could not be asked
    ],
)
def test_a_busy_api_server_asking_to_wait_a_minute_is_given_up_on_within_the_timeout(
    busy_server: tuple[int, list[str]], tmp_path: Path, args: list[str], what: str, code: int
) -> None:
    # urllib3 alone honours Retry-After uncapped: three retries of 60 s held the command for 3 minutes.
    port, requests = busy_server
    kubeconfig = write_kubeconfig(tmp_path, f"http://127.0.0.1:{port}")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "helmhive", *args, "--kubeconfig", str(kubeconfig)],
            env={**os.environ, TIMEOUT_ENV: "2"},
            capture_output=True,
            text=True,
            timeout=60,  # generous: the machine is shared; the retries must wait well under 2 s in all
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[0]} still waited on Retry-After: 60 after 60 s with {TIMEOUT_ENV}=2")
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    # It answered: the line says what it answered, never that it did not answer.
    assert lines[0] == f"{what}: the API server answered that it is busy: 429 {BUSY_MESSAGE}", lines[0]
    assert len(requests) > 1, requests  # still retried, as the server asked, only not for a minute each


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "nan", "inf", "3601"])
def test_an_unusable_timeout_is_a_usage_error(raw: str, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path, "https://127.0.0.1:1")
    result = runner.invoke(app, ["sessions", "list", "--kubeconfig", str(kubeconfig)], env={TIMEOUT_ENV: raw})
    assert result.exit_code == 2 and TIMEOUT_ENV in result.stderr and "Traceback" not in result.output


# A kubeconfig that is not YAML ---------------------------------------------------------------------
CANARY = "canary-token-5d1f0c"


@pytest.mark.parametrize(
    "args",
    [["change", "status", "x"], ["sessions", "list"], ["explain-routing", "x", "-n", "y"]],
)
def test_a_broken_kubeconfig_line_is_never_quoted(tmp_path: Path, args: list[str]) -> None:
    # PyYAML's own message quotes the offending line; here that line holds a token.
    kubeconfig = write_kubeconfig(tmp_path, f"https://127.0.0.1:{_closed_port()}")
    text = kubeconfig.read_text(encoding="utf-8")
    kubeconfig.write_text(text + f"  token: {CANARY}: [broken\n", encoding="utf-8")
    broken_line = len(text.splitlines()) + 1
    result = runner.invoke(app, [*args, "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in result.output
    assert line.startswith(f"cannot load kubeconfig: {kubeconfig}: line {broken_line}, column "), line
    assert CANARY not in result.output and CANARY not in result.stderr


# -o ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["change", "status", "c", "-o", "yaml"], ["sessions", "list", "-o", "yaml"]])
def test_an_unknown_output_format_is_a_usage_error(args: list[str], tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path, f"https://127.0.0.1:{_closed_port()}")
    result = runner.invoke(app, [*args, "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 2, result.output
    assert all(word in result.stderr for word in ("--output", "'yaml' is not one of", "'table', 'json'"))
    assert "API server" not in result.output  # refused before any call

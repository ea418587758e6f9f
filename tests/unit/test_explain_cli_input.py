"""``helmhive explain-routing`` refuses bad input in one line, with a reason and a field path, never a traceback.

No cluster: a kubeconfig that cannot be loaded, a malformed manifest, a spec the models refuse and
a namespace that contradicts the manifest's are all refused before any API call. The API server
used where one is needed is a port nothing listens on (refused at once) or a socket that accepts
and never answers; neither is a stand-in for the Kubernetes API.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helmhive.api.manifest_yaml import ManifestLoader
from helmhive.cli.kubeapi import TIMEOUT_ENV
from helmhive.cli.main import app

TOKEN = "SECRET-TOKEN-6f1e"
JOB = {"workspace": "payments", "jobKind": "review-probe", "request": {"title": "t", "prompt": "p"}}


def kubeconfig_text(server: str, *, current: str = "a", ca_data: str | None = None) -> str:
    cluster = f'{{server: "{server}"' + (f', certificate-authority-data: "{ca_data}"' if ca_data else "") + "}"
    return (
        "apiVersion: v1\nkind: Config\n"
        f"current-context: {current}\n"
        "contexts: [{name: a, context: {cluster: c, user: u, namespace: from-context}}]\n"
        f"clusters: [{{name: c, cluster: {cluster}}}]\n"
        f"users: [{{name: u, user: {{token: {TOKEN}}}}}]\n"
    )


def closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def refused_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$KUBECONFIG`` names an API server that refuses connections (nothing listens)."""
    path = tmp_path / "refused.yaml"
    path.write_text(kubeconfig_text(f"http://127.0.0.1:{closed_port()}"))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A loopback port that accepts connections and never answers; yields the port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()
    for conn in held:
        conn.close()


def explain(*args: str) -> tuple[int, str, str]:
    """Run the command in process; an exception other than the exit itself (a traceback) fails the test."""
    result = CliRunner().invoke(app, ["explain-routing", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"explain-routing raised {result.exception!r} instead of a one-line error")
    return result.exit_code, result.stdout, result.stderr


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def manifest(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "job.yaml"
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return str(path)


def job_yaml(extra: str = "", **spec: object) -> str:
    return (
        "apiVersion: helmhive.dev/v1alpha1\nkind: AgentJob\n"
        + extra
        + f"spec: {json.dumps({**JOB, **spec})}\n"  # JSON is YAML
    )


# 1. A kubeconfig that cannot be loaded --------------------------------------------


@pytest.mark.parametrize(
    "case",
    ["missing-file", "missing-context", "bad-base64", "yaml-list", "not-utf8", "yaml-syntax-error"],
)
def test_a_kubeconfig_that_cannot_be_loaded_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    server = f"http://127.0.0.1:{closed_port()}"
    if case == "missing-context":
        path.write_text(kubeconfig_text(server, current="gone"))
    elif case == "bad-base64":
        path.write_text(kubeconfig_text(server.replace("http:", "https:"), ca_data="!!notbase64"))
    elif case == "yaml-list":
        path.write_text("- a\n- b\n")
    elif case == "not-utf8":
        path.write_bytes(kubeconfig_text(server).encode() + b"# \xff\xfe\n")
    elif case == "yaml-syntax-error":  # PyYAML's message quotes the offending line: here, the token's
        path.write_text(kubeconfig_text(server) + f"  token: {TOKEN}: broken\n")
    code, stdout, stderr = explain("job-1", "-n", "demo", "--kubeconfig", str(path))
    assert code == 2, stderr
    assert one_line(stderr).startswith("cannot load kubeconfig: ")
    assert TOKEN not in stdout + stderr
    assert stdout == ""


def test_no_kubeconfig_and_no_cluster_environment_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "nonexistent"))
    code, _, stderr = explain("job-1", "-n", "demo")
    assert code == 2, stderr
    line = one_line(stderr)
    assert line.startswith("cannot load kubeconfig: ")
    assert "not in a cluster" in line


# 2. A malformed manifest, refused with the field it is about ----------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("kind: AgentJob\nmetadata: [1]\n", "metadata: must be a mapping", id="metadata-list"),
        pytest.param("kind: AgentJob\nmetadata: abc\n", "metadata: must be a mapping", id="metadata-string"),
        pytest.param("kind: AgentJob\nspec: [1]\n", "spec: must be a mapping", id="spec-list"),
        pytest.param(job_yaml("status: [1]\n"), "status: must be a mapping", id="status-list"),
        pytest.param(job_yaml("metadata: {name: [x]}\n"), "metadata.name: must be a string", id="name-list"),
        pytest.param(
            job_yaml("metadata: {namespace: [a]}\n"), "metadata.namespace: must be a string", id="namespace-list"
        ),
        pytest.param(job_yaml().encode() + b"# \xff\n", "not UTF-8 text", id="not-utf8"),
        pytest.param("kind: AgentJob\nspec: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply", id="deep"),
    ],
)
def test_a_malformed_manifest_is_refused_with_its_field(
    text: str | bytes, expected: str, tmp_path: Path, refused_kubeconfig: Path
) -> None:
    code, stdout, stderr = explain("-f", manifest(tmp_path, text), "-n", "demo")
    assert code == 2, stderr
    assert expected in one_line(stderr)
    assert stdout == ""


def test_a_json_manifest_indented_with_tabs_is_read_as_validate_reads_it(
    tmp_path: Path, refused_kubeconfig: Path
) -> None:
    # JSON allows tabs where YAML does not; kubectl and helmhive validate read a stream that starts with { as JSON.
    body = {"apiVersion": "helmhive.dev/v1alpha1", "kind": "AgentJob", "metadata": {"name": "j"}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps({**body, "spec": {**JOB, "profile": "p"}}, indent="\t") + "\n", encoding="utf-8")
    assert "\t" in path.read_text(encoding="utf-8")
    code, _, stderr = explain("-f", str(path), "-n", "demo")
    assert code == 4, stderr  # read; it went on to ask the API server (which refuses connections)
    assert one_line(stderr).startswith("error: agentjob demo/j (dry run): the API server at 127.0.0.1:")


def test_a_tagged_value_that_cannot_be_constructed_is_one_line_and_exit_2(
    tmp_path: Path, refused_kubeconfig: Path
) -> None:
    path = manifest(tmp_path, job_yaml().replace("spec: {", 'spec: {"timeoutSeconds": !!int "y", '))
    code, stdout, stderr = explain("-f", path, "-n", "demo")
    assert code == 2, stderr
    assert one_line(stderr).startswith(f"error: cannot read {path}: ")
    assert stdout == ""


def test_any_error_a_yaml_constructor_raises_is_one_line_and_exit_2(
    tmp_path: Path, refused_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A constructor may raise what it likes (PyYAML's own !!int raised ValueError for "y"), not only YAMLError.
    def refuse(loader: object, node: object) -> object:
        raise ValueError("invalid literal for int() with base 10: 'y'")

    monkeypatch.setitem(ManifestLoader.yaml_constructors, "tag:yaml.org,2002:int", refuse)
    path = manifest(tmp_path, job_yaml().replace("spec: {", 'spec: {"timeoutSeconds": !!int "5", '))
    code, stdout, stderr = explain("-f", path, "-n", "demo")
    assert code == 2, stderr
    line = one_line(stderr)
    assert line.startswith(f"error: cannot read {path}: "), line
    assert "invalid literal for int()" in line
    assert stdout == ""


# 3. A spec the models refuse: the field path, as on the wire ----------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"jobKind": "nope"}, "InvalidSpec: spec.jobKind: Input should be 'connection-test'", id="kind"),
        pytest.param({"profile": 5}, "InvalidSpec: spec.profile: Input should be a valid string", id="profile"),
    ],
)
def test_a_spec_the_models_refuse_names_the_field(
    spec: dict[str, object], expected: str, tmp_path: Path, refused_kubeconfig: Path
) -> None:
    code, _, stderr = explain("-f", manifest(tmp_path, job_yaml(**spec)), "-n", "demo")
    assert code == 2, stderr
    line = one_line(stderr)
    assert "fails closed at queue time" in line
    assert expected in line


def test_a_spec_the_models_refuse_is_one_json_object_with_o_json(tmp_path: Path, refused_kubeconfig: Path) -> None:
    code, stdout, stderr = explain("-f", manifest(tmp_path, job_yaml(jobKind="nope")), "-n", "demo", "-o", "json")
    assert code == 2, stderr
    shown = json.loads(stdout)
    assert shown["job"] == {"namespace": "demo", "name": "dry-run", "source": "manifest"}
    decision = shown["decision"]
    assert (decision["stage"], decision["outcome"], decision["reason"]) == ("queue", "Failed", "InvalidSpec")
    assert decision["message"].startswith("spec.jobKind: ")
    assert (decision["assignment"], decision["candidates"], decision["deadlineReason"]) == (None, [], None)


# 4. The manifest's namespace -------------------------------------------------------


def test_a_manifest_namespace_that_contradicts_n_is_refused_as_kubectl_does(
    tmp_path: Path, refused_kubeconfig: Path
) -> None:
    path = manifest(tmp_path, job_yaml("metadata: {name: j, namespace: demo}\n"))
    code, _, stderr = explain("-f", path, "-n", "other")
    assert code == 2, stderr
    line = one_line(stderr)
    assert 'the namespace from the provided object "demo" does not match the namespace "other"' in line
    assert "--namespace=demo" in line


def test_the_manifest_namespace_is_used_when_n_agrees_or_is_absent(tmp_path: Path, refused_kubeconfig: Path) -> None:
    path = manifest(tmp_path, job_yaml("metadata: {name: j, namespace: demo}\n", profile="p"))
    for extra in ([], ["-n", "demo"]):
        code, _, stderr = explain("-f", path, *extra)
        assert code == 4, stderr  # it went on to ask the API server (which refuses connections)
        assert one_line(stderr).startswith("error: agentjob demo/j (dry run): the API server at 127.0.0.1:")


def test_without_n_the_namespace_is_the_current_contexts_as_kubectl_merges_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # $KUBECONFIG lists two files; kubectl takes current-context from the first that sets one.
    server = f"http://127.0.0.1:{closed_port()}"
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(kubeconfig_text(server))  # current-context a: namespace from-context
    second.write_text(
        kubeconfig_text(server, current="b").replace("contexts: [", "contexts: [{name: b, context: {namespace: b}}, ")
    )
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "absent.yaml"), str(first), str(second)]))
    code, _, stderr = explain("job-1")
    assert code == 4, stderr
    assert one_line(stderr).startswith("error: agentjob from-context/job-1: the API server at 127.0.0.1:")


# 6. An API server that cannot be reached, or does not answer -----------------------------


def test_a_refused_connection_is_not_reported_as_the_api_server_refusing(refused_kubeconfig: Path) -> None:
    code, stdout, stderr = explain("job-1", "-n", "demo")
    line = one_line(stderr)
    # Worded as for change and sessions (helmhive.cli.kubeapi.describe_no_answer): what, where, why.
    assert line.startswith("error: agentjob demo/job-1: the API server at 127.0.0.1:"), line
    assert line.endswith(" could not be reached: connection refused"), line
    assert "the API server refused" not in line and "MaxRetryError" not in line
    assert code == 4  # the cluster could not be asked: not 1 (fails closed) nor 2 (a usage error)
    assert stdout == ""


def test_an_api_server_that_never_answers_is_given_up_on(silent_server: int, tmp_path: Path) -> None:
    path = tmp_path / "silent.yaml"
    path.write_text(kubeconfig_text(f"http://127.0.0.1:{silent_server}"))
    env = {**os.environ, "KUBECONFIG": str(path), TIMEOUT_ENV: "2"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "helmhive", "explain-routing", "job-1", "-n", "demo"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,  # generous: the machine is shared; the command itself gives up after 2 s
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("explain-routing still waited for an API server that never answers after 60 s")
    assert one_line(done.stderr) == (
        f"error: agentjob demo/job-1: the API server did not answer within 2 s (127.0.0.1:{silent_server})"
    )
    assert done.returncode == 4
    assert done.stdout == ""


def test_a_timeout_that_is_not_a_positive_number_is_a_usage_error(
    refused_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    code, _, stderr = explain("job-1", "-n", "demo")
    assert code == 2
    assert TIMEOUT_ENV in one_line(stderr)


# 7. What is printed from input is never a terminal escape -------------------------------


def test_an_error_line_carries_no_terminal_control_characters(tmp_path: Path, refused_kubeconfig: Path) -> None:
    code, _, stderr = explain("-f", str(tmp_path / "\x1b]0;owned\x07\x1b[31mjob\x9b2J\u202e.yaml"), "-n", "demo")
    assert code == 2
    line = one_line(stderr)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c == "\u202e" for c in line), repr(line)
    # Shown escaped, as change and sessions show them: a reader sees that something was there.
    assert f"cannot read {tmp_path}/\\x1b]0;owned\\x07\\x1b[31mjob\\x9b2J\\u202e.yaml: " in line

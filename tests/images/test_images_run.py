"""The images, built with ``docker build`` from their Dockerfiles, run as uid 65532 on a read-only root.

The images are built the way users and their CI build them, with ``docker build`` (the classic
builder) from ``images/*/Dockerfile`` in the working tree, through the helpers ``helmhive dev
kind`` uses (:mod:`helmhive.devcluster.kind.helmhive_images`). No registry is reached: the
Dockerfiles' ``debian`` and ``node`` bases are stood in for by local images imported from
:mod:`helmhive.devcluster.rootfs_bases`' trees. Docker's layer cache makes a rebuild with
unchanged inputs a matter of seconds.

Each container runs as a pod of the chart or a RunnerPool runs it: ``--read-only``, as
``65532:65532``, ``--cap-drop ALL``, ``no-new-privileges``, with tmpfs or host directories where
the pod has its emptyDirs, and ``--network host`` to reach the test API server on loopback.

- the operator image has no shell; ``helmhive --help`` and ``operator run --help`` work; the
  real operator started from it against the test API server publishes the envelope catalogue
  and serves liveness and metrics;
- the runner image registers a Runner with the reference agent; the ``node`` flavour ships
  Node.js 22 and the pinned npm agents, and registers one with the Claude CLI (honestly
  reporting it is not logged in).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
import pytest
import yaml
from kubernetes import client

from harness import wait_for
from harness.cluster import ClusterHandle
from harness.identity import mint_token
from harness.kube import IdentityFactory, Kube
from harness.kubectl import Kubectl
from harness.operator import free_port
from helmhive.deploy.manifests import OperatorIdentity
from helmhive.devcluster.build import BuildError
from helmhive.devcluster.kind.cluster import kind_state_dir
from helmhive.devcluster.kind.engine import EngineError, ensure_engine, ensure_host_packages
from helmhive.devcluster.kind.helmhive_images import HelmhiveImages, ensure_helmhive_images, ensure_runner_node_image
from helmhive.devcluster.kind.images import ensure_debian_image
from helmhive.devcluster.rootfs_bases import RootfsError, ensure_debian_base
from helmhive.policy.envelopes import ENVELOPES
from runner.npm_agents import CLAUDE_CODE, PINNED
from runner.program_harness import CANARY, RunnerProc, RunnerRig

T = TypeVar("T")
POD_UID = 65532
KUBE_DIR = "/var/run/helmhive-test"
BUILD_TIMEOUT_S = 1500
RUN_TIMEOUT_S = 120
CONTAINER_PREFIX = "helmhive-images-test-"
OPERATOR_TMPFS = ("/tmp",)
"""The operator's emptyDirs in the chart's Deployment."""
RUNNER_TMPFS = ("/tmp", "/var/lib/helmhive", "/home/runner")
"""A runner pod's emptyDirs (helmhive.policy.runners.pod)."""

# Every test here waits for image builds (minutes on a cold cache), so all of them stay out of the
# quick `-m "not cluster"` runs, including the ones that need no API server.
pytestmark = [pytest.mark.timeout(BUILD_TIMEOUT_S), pytest.mark.cluster]


class _Progress:
    """The build log: every line to a file, and to the terminal as it happens (a cold build takes minutes)."""

    def __init__(self, path: Path, config: pytest.Config) -> None:
        self.name = str(path)
        self._file = path.open("a", encoding="utf-8")
        self._reporter = config.pluginmanager.get_plugin("terminalreporter")
        self._capture = config.pluginmanager.get_plugin("capturemanager")

    def write(self, text: str) -> int:
        self._file.write(text)
        if self._reporter is not None and text.strip():
            with self._capture.global_and_fixture_disabled() if self._capture else contextlib.nullcontext():
                self._reporter.ensure_newline()
                self._reporter.write_line(f"images: {text.rstrip()}")
        return len(text)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _build(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, what: str, build: Callable[[Any], T]
) -> T:
    """``build(progress_log)``; any failure fails the test with the log's path (never a skip)."""
    progress = _Progress(tmp_path_factory.mktemp("images") / "build.log", request.config)
    try:
        return build(progress)
    except (BuildError, EngineError, RootfsError, OSError, subprocess.SubprocessError) as err:
        pytest.fail(f"building {what} failed: {err}\n(log: {progress.name})", pytrace=False)
    finally:
        progress.close()


def _debian(progress: Any) -> str:
    """The Debian minbase tree (debootstrap, cached) imported into the engine, started if need be."""
    ensure_engine(kind_state_dir(), progress)
    ensure_host_packages({"debootstrap": "debootstrap"}, progress)
    tree, release = ensure_debian_base("bookworm", progress)
    return ensure_debian_image(tree, release, progress)


@pytest.fixture(scope="module")
def debian_image(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _build(request, tmp_path_factory, "the Debian base image", _debian)


@pytest.fixture(scope="module")
def images(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, debian_image: str
) -> HelmhiveImages:
    return _build(
        request,
        tmp_path_factory,
        "the operator and runner images",
        lambda progress: ensure_helmhive_images(debian_image, progress),
    )


@pytest.fixture(scope="module")
def operator_image(images: HelmhiveImages) -> str:
    return images.operator


@pytest.fixture(scope="module")
def runner_image(images: HelmhiveImages) -> str:
    return images.runner


@pytest.fixture(scope="module")
def node_image(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, debian_image: str, images: HelmhiveImages
) -> str:
    # After `base` (the `images` fixture), so that docker's layer cache has the stages they share.
    return _build(
        request,
        tmp_path_factory,
        "the runner's node flavour",
        lambda progress: ensure_runner_node_image(debian_image, progress),
    )


@dataclass(frozen=True, kw_only=True)
class Volume:
    """A host directory bound into the container, as a pod's volume."""

    source: Path
    target: str
    read_only: bool = False


def build_run_args(
    image: str,
    args: Sequence[str] | None,
    *,
    name: str,
    entrypoint: str | None = None,
    env: dict[str, str] | None = None,
    volumes: Sequence[Volume] = (),
    tmpfs: Sequence[str] = OPERATOR_TMPFS,
) -> list[str]:
    """``docker run`` as a restricted pod runs a container: read-only root, 65532, no capabilities.

    Each tmpfs is an emptyDir (fsGroup 65532 makes it the pod user's; ``/tmp`` is world-writable
    and sticky). ``--network host``: the test API server and the endpoints the test scrapes are on
    the host's loopback.
    """
    command = ["run", "--rm", "--name", name, "--network", "host", "--read-only"]
    command += ["--user", f"{POD_UID}:{POD_UID}", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    for path in tmpfs:
        options = "mode=1777" if path == "/tmp" else f"uid={POD_UID},gid={POD_UID},mode=0700"
        command += ["--tmpfs", f"{path}:rw,nosuid,nodev,{options}"]
    for volume in volumes:
        command += ["-v", f"{volume.source}:{volume.target}{':ro' if volume.read_only else ''}"]
    for key, value in (env or {}).items():
        command += ["-e", f"{key}={value}"]
    if entrypoint is not None:
        command += ["--entrypoint", entrypoint]
    return ["docker", *command, image, *(args or [])]


def _container_name() -> str:
    return CONTAINER_PREFIX + uuid.uuid4().hex[:12]


def _remove(name: str) -> None:
    """Remove a container that outlived its `docker run` (killed, or timed out)."""
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False, timeout=60)


def _run(image: str, args: list[str] | None, *, entrypoint: str | None = None, **kwargs: Any) -> tuple[int, str]:
    name = _container_name()
    command = build_run_args(image, args, name=name, entrypoint=entrypoint, **kwargs)
    try:
        done = subprocess.run(command, capture_output=True, timeout=RUN_TIMEOUT_S, check=False)
    finally:
        _remove(name)
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


@dataclass(frozen=True)
class _Started:
    name: str
    popen: subprocess.Popen[bytes]


def _start(image: str, args: list[str] | None, *, log: IO[bytes], **kwargs: Any) -> _Started:
    """``docker run`` in the background; a signal sent to it reaches the container (docker's sig-proxy)."""
    name = _container_name()
    command = build_run_args(image, args, name=name, **kwargs)
    return _Started(name, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))


def _stop(started: _Started, timeout: float = 60) -> int:
    proc = started.popen
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    _remove(started.name)
    return proc.returncode


def _image_config(image: str) -> dict[str, Any]:
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config}}", image],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    config: dict[str, Any] = json.loads(out.stdout)
    return config


def _layers(image: str) -> list[str]:
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", image],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    layers: list[str] = json.loads(out.stdout)
    return layers


_PROBE = """
import os, pathlib
print("ids", os.getuid(), os.getgid(), sorted(set(os.getgroups()) - {os.getgid()}))
try:
    open("/opt/helmhive/probe", "w")
except OSError as err:
    print("root-write", err.strerror)
pathlib.Path("/tmp/probe").write_text("ok")
print("tmp-write", pathlib.Path("/tmp/probe").read_text())
print("no_new_privs", [line.split()[1] for line in open("/proc/self/status") if line.startswith("NoNewPrivs")][0])
print("caps", [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0])
"""


def _assert_contained(out: str) -> None:
    """What _PROBE printed: uid/gid 65532 and no other group, a read-only root, a writable /tmp, no privileges."""
    assert f"ids {POD_UID} {POD_UID} []" in out, out
    assert "root-write Read-only file system" in out, out
    assert "tmp-write ok" in out, out
    assert "no_new_privs 1" in out, out
    assert "caps 0000000000000000" in out, out


_ABSENT = ("bin/sh", "bin/bash", "bin/dash", "usr/bin/apt-get", "usr/bin/dpkg", "usr/bin/perl", "bin/ls")


def test_the_operator_image_has_no_shell_and_runs_read_only_as_65532(operator_image: str) -> None:
    config = _image_config(operator_image)
    assert config["User"] == f"{POD_UID}:{POD_UID}"
    code, out = _run(operator_image, ["-c", "true"], entrypoint="/bin/sh")
    assert code != 0 and "no such file or directory" in out, out
    listing = f"import os; print([p for p in {list(_ABSENT)!r} if os.path.lexists('/' + p)])"
    code, out = _run(operator_image, ["-c", listing], entrypoint="python3")
    assert code == 0 and out.strip() == "[]", f"in the operator image: {out}"
    code, out = _run(
        operator_image,
        ["-c", "import os; print(os.access('/opt/helmhive/venv/bin/helmhive', os.X_OK))"],
        entrypoint="python3",
    )
    assert code == 0 and out.strip() == "True", out

    code, out = _run(operator_image, ["--help"])
    assert code == 0, out
    assert "operator" in out and "Run the Helmhive operator" in out
    code, out = _run(operator_image, ["operator", "run", "--help"])
    assert code == 0, out
    assert "--webhook-port" in out and "--liveness" in out
    code, out = _run(operator_image, ["-c", _PROBE], entrypoint="python3")
    assert code == 0, out
    _assert_contained(out)


def test_the_runner_images_run_read_only_as_65532(runner_image: str, node_image: str) -> None:
    for image in (runner_image, node_image):
        code, out = _run(image, ["runner", "run", "--help"], tmpfs=RUNNER_TMPFS)
        assert code == 0, out
        assert "Register this runner" in out
        code, out = _run(image, ["-c", _PROBE], entrypoint="python3", tmpfs=RUNNER_TMPFS)
        assert code == 0, out
        _assert_contained(out)
        code, out = _run(image, ["--version"], entrypoint="git", tmpfs=RUNNER_TMPFS)
        assert code == 0 and out.startswith("git version"), out
    code, out = _run(node_image, ["--version"], entrypoint="node", tmpfs=RUNNER_TMPFS)
    assert code == 0 and out.strip().startswith("v22."), out
    code, out = _run(node_image, ["--version"], entrypoint="claude", tmpfs=RUNNER_TMPFS)
    assert code == 0 and CLAUDE_CODE[1] in out, out
    # Every agent the lock pins is on the flavour's PATH (its first entry, the agents' .bin).
    binaries = " ".join(binary for _name, _version, binary in PINNED)
    check = f"for b in {binaries}; do command -v $b || echo missing $b; done"
    code, out = _run(node_image, ["-c", check], entrypoint="/bin/sh", tmpfs=RUNNER_TMPFS)
    assert code == 0 and "missing" not in out, out
    assert all(f"/opt/helmhive/agents/node_modules/.bin/{binary}" in out for _n, _v, binary in PINNED), out
    # `node` is FROM `base`: the same Debian and python stage layers under it.
    assert _layers(node_image)[:2] == _layers(runner_image)[:2]


def _volume(path: Path, *, mode: int = 0o700) -> Path:
    """A directory the pod user owns, as an emptyDir with fsGroup 65532 would be."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, POD_UID, POD_UID)
    path.chmod(mode)
    return path


def _kube_dir(path: Path, admin_kubeconfig: Path, token: str, user: str, namespace: str | None = None) -> Path:
    """A volume holding a kubeconfig for ``token`` with the CA inlined (host paths mean nothing in the image)."""
    doc = yaml.safe_load(admin_kubeconfig.read_text(encoding="utf-8"))
    context = next(c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"])
    cluster = dict(next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"]))
    ca = cluster.pop("certificate-authority", None)
    if ca:
        ca_path = Path(ca) if Path(ca).is_absolute() else admin_kubeconfig.parent / ca
        cluster["certificate-authority-data"] = base64.b64encode(ca_path.read_bytes()).decode()
    kube_context = {"cluster": "cluster", "user": user, **({"namespace": namespace} if namespace else {})}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": kube_context}],
        "current-context": user,
    }
    _volume(path, mode=0o500)
    (path / "kubeconfig").write_text(yaml.safe_dump(config), encoding="utf-8")
    os.chown(path / "kubeconfig", POD_UID, POD_UID)
    (path / "kubeconfig").chmod(0o400)
    return path


@pytest.fixture
def stop_webhooks(kube: Kube) -> Iterator[None]:
    """The operator registers webhooks with failurePolicy Fail; remove them once it is gone."""
    yield
    admission = client.AdmissionregistrationV1Api(kube.api_client)
    for delete in (admission.delete_validating_webhook_configuration, admission.delete_mutating_webhook_configuration):
        try:
            delete("helmhive.dev")
        except client.ApiException as err:
            if err.status != 404:
                raise


def test_the_operator_from_its_image_publishes_the_envelopes(
    operator_image: str,
    cluster: ClusterHandle,
    kube: Kube,
    kubectl: Kubectl,
    helmhive_install: OperatorIdentity,
    stop_webhooks: None,
    tmp_path: Path,
) -> None:
    identity = helmhive_install
    token = mint_token(kube.core, identity.namespace, identity.service_account, expiration_seconds=3600)
    kube_dir = _kube_dir(tmp_path / "kube", cluster.kubeconfig, token, identity.service_account)
    # Only the operator's identity may delete envelopes: start from none, so they are this operator's.
    as_operator = kubectl.as_user(kube_dir / "kubeconfig")
    as_operator("delete", "envelopes", "--all", "--wait=true")
    assert kubectl.json("get", "envelopes")["items"] == []

    live, webhook, metrics = free_port(), free_port(), free_port()
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as log:
        started = _start(
            operator_image,
            [
                "operator",
                "run",
                f"--kubeconfig={KUBE_DIR}/kubeconfig",
                f"--liveness=http://127.0.0.1:{live}/healthz",
                "--webhook-addr=127.0.0.1",
                "--webhook-host=127.0.0.1",
                f"--webhook-port={webhook}",
                "--metrics-addr=127.0.0.1",
                f"--metrics-port={metrics}",
            ],
            log=log,
            volumes=[Volume(source=kube_dir, target=KUBE_DIR, read_only=True)],
        )
    proc = started.popen
    log_text = lambda: log_path.read_text(encoding="utf-8", errors="replace")  # noqa: E731

    def alive() -> None:
        assert proc.poll() is None, f"the operator exited with {proc.returncode}:\n{log_text()[-4000:]}"

    try:

        def healthy() -> bool:
            alive()
            return httpx.get(f"http://127.0.0.1:{live}/healthz", timeout=2).status_code == 200

        wait_for(healthy, timeout=90, ignore=(httpx.HTTPError,), describe="the operator's liveness endpoint")

        def published() -> list[str]:
            alive()
            names = [item["metadata"]["name"] for item in kubectl.json("get", "envelopes")["items"]]
            assert len(names) == len(ENVELOPES), names
            return names

        names = wait_for(published, timeout=90, describe="the operator from the image to publish the envelopes")
        assert sorted(names) == sorted(kind.value for kind in ENVELOPES)
        scraped = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5)
        assert scraped.status_code == 200 and "helmhive_" in scraped.text
    finally:
        code = _stop(started)
    text = log_text()
    assert code == 0, f"the operator exited with {code} after SIGTERM:\n{text[-4000:]}"
    assert "Read-only file system" not in text, text[-4000:]
    assert token not in text


def _runner_volumes(
    rig: RunnerRig, image: str, runner_json: dict[str, Any], kube_dir: Path
) -> tuple[list[Volume], dict[str, str]]:
    """The runner pod's volumes and environment (helmhive.policy.runners.pool), as host directories."""
    config = _volume(rig.root / "config", mode=0o755)
    (config / "runner.json").write_text(json.dumps(runner_json), encoding="utf-8")
    (config / "runner.json").chmod(0o444)
    volumes = [
        Volume(source=config, target="/etc/helmhive", read_only=True),
        Volume(source=kube_dir, target=KUBE_DIR, read_only=True),
        # The state and HOME emptyDirs as host directories, so that the test can look into them.
        Volume(source=_volume(rig.root / "state"), target="/var/lib/helmhive"),
        Volume(source=_volume(rig.root / "home"), target="/home/runner"),
    ]
    env = {
        "HELMHIVE_RUNNER_NAME": rig.name,
        "HELMHIVE_NAMESPACE": rig.namespace,
        "HELMHIVE_POOL": rig.pool,
        "HELMHIVE_RUNNER_CONFIG": "/etc/helmhive/runner.json",
        "HELMHIVE_CREDENTIAL_GENERATION": "1",
        "HELMHIVE_RUNNER_IMAGE": image,
        "HELMHIVE_SHUTDOWN_GRACE_SECONDS": "5",
        "KUBECONFIG": f"{KUBE_DIR}/kubeconfig",
        # The runner turns faulthandler on itself; this covers its imports too, so a crash at
        # any point prints every thread's stack into the log.
        "PYTHONFAULTHANDLER": "1",
    }
    return volumes, env


def _runner_pod(
    rig: RunnerRig, image: str, identities: IdentityFactory, cluster: ClusterHandle, runner_json: dict[str, Any]
) -> tuple[list[Volume], dict[str, str]]:
    """RBAC, the Pod object and a token bound to it, then the pod's volumes and environment."""
    rig.ensure_rbac()
    pod = rig.ensure_pod()
    identity = identities(rig.namespace, rig.service_account, bound_pod=pod, create=False)
    token = yaml.safe_load(identity.kubeconfig.read_text(encoding="utf-8"))["users"][0]["user"]["token"]
    kube_dir = _kube_dir(rig.root / "kube", cluster.kubeconfig, token, rig.service_account, rig.namespace)
    return _runner_volumes(rig, image, runner_json, kube_dir)


def _run_runner(image: str, rig: RunnerRig, volumes: list[Volume], env: dict[str, str]) -> tuple[RunnerProc, _Started]:
    """``helmhive runner run`` (the image's CMD) from the image, logging to the rig's directory."""
    log_path = rig.root / "runner.log"
    with log_path.open("wb") as log:
        started = _start(image, None, log=log, env=env, volumes=volumes, tmpfs=("/tmp",))
    return RunnerProc(popen=started.popen, log_path=log_path), started


def _assert_stopped_cleanly(proc: RunnerProc, code: int) -> str:
    """Exit 0 after SIGTERM, and the last line says no thread was left running (docs/runners.md, "Stopping")."""
    log = proc.raw_log()
    assert code == 0, f"the runner exited with {code} after SIGTERM; its log's tail:\n{log[-4000:]}"
    lines = proc.lines()
    assert lines and lines[-1]["message"] == "runner exiting", log[-4000:]
    assert lines[-1]["exitCode"] == 0 and lines[-1]["threads"] == [], lines[-1]
    return log


def test_the_runner_from_its_image_registers_with_the_reference_agent(
    runner_image: str,
    cluster: ClusterHandle,
    crds: list[str],
    kube: Kube,
    namespace: str,
    service_account_identity: IdentityFactory,
    tmp_path: Path,
) -> None:
    rig = RunnerRig(kube=kube, namespace=namespace, identities=service_account_identity, root=tmp_path / "rig")
    runner_json = {
        "provider": "reference",
        "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
        "placementLabels": {"domain": "code"},
        "capabilities": ["structured-output"],
        "heartbeat": {"leaseDurationSeconds": 5, "renewIntervalSeconds": 1, "reportRefreshSeconds": 30},
        "credentialEnvName": "HELMHIVE_REFERENCE_AGENT_TOKEN",
    }
    volumes, env = _runner_pod(rig, runner_image, service_account_identity, cluster, runner_json)
    secret = _volume(tmp_path / "secret", mode=0o500)
    (secret / "credential").write_text(CANARY, encoding="utf-8")
    os.chown(secret / "credential", POD_UID, POD_UID)
    volumes.append(Volume(source=secret, target="/var/run/helmhive/credential", read_only=True))
    env["HELMHIVE_CREDENTIAL_FILE"] = "/var/run/helmhive/credential/credential"
    proc, started = _run_runner(runner_image, rig, volumes, env)
    try:
        report = rig.wait_registered(proc, timeout=120)
        assert report["adapter"]["type"] == "acp"
        assert report["adapter"]["name"] == "helmhive-reference-agent"
        assert report["authentication"]["state"] == "Authenticated", report["authentication"]
        rig.wait_events("Registered")
        assert rig.lease_exists()
    finally:
        code = _stop(started)
    log = _assert_stopped_cleanly(proc, code)
    wait_for(lambda: not rig.lease_exists(), timeout=30, describe="the runner to release its Lease on SIGTERM")
    assert CANARY not in log
    assert "Read-only file system" not in log, log[-4000:]
    # The credential copy and the probe's HOME went to the state volume, nothing to the root.
    assert (rig.root / "state" / "credential" / "credential").exists()


def test_the_node_runner_from_its_image_registers_with_the_claude_cli(
    node_image: str,
    cluster: ClusterHandle,
    crds: list[str],
    kube: Kube,
    namespace: str,
    service_account_identity: IdentityFactory,
    tmp_path: Path,
) -> None:
    rig = RunnerRig(kube=kube, namespace=namespace, identities=service_account_identity, root=tmp_path / "rig")
    runner_json = {
        "provider": "anthropic",
        "adapter": {"type": "claude-cli", "claudeCli": {"path": "claude"}},
        "capabilities": ["structured-output"],
        "heartbeat": {"leaseDurationSeconds": 5, "renewIntervalSeconds": 1, "reportRefreshSeconds": 30},
    }
    volumes, env = _runner_pod(rig, node_image, service_account_identity, cluster, runner_json)
    login = _volume(tmp_path / "login")
    volumes.append(Volume(source=login, target="/var/run/helmhive/login"))
    env["HELMHIVE_CREDENTIAL_DIR"] = "/var/run/helmhive/login"
    proc, started = _run_runner(node_image, rig, volumes, env)
    try:
        report = rig.wait_registered(proc, timeout=120)
        assert report["adapter"] == {"type": "claude-cli", "name": "claude-code", "version": CLAUDE_CODE[1]}, report
        assert report["authentication"]["state"] == "Unauthenticated"
        assert report["authentication"]["reason"] == "NotLoggedIn"
        assert proc.popen.poll() is None, "the runner keeps running (NeedsAttention), it does not crash"
    finally:
        code = _stop(started)
    # Stopped at once after registering, while its watches have only just started: the moment
    # a CI run saw this runner die of SIGABRT after a clean stop (tests/runner/test_runner_shutdown.py).
    log = _assert_stopped_cleanly(proc, code)
    assert "Read-only file system" not in log, log[-4000:]

"""The images, built from their Dockerfiles without Docker, run as uid 65532 on a read-only root.

Each image is built by ``helmhive dev rootfs build`` (:mod:`helmhive.devcluster.rootfs`): the
Dockerfile's own stages carried out in a cached ``debootstrap --variant=minbase`` tree of Debian
bookworm (the first build on a machine takes about a minute more; the log shows each step).
Then the image's entry points run from the tree the way a container runtime with
``readOnlyRootFilesystem: true`` would run them: the root read-only, ``/tmp`` an empty tmpfs,
the pod's volumes bound in, as the image's user with no capabilities and ``no_new_privs``.

- the operator image has no shell; ``helmhive --help`` and ``operator run --help`` work; the
  real operator started from it against the test API server publishes the envelope catalogue
  and serves liveness and metrics;
- the runner image registers a Runner with the reference agent; the ``node`` flavour registers
  one with the Claude CLI it ships (and honestly reports it is not logged in).

What this does not prove (no Docker engine here) is in ``docs/development.md``, "Images".
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from helmhive.devcluster.dockerfile import DockerfileError
from helmhive.devcluster.rootfs import Bind, RootfsError, build_image, run_image
from helmhive.policy.envelopes import ENVELOPES
from runner.npm_agents import CLAUDE_CODE
from runner.program_harness import CANARY, RunnerProc, RunnerRig

REPO = Path(__file__).resolve().parents[2]
POD_UID = 65532
KUBE_DIR = "/var/run/helmhive-test"
BUILD_TIMEOUT_S = 1500

# Every test here waits for image builds (minutes, as root), so all of them stay out of the quick
# `-m "not cluster"` runs, including the two that need no API server.
pytestmark = [pytest.mark.timeout(BUILD_TIMEOUT_S), pytest.mark.cluster]


class _Progress:
    """The build log: every line to a file; the builder's own step lines to the terminal too."""

    def __init__(self, path: Path, config: pytest.Config) -> None:
        self.name = str(path)
        self._file = path.open("a", encoding="utf-8")
        self._reporter = config.pluginmanager.get_plugin("terminalreporter")
        self._capture = config.pluginmanager.get_plugin("capturemanager")

    def write(self, text: str) -> int:
        self._file.write(text)
        if text.startswith("rootfs: ") and self._reporter is not None:
            # Shown as it happens (a cold build takes minutes), not only in a failure's captured output.
            with self._capture.global_and_fixture_disabled() if self._capture else contextlib.nullcontext():
                self._reporter.write_line(text.rstrip())
        return len(text)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _ensure_debootstrap(progress: _Progress) -> None:
    """debootstrap comes from Debian's packages; install it (we run as root, like CI) if it is missing."""
    if shutil.which("debootstrap"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail("debootstrap is not installed and cannot be installed here (needs root and apt-get)", pytrace=False)
    progress.write("rootfs: installing debootstrap from Debian's packages (apt-get)\n")
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "debootstrap"]):
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}", pytrace=False)


def _build(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, dockerfile: str, target: str
) -> Path:
    out = tmp_path_factory.mktemp(f"image-{target}")
    progress = _Progress(out / "build.log", request.config)
    try:
        _ensure_debootstrap(progress)
        build_image(REPO / dockerfile, context=REPO, target=target, output=out / "image", log=progress)  # type: ignore[arg-type]
    except (RootfsError, DockerfileError, OSError, subprocess.CalledProcessError) as err:
        pytest.fail(f"building {dockerfile} --target {target} failed: {err}\n(log: {progress.name})", pytrace=False)
    finally:
        progress.close()
    return out / "image"


@pytest.fixture(scope="module")
def operator_image(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    image = _build(request, tmp_path_factory, "images/operator/Dockerfile", "operator")
    yield image
    shutil.rmtree(image, ignore_errors=True)  # hundreds of MB; the build log stays


@pytest.fixture(scope="module")
def runner_image(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    image = _build(request, tmp_path_factory, "images/runner/Dockerfile", "base")
    yield image
    shutil.rmtree(image, ignore_errors=True)  # hundreds of MB; the build log stays


@pytest.fixture(scope="module")
def node_image(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    image = _build(request, tmp_path_factory, "images/runner/Dockerfile", "node")
    yield image
    shutil.rmtree(image, ignore_errors=True)  # hundreds of MB; the build log stays


def _run(image: Path, args: list[str] | None, *, entrypoint: list[str] | None = None, **kwargs: Any) -> tuple[int, str]:
    proc = run_image(image, args, entrypoint=entrypoint, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out.decode(errors="replace")


_PROBE = """
import os, pathlib
print("ids", os.getuid(), os.getgid(), os.getgroups())
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
    """What _PROBE printed: uid/gid 65532 and no groups, a read-only root, a writable /tmp, no privileges."""
    assert f"ids {POD_UID} {POD_UID} []" in out, out
    assert "root-write Read-only file system" in out, out
    assert "tmp-write ok" in out, out
    assert "no_new_privs 1" in out, out
    assert "caps 0000000000000000" in out, out


def test_the_operator_image_has_no_shell_and_runs_read_only_as_65532(operator_image: Path) -> None:
    root = operator_image / "rootfs"
    config = json.loads((operator_image / "config.json").read_text(encoding="utf-8"))
    assert config["user"] == f"{POD_UID}:{POD_UID}"
    for tool in ("bin/sh", "bin/bash", "bin/dash", "usr/bin/apt-get", "usr/bin/dpkg", "usr/bin/perl", "bin/ls"):
        assert not (root / tool).exists() and not (root / tool).is_symlink(), f"{tool} is in the operator image"
    assert (root / "opt/helmhive/venv/bin/helmhive").exists()

    code, out = _run(operator_image, ["--help"])
    assert code == 0, out
    assert "operator" in out and "Run the Helmhive operator" in out
    code, out = _run(operator_image, ["operator", "run", "--help"])
    assert code == 0, out
    assert "--webhook-port" in out and "--liveness" in out
    code, out = _run(operator_image, ["-c", _PROBE], entrypoint=["python3"])
    assert code == 0, out
    _assert_contained(out)


def test_the_runner_images_run_read_only_as_65532(runner_image: Path, node_image: Path) -> None:
    for image in (runner_image, node_image):
        code, out = _run(image, ["runner", "run", "--help"])
        assert code == 0, out
        assert "Register this runner" in out
        code, out = _run(image, ["-c", _PROBE], entrypoint=["python3"])
        assert code == 0, out
        _assert_contained(out)
        code, out = _run(image, ["--version"], entrypoint=["git"])
        assert code == 0 and out.startswith("git version"), out
    code, out = _run(node_image, ["--version"], entrypoint=["node"])
    assert code == 0 and out.strip().startswith("v22."), out
    home = Bind(_volume(node_image.parent / "home"), "/home/runner")
    code, out = _run(node_image, ["--version"], entrypoint=["claude"], binds=[home])
    assert code == 0 and CLAUDE_CODE[1] in out, out
    assert (node_image / "rootfs/opt/helmhive/agents/node_modules/.bin/claude-agent-acp").exists()
    # Built after `base` in this session, `node` reuses the stages they share from the stage cache.
    log = (node_image.parent / "build.log").read_text(encoding="utf-8")
    for stage in ("python", "deps", "build", "base"):
        assert f"stage {stage} from the cache" in log, log[-3000:]


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


def _stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def test_the_operator_from_its_image_publishes_the_envelopes(
    operator_image: Path,
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
        proc = run_image(
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
            binds=[Bind(kube_dir, KUBE_DIR, read_only=True)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
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
        code = _stop(proc)
    text = log_text()
    assert code == 0, f"the operator exited with {code} after SIGTERM:\n{text[-4000:]}"
    assert "Read-only file system" not in text, text[-4000:]
    assert token not in text


def _runner_volumes(rig: RunnerRig, runner_json: dict[str, Any], kube_dir: Path) -> tuple[list[Bind], dict[str, str]]:
    """The runner pod's volumes and environment (helmhive.policy.runners.pool), as host directories."""
    config = _volume(rig.root / "config", mode=0o755)
    (config / "runner.json").write_text(json.dumps(runner_json), encoding="utf-8")
    (config / "runner.json").chmod(0o444)
    binds = [
        Bind(config, "/etc/helmhive", read_only=True),
        Bind(kube_dir, KUBE_DIR, read_only=True),
        Bind(_volume(rig.root / "state"), "/var/lib/helmhive"),
        Bind(_volume(rig.root / "home"), "/home/runner"),
    ]
    env = {
        "HELMHIVE_RUNNER_NAME": rig.name,
        "HELMHIVE_NAMESPACE": rig.namespace,
        "HELMHIVE_POOL": rig.pool,
        "HELMHIVE_RUNNER_CONFIG": "/etc/helmhive/runner.json",
        "HELMHIVE_CREDENTIAL_GENERATION": "1",
        "HELMHIVE_RUNNER_IMAGE": "helmhive/runner:rootfs-test",
        "HELMHIVE_SHUTDOWN_GRACE_SECONDS": "5",
        "KUBECONFIG": f"{KUBE_DIR}/kubeconfig",
        # The runner turns faulthandler on itself; this covers its imports too, so a crash at
        # any point prints every thread's stack into the log.
        "PYTHONFAULTHANDLER": "1",
    }
    return binds, env


def _runner_pod(
    rig: RunnerRig, identities: IdentityFactory, cluster: ClusterHandle, runner_json: dict[str, Any]
) -> tuple[list[Bind], dict[str, str]]:
    """RBAC, the Pod object and a token bound to it, then the pod's volumes and environment."""
    rig.ensure_rbac()
    pod = rig.ensure_pod()
    identity = identities(rig.namespace, rig.service_account, bound_pod=pod, create=False)
    token = yaml.safe_load(identity.kubeconfig.read_text(encoding="utf-8"))["users"][0]["user"]["token"]
    kube_dir = _kube_dir(rig.root / "kube", cluster.kubeconfig, token, rig.service_account, rig.namespace)
    return _runner_volumes(rig, runner_json, kube_dir)


def _run_runner(image: Path, rig: RunnerRig, binds: list[Bind], env: dict[str, str]) -> RunnerProc:
    """``helmhive runner run`` (the image's CMD) from the image, logging to the rig's directory."""
    log_path = rig.root / "runner.log"
    with log_path.open("wb") as log:
        popen = run_image(image, None, env=env, binds=binds, stdout=log, stderr=subprocess.STDOUT)
    return RunnerProc(popen=popen, log_path=log_path)


def _assert_stopped_cleanly(proc: RunnerProc, code: int) -> str:
    """Exit 0 after SIGTERM, and the last line says no thread was left running (docs/runners.md, "Stopping")."""
    log = proc.raw_log()
    assert code == 0, f"the runner exited with {code} after SIGTERM; its log's tail:\n{log[-4000:]}"
    lines = proc.lines()
    assert lines and lines[-1]["message"] == "runner exiting", log[-4000:]
    assert lines[-1]["exitCode"] == 0 and lines[-1]["threads"] == [], lines[-1]
    return log


def test_the_runner_from_its_image_registers_with_the_reference_agent(
    runner_image: Path,
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
    binds, env = _runner_pod(rig, service_account_identity, cluster, runner_json)
    secret = _volume(tmp_path / "secret", mode=0o500)
    (secret / "credential").write_text(CANARY, encoding="utf-8")
    os.chown(secret / "credential", POD_UID, POD_UID)
    binds.append(Bind(secret, "/var/run/helmhive/credential", read_only=True))
    env["HELMHIVE_CREDENTIAL_FILE"] = "/var/run/helmhive/credential/credential"
    proc = _run_runner(runner_image, rig, binds, env)
    try:
        report = rig.wait_registered(proc, timeout=120)
        assert report["adapter"]["type"] == "acp"
        assert report["adapter"]["name"] == "helmhive-reference-agent"
        assert report["authentication"]["state"] == "Authenticated", report["authentication"]
        rig.wait_events("Registered")
        assert rig.lease_exists()
    finally:
        code = _stop(proc.popen)
    log = _assert_stopped_cleanly(proc, code)
    wait_for(lambda: not rig.lease_exists(), timeout=30, describe="the runner to release its Lease on SIGTERM")
    assert CANARY not in log
    assert "Read-only file system" not in log, log[-4000:]
    # The credential copy and the probe's HOME went to the state volume, nothing to the root.
    assert (rig.root / "state" / "credential" / "credential").exists()


def test_the_node_runner_from_its_image_registers_with_the_claude_cli(
    node_image: Path,
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
    binds, env = _runner_pod(rig, service_account_identity, cluster, runner_json)
    login = _volume(tmp_path / "login")
    binds.append(Bind(login, "/var/run/helmhive/login"))
    env["HELMHIVE_CREDENTIAL_DIR"] = "/var/run/helmhive/login"
    proc = _run_runner(node_image, rig, binds, env)
    try:
        report = rig.wait_registered(proc, timeout=120)
        assert report["adapter"] == {"type": "claude-cli", "name": "claude-code", "version": CLAUDE_CODE[1]}, report
        assert report["authentication"]["state"] == "Unauthenticated"
        assert report["authentication"]["reason"] == "NotLoggedIn"
        assert proc.popen.poll() is None, "the runner keeps running (NeedsAttention), it does not crash"
    finally:
        code = _stop(proc.popen)
    # Stopped at once after registering, while its watches have only just started: the moment
    # a CI run saw this runner die of SIGABRT after a clean stop (tests/runner/test_runner_shutdown.py).
    log = _assert_stopped_cleanly(proc, code)
    assert "Read-only file system" not in log, log[-4000:]

"""pytest plugin: options, hooks and fixtures for tests against a real Kubernetes API.

Loaded by ``tests/conftest.py``. Options::

    --kubeconfig PATH   use an existing cluster (also $HELMHIVE_TEST_KUBECONFIG)
    --kind              use a kind cluster through pytest-kind, with the kind, kubectl and node image
                        that ``helmhive dev kind`` builds offline (harness.kind); fails if unavailable

Without either, the session starts the local control plane (see :mod:`harness.cluster`).

Fixtures (session scope unless noted):

``cluster``            :class:`harness.cluster.ClusterHandle` (source, admin kubeconfig, kubectl, info)
``crds``               installs every CRD in ``<repo>/crds/*.yaml`` and waits for Established;
                       returns their names (none if the directory holds no YAML)
``api_client``         admin ``kubernetes.client.ApiClient``
``core_v1``            ``CoreV1Api``;  ``custom_objects``: ``CustomObjectsApi``
``kube``               :class:`Kube`, all of the above plus RBAC/Apps/Apiextensions/Authentication APIs
``kubectl``            :class:`harness.kubectl.Kubectl` against the cluster as admin
``outage``             (function) :class:`harness.outage.ApiServerOutage` for the local control
                       plane; the API server is up again, and kube-controller-manager serving, afterwards
``namespace``          (function) a fresh namespace, deleted afterwards; its ``default``
                       ServiceAccount exists before the test starts
``service_account_identity``  (function) factory: ``(namespace, name, *, bound_pod=None,
                       audiences=None, create=True) -> Identity`` with a real TokenRequest token,
                       a kubeconfig file and ``api_client()``

Any test that uses ``cluster`` (directly or through another fixture) gets the
``cluster`` marker automatically, so ``-m "not cluster"`` runs only the rest.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.cluster import ClusterHandle, find_kubectl, install_crds
from harness.identity import Identity, ensure_service_account, mint_token, token_kubeconfig
from harness.kube import IdentityFactory, Kube
from harness.kubectl import Kubectl
from harness.outage import ApiServerOutage
from harness.wait import wait_for
from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import Binaries, BuildError, ensure_binaries
from helmhive.devcluster.procs import log_tail

_BINARIES = pytest.StashKey[Binaries]()
_BUILD_ERROR = pytest.StashKey[str]()
_WORKDIR = pytest.StashKey[Path]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("helmhive", "Helmhive test cluster")
    group.addoption(
        "--kubeconfig",
        default=os.environ.get("HELMHIVE_TEST_KUBECONFIG") or None,
        help="Run cluster tests against this existing cluster (default: $HELMHIVE_TEST_KUBECONFIG; "
        "else start the local control plane).",
    )
    group.addoption(
        "--kind",
        action="store_true",
        default=False,
        help="Run cluster tests against a kind cluster made with pytest-kind (needs Docker).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs a real Kubernetes API (added automatically)")


def _source(config: pytest.Config) -> str:
    if config.getoption("--kind"):
        return "kind"
    return "kubeconfig" if config.getoption("--kubeconfig") else "local"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


def pytest_sessionstart(session: pytest.Session) -> None:
    """With test workers (pytest-xdist), build in the controller, where the terminal shows progress.

    The workers collect and run the tests; their output reaches the terminal only per test. So the
    controller builds (or finds) the binaries first, unless the run leaves cluster tests out, and
    the workers then find them in the cache (:mod:`helmhive.devcluster.cachelock` keeps two
    builders from racing in any case).
    """
    config = session.config
    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not workers or config.option.collectonly or _source(config) != "local":
        return
    if "not cluster" in (config.option.markexpr or ""):
        return
    _ensure_built(config)
    if _BUILD_ERROR in config.stash:
        pytest.exit(f"could not build the control-plane binaries: {config.stash[_BUILD_ERROR]}", returncode=1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the control-plane binaries now, outside any test's timeout, if a test needs them."""
    config = session.config
    if config.option.collectonly:
        return
    if any("kstatus" in getattr(item, "fixturenames", ()) for item in session.items):
        _prebuild_kstatus(config)
    if _source(config) != "local":
        return
    if any("cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        _ensure_built(config)


def _prebuild_kstatus(config: pytest.Config) -> None:
    """Build the kstatus program (``harness.kstatus_tool``) outside any test's timeout; a failure is
    left to the ``kstatus`` fixtures, which build again and fail their tests with the log."""
    from harness.kstatus_tool import ensure_kstatus

    log_path = Path(tempfile.mkdtemp(prefix="helmhive-kstatus-")) / "build.log"
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    with _BuildLog(log_path, reporter) as log, contextlib.suppress(BuildError, OSError):
        ensure_kstatus(log=log)


class _BuildLog(io.TextIOWrapper):
    """The build log file; 'building …' lines also go to the terminal so a cold build is visible."""

    def __init__(self, path: Path, reporter: Any) -> None:
        super().__init__(path.open("ab"), encoding="utf-8", line_buffering=True)
        self._reporter = reporter

    def write(self, text: str, /) -> int:
        if text.startswith(("building ", "  … still ", "done: go build")) and self._reporter is not None:
            self._reporter.write_line(f"helmhive: {text.rstrip()} (a cold build takes minutes; log {self.name})")
        return super().write(text)


def _ensure_built(config: pytest.Config) -> None:
    """Build or reuse the binaries once per session; keep the result or the error in the stash."""
    if _BINARIES in config.stash or _BUILD_ERROR in config.stash:
        return
    workdir = Path(tempfile.mkdtemp(prefix="helmhive-test-cluster-"))
    config.stash[_WORKDIR] = workdir
    build_log = workdir / "build.log"
    with _BuildLog(build_log, config.pluginmanager.get_plugin("terminalreporter")) as log:
        try:
            config.stash[_BINARIES] = ensure_binaries(log=log)
        except (BuildError, OSError, subprocess.CalledProcessError) as err:
            config.stash[_BUILD_ERROR] = f"{err}\n--- tail of {build_log}\n{log_tail(build_log)}"


def _kind_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterHandle]:
    from harness.kind import kind_cluster  # needs Docker and pytest-kind; only --kind imports it
    from helmhive.devcluster.build import BuildError as _BuildError
    from helmhive.devcluster.kind.cluster import KindError
    from helmhive.devcluster.kind.engine import EngineError

    try:
        context = kind_cluster("helmhive-tests")
        env = context.__enter__()
    except (_BuildError, EngineError, KindError) as err:
        pytest.fail(f"--kind: the kind cluster could not be made: {err}", pytrace=False)
    try:
        yield ClusterHandle(source="kind", kubeconfig=env.kubeconfig, kubectl=env.kubectl)
    finally:
        context.__exit__(None, None, None)


def _local_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterHandle]:
    config = request.config
    _ensure_built(config)
    if _BUILD_ERROR in config.stash:
        pytest.fail(f"could not build the control-plane binaries: {config.stash[_BUILD_ERROR]}", pytrace=False)
    binaries = config.stash[_BINARIES]
    state_dir = config.stash[_WORKDIR] / "state"
    try:
        info = devcluster.start(binaries, state_dir, tie_to_parent=True)
    except devcluster.ClusterError as err:
        failure = f"the local control plane did not start (state in {state_dir}): {err}"
    else:
        failure = None
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    # Belt and braces: the components also die with this process (parent-death signal).
    atexit.register(devcluster.stop, state_dir)
    try:
        yield ClusterHandle(
            source="local",
            kubeconfig=info.kubeconfig,
            kubectl=binaries.kubectl,
            info=info,
            expected_version=binaries.kube_version,
        )
    finally:
        devcluster.stop(state_dir)
        atexit.unregister(devcluster.stop)
        shutil.rmtree(config.stash[_WORKDIR], ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[ClusterHandle]:
    """The session's Kubernetes cluster (local control plane, --kubeconfig or --kind)."""
    source = _source(request.config)
    if source == "kind":
        yield from _kind_cluster(request)
    elif source == "kubeconfig":
        path = Path(request.config.getoption("--kubeconfig")).expanduser()
        if not path.is_file():
            pytest.fail(f"--kubeconfig / HELMHIVE_TEST_KUBECONFIG names {path}, which does not exist", pytrace=False)
        yield ClusterHandle(source="kubeconfig", kubeconfig=path, kubectl=find_kubectl())
    else:
        yield from _local_cluster(request)


@pytest.fixture(scope="session")
def api_client(cluster: ClusterHandle) -> Iterator[client.ApiClient]:
    api = cluster.new_api_client()
    try:
        client.VersionApi(api).get_code()
    except Exception as err:
        api.close()
        pytest.fail(f"cannot reach the cluster of {cluster.kubeconfig}: {err}", pytrace=False)
    yield api
    api.close()


@pytest.fixture(scope="session")
def core_v1(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def custom_objects(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture(scope="session")
def kube(api_client: client.ApiClient, core_v1: client.CoreV1Api, custom_objects: client.CustomObjectsApi) -> Kube:
    return Kube(
        api_client=api_client,
        core=core_v1,
        custom=custom_objects,
        rbac=client.RbacAuthorizationV1Api(api_client),
        apps=client.AppsV1Api(api_client),
        apiextensions=client.ApiextensionsV1Api(api_client),
        authentication=client.AuthenticationV1Api(api_client),
    )


@pytest.fixture(scope="session")
def crds(request: pytest.FixtureRequest, api_client: client.ApiClient) -> list[str]:
    """Install ``<repo>/crds/*.yaml`` once per session; return the CRD names."""
    return install_crds(api_client, request.config.rootpath / "crds")


@pytest.fixture(scope="session")
def kubectl(cluster: ClusterHandle) -> Kubectl:
    if cluster.kubectl is None:
        pytest.fail("no kubectl: set HELMHIVE_KUBECTL, build it with `helmhive dev cluster up`, or put it on PATH")
    return Kubectl(binary=cluster.kubectl, kubeconfig=cluster.kubeconfig)


@pytest.fixture
def outage(cluster: ClusterHandle) -> Iterator[ApiServerOutage]:
    made = ApiServerOutage(cluster)
    yield made
    made.ensure_up()


def _namespace_prefix(nodeid: str) -> str:
    name = nodeid.rsplit("::", 1)[-1].split("[", 1)[0].lower()
    return ("t-" + re.sub(r"[^a-z0-9-]+", "-", name).strip("-"))[:40].rstrip("-") + "-"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core_v1: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace (named after the test) with its default ServiceAccount; deleted afterwards."""
    body = client.V1Namespace(
        metadata=client.V1ObjectMeta(
            generate_name=_namespace_prefix(request.node.nodeid),
            labels={"helmhive.dev/test": "true"},
            annotations={"helmhive.dev/test-id": request.node.nodeid[:1000]},
        )
    )
    name: str = core_v1.create_namespace(body).metadata.name
    wait_for(
        lambda: core_v1.read_namespaced_service_account("default", name),
        timeout=90,
        describe=f"ServiceAccount {name}/default (kube-controller-manager's serviceaccount controller)",
    )
    yield name
    with contextlib.suppress(ApiException):
        core_v1.delete_namespace(name)


@pytest.fixture
def service_account_identity(
    cluster: ClusterHandle, core_v1: client.CoreV1Api, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IdentityFactory]:
    made: list[Identity] = []
    directory = tmp_path_factory.mktemp("identities")

    def make(
        namespace: str,
        name: str,
        *,
        bound_pod: client.V1Pod | str | None = None,
        audiences: list[str] | None = None,
        expiration_seconds: int = 600,
        create: bool = True,
    ) -> Identity:
        if create:
            ensure_service_account(core_v1, namespace, name)
        token = mint_token(
            core_v1,
            namespace,
            name,
            bound_pod=bound_pod,
            audiences=audiences,
            expiration_seconds=expiration_seconds,
        )
        path = directory / f"{namespace}.{name}.{len(made)}.kubeconfig"
        user = f"system:serviceaccount:{namespace}:{name}"
        token_kubeconfig(cluster.kubeconfig, token, path, user=user, namespace=namespace)
        identity = Identity(namespace=namespace, service_account=name, token=token, kubeconfig=path)
        made.append(identity)
        return identity

    yield make
    for identity in made:
        identity.close()

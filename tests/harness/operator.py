"""Fixtures that install Helmhive into the test cluster and run the real operator process.

``helmhive_install`` (session)  applies :func:`helmhive.deploy.manifests.build_install_manifests`:
                                the operator's namespace, ServiceAccount, ClusterRole/Binding and
                                the envelope ValidatingAdmissionPolicy (after the CRDs).
``operator`` (module)           runs ``helmhive operator run`` as a subprocess, authenticated as
                                the operator's ServiceAccount with a real TokenRequest token, and
                                waits until its liveness endpoint answers and the envelopes exist.
                                The handle can stop, kill and restart it, and reads its JSON log.
                                A test module may set ``OPERATOR_ENV = {"HELMHIVE_...": "..."}``
                                to run its operator with other settings. Its Prometheus
                                ``/metrics`` listens on a free loopback port (``metrics_url``).
``operator_factory`` (function) starts any number of operators with extra flags (service-mode
                                webhooks, leader election): ``start(name, args=[...],
                                env={...}, webhook_addr=...)``. All are stopped afterwards and the
                                ``helmhive.dev`` webhook configurations removed. Do not combine
                                it with ``operator`` in one test.
:class:`WebhookService`         a selector-less Service and hand-made EndpointSlices that point
                                the API server (``--enable-aggregator-routing``) at operators on
                                this host's own address (:func:`host_ip`; Kubernetes refuses
                                loopback endpoint addresses).

The operator logs to a file, so tests can search it for planted canary values.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client, utils

from harness.cluster import ClusterHandle
from harness.identity import mint_token, token_kubeconfig
from harness.wait import wait_for
from helmhive.deploy.manifests import OperatorIdentity, build_install_manifests

__all__ = ["OperatorFactory", "OperatorProcess", "WebhookService", "free_port", "host_ip"]

IDENTITY = OperatorIdentity()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def host_ip() -> str:
    """This host's non-loopback IPv4 address (the source address of its default route).

    An EndpointSlice may not hold a loopback address, so a Service-based webhook on this host is
    reached at this one. A machine without one fails the test that needs it (the CI machine has one).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("198.51.100.1", 9))  # TEST-NET-2; a UDP connect sends nothing, it only picks a route
        except OSError as err:
            raise AssertionError(f"this host has no IPv4 route, so no non-loopback address: {err}") from err
        address: str = sock.getsockname()[0]
    if address.startswith("127.") or address == "0.0.0.0":
        raise AssertionError(f"this host's routed IPv4 address is {address}; a webhook endpoint needs another")
    return address


def _apply(api: client.ApiClient, doc: dict[str, Any]) -> None:
    try:
        utils.create_from_dict(api, doc)
    except utils.FailToCreateError as err:
        if not all(getattr(e, "status", None) == 409 for e in err.api_exceptions):
            raise


@pytest.fixture(scope="session")
def helmhive_install(api_client: client.ApiClient, crds: list[str]) -> OperatorIdentity:
    """Install the operator's identity, RBAC and admission policy (once per session)."""
    for doc in build_install_manifests(IDENTITY):
        _apply(api_client, doc)
    return IDENTITY


@dataclass
class OperatorProcess:
    """A running ``helmhive operator run`` and the means to stop or restart it."""

    kubeconfig: Path
    log_path: Path
    port: int
    webhook_port: int = 0
    metrics_port: int = 0
    """0: the operator serves no ``/metrics`` (its default port 9090 is never used in tests)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    webhook_addr: str = "127.0.0.1"
    extra_args: list[str] = field(default_factory=list)
    """More ``helmhive operator run`` flags (after the harness's own, so they win)."""

    @property
    def liveness_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/healthz"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> None:
        env = {**os.environ, **self.extra_env}
        env.pop("KUBECONFIG", None)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "helmhive",
                    "operator",
                    "run",
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--liveness",
                    self.liveness_url,
                    f"--webhook-addr={self.webhook_addr}",
                    "--webhook-host=127.0.0.1",
                    f"--webhook-port={self.webhook_port}",
                    "--metrics-addr=127.0.0.1",
                    f"--metrics-port={self.metrics_port}",
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            wait_for(
                self._live,
                timeout=60,
                ignore=(httpx.HTTPError,),
                describe=f"operator liveness at {self.liveness_url} (log {self.log_path})",
            )
        except BaseException:
            self.stop(signal.SIGKILL)  # never leave a half-started operator behind to act on later tests
            raise

    def _live(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        return httpx.get(self.liveness_url, timeout=2).status_code == 200

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        code = self.proc.returncode
        self.proc = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines (non-JSON lines, such as library warnings, are skipped)."""
        records = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
        return records


def _operator_kubeconfig(
    cluster: ClusterHandle, api_client: client.ApiClient, identity: OperatorIdentity, workdir: Path
) -> Path:
    """A kubeconfig for the operator's ServiceAccount (a real TokenRequest token)."""
    core = client.CoreV1Api(api_client)
    token = mint_token(core, identity.namespace, identity.service_account, expiration_seconds=6 * 3600)
    return token_kubeconfig(cluster.kubeconfig, token, workdir / "kubeconfig", user=identity.service_account)


def _delete_webhook_configurations(api_client: client.ApiClient) -> None:
    admission = client.AdmissionregistrationV1Api(api_client)
    for delete in (
        admission.delete_validating_webhook_configuration,
        admission.delete_mutating_webhook_configuration,
    ):
        try:
            delete("helmhive.dev")
        except client.ApiException as err:
            if err.status != 404:
                raise


class OperatorFactory:
    """Starts operators (the ``operator_factory`` fixture); each gets its own ports and log."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.started: list[OperatorProcess] = []

    def __call__(
        self,
        name: str,
        *,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        webhook_addr: str = "127.0.0.1",
    ) -> OperatorProcess:
        handle = OperatorProcess(
            kubeconfig=self.kubeconfig,
            log_path=self.workdir / f"{name}.log",
            port=free_port(),
            webhook_port=free_port(),
            metrics_port=free_port(),
            extra_env=dict(env or {}),
            webhook_addr=webhook_addr,
            extra_args=list(args or []),
        )
        self.started.append(handle)
        handle.start()
        return handle


@pytest.fixture
def operator_factory(
    cluster: ClusterHandle,
    api_client: client.ApiClient,
    helmhive_install: OperatorIdentity,
    tmp_path: Path,
) -> Iterator[OperatorFactory]:
    """Start operators with any flags; all are stopped afterwards and the webhook configurations removed."""
    factory = OperatorFactory(_operator_kubeconfig(cluster, api_client, helmhive_install, tmp_path), tmp_path)
    try:
        yield factory
    finally:
        for handle in factory.started:
            handle.stop()
        _delete_webhook_configurations(api_client)


@dataclass
class WebhookService:
    """A selector-less Service ``name`` (port 443, named ``webhook``) whose EndpointSlices the test writes.

    Without a selector no controller manages its endpoints; each :meth:`add_endpoint` is one
    EndpointSlice (one address and port), as the EndpointSlice controller would write for a pod.
    """

    core: client.CoreV1Api
    discovery: client.DiscoveryV1Api
    namespace: str
    name: str = "helmhive-webhook"

    def create(self) -> None:
        self.core.create_namespaced_service(
            self.namespace,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": self.name},
                "spec": {"ports": [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]},
            },
        )

    def add_endpoint(self, key: str, address: str, port: int) -> None:
        self.discovery.create_namespaced_endpoint_slice(
            self.namespace,
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{self.name}-{key}",
                    "labels": {
                        "kubernetes.io/service-name": self.name,
                        "endpointslice.kubernetes.io/managed-by": "tests.helmhive.dev",
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
                "ports": [{"name": "webhook", "port": port, "protocol": "TCP"}],
            },
        )

    def remove_endpoint(self, key: str) -> None:
        self.discovery.delete_namespaced_endpoint_slice(f"{self.name}-{key}", self.namespace)

    def service_args(self) -> list[str]:
        """The operator flags for service mode against this Service."""
        return [f"--webhook-service-name={self.name}", f"--webhook-service-namespace={self.namespace}"]


@pytest.fixture(scope="module")
def operator(
    request: pytest.FixtureRequest,
    cluster: ClusterHandle,
    api_client: client.ApiClient,
    helmhive_install: OperatorIdentity,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The real operator, running as its own ServiceAccount, for the test module that uses it.

    Tests elsewhere (the runner's) play the operator's part themselves, so the operator is
    stopped when its module ends (``tests/operator`` cannot be a package: it would shadow the
    standard library's ``operator``), and its webhook configurations are removed with it: their
    ``failurePolicy: Fail`` would otherwise refuse every Profile write once it is gone.
    """
    workdir = tmp_path_factory.mktemp("operator")
    kubeconfig = _operator_kubeconfig(cluster, api_client, helmhive_install, workdir)
    handle = OperatorProcess(
        kubeconfig=kubeconfig,
        log_path=workdir / "operator.log",
        port=free_port(),
        webhook_port=free_port(),
        metrics_port=free_port(),
        extra_env=dict(getattr(request.module, "OPERATOR_ENV", {})),
    )
    handle.start()
    custom = client.CustomObjectsApi(api_client)
    try:
        wait_for(
            lambda: len(custom.list_cluster_custom_object("helmhive.dev", "v1alpha1", "envelopes")["items"]) >= 7,
            timeout=60,
            describe="the operator to publish seven envelopes",
        )
        yield handle
    finally:
        handle.stop()
        _delete_webhook_configurations(api_client)

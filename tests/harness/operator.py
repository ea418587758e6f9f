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

__all__ = ["OperatorProcess", "free_port"]

IDENTITY = OperatorIdentity()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
                    "--webhook-addr=127.0.0.1",
                    "--webhook-host=127.0.0.1",
                    f"--webhook-port={self.webhook_port}",
                    "--metrics-addr=127.0.0.1",
                    f"--metrics-port={self.metrics_port}",
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
    core = client.CoreV1Api(api_client)
    token = mint_token(core, helmhive_install.namespace, helmhive_install.service_account, expiration_seconds=6 * 3600)
    workdir = tmp_path_factory.mktemp("operator")
    kubeconfig = token_kubeconfig(
        cluster.kubeconfig, token, workdir / "kubeconfig", user=helmhive_install.service_account
    )
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

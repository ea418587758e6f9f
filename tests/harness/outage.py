"""Take the session's local kube-apiserver away and bring it back, as the chaos rig does.

:class:`ApiServerOutage` stops the ``kube-apiserver`` of the local control plane
(:mod:`helmhive.devcluster`; SIGKILL by default, so the outage starts at once rather than after
the server's own shutdown delay) and later starts it again with the argv, ports, certificates and
etcd data recorded in its pid record (``benchmarks/chaos_rig.py``'s ``ControlPlane.restart`` does
the same in two steps). Clients see refused connections while it is down, exactly what a restart
or a crash looks like. Only for the ``local`` cluster source: a test that needs it fails (never
skips) on another.

Call :meth:`stop` and :meth:`start` from the test's main thread: the restarted server is tied to
this process with a parent-death signal, which Linux ties to the thread that started it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.cluster import ClusterHandle
from harness.wait import wait_for
from helmhive.devcluster.flags import StateLayout
from helmhive.devcluster.procs import ProcessRecord, client_tls, is_alive, log_tail, probe, read_record, spawn

__all__ = ["ApiServerOutage"]

NAME = "kube-apiserver"


@dataclass
class ApiServerOutage:
    cluster: ClusterHandle
    down_since: float | None = None
    stops: int = 0

    def __post_init__(self) -> None:
        if self.cluster.info is None:
            pytest.fail("this test stops the API server: it needs the local control plane (no --kubeconfig/--kind)")

    @property
    def layout(self) -> StateLayout:
        assert self.cluster.info is not None
        return StateLayout(self.cluster.info.state_dir)

    def _record(self) -> ProcessRecord:
        record = read_record(self.layout.pids, NAME)
        assert record is not None, "the local control plane has no kube-apiserver record"
        return record

    def ready(self) -> bool:
        assert self.cluster.info is not None
        pki = self.layout.pki
        tls = client_tls(ca_file=pki.ca_cert, cert_file=pki.cert("admin"), key_file=pki.key("admin"))
        return probe("/readyz", port=self.cluster.info.ports.apiserver, tls=tls)[0]

    def stop(self) -> None:
        """SIGKILL the API server and wait until it is gone (etcd keeps every object)."""
        record = self._record()
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(record.pid, 0)
        wait_for(lambda: not is_alive(record.pid, record.start_ticks), timeout=30, describe="the API server to die")
        self.down_since = time.monotonic()
        self.stops += 1

    def start(self, *, timeout: float = 120.0) -> float:
        """Start it again as it was; wait for ``/readyz``; return how long it was down."""
        record = self._record()
        fresh = spawn(NAME, record.argv, log_path=Path(record.log), pid_dir=self.layout.pids, tie_to_parent=True)
        try:
            wait_for(self.ready, timeout=timeout, describe="the API server ready after its restart")
        except BaseException:
            print(log_tail(fresh.log))
            raise
        down = time.monotonic() - (self.down_since or time.monotonic())
        self.down_since = None
        return down

    def _wait_controllers(self, *, timeout: float) -> None:
        """Wait until kube-controller-manager acts on new objects again.

        Its informers re-list after the restart with their own backoff; until they do, a new
        namespace gets no ``default`` ServiceAccount, and the tests that run next in this session
        (the cluster is shared) would wait for one. A probe namespace shows when it is back.
        """
        with self.cluster.new_api_client() as api:
            core = client.CoreV1Api(api)
            body = client.V1Namespace(metadata=client.V1ObjectMeta(generate_name="outage-probe-"))
            name = wait_for(
                lambda: core.create_namespace(body).metadata.name, timeout=timeout, describe="a probe namespace"
            )
            try:
                wait_for(
                    lambda: core.read_namespaced_service_account("default", name),
                    timeout=timeout,
                    describe="kube-controller-manager back after the API server's restart (a default ServiceAccount)",
                )
            finally:
                with contextlib.suppress(ApiException):
                    core.delete_namespace(name)

    def ensure_up(self) -> None:
        """Teardown: bring it back if a failed test left it down, and once it was stopped, wait
        until kube-controller-manager serves new namespaces again (not in :meth:`start`: a test
        may be timing what the operator does right after the server returns)."""
        if self.down_since is not None:
            self.start()
        if self.stops:
            self._wait_controllers(timeout=180.0)

"""Start, stop and inspect a real local control plane: etcd, kube-apiserver, kube-controller-manager.

All three run as ordinary processes on loopback, with ports chosen at start, and keep
everything in one state directory (see :class:`~helmhive.devcluster.flags.StateLayout`)::

    pki/             CA, serving and client certificates, ServiceAccount signing key
    etcd/            etcd data (kept across down/up)
    logs/<name>.log  each component's output
    pids/<name>.json the processes this directory started (``stop`` ends only those)
    admin.kubeconfig a system:masters client-certificate kubeconfig
    cluster.json     ports, versions, binaries and the measured start time

``start`` is idempotent: if every component is already running and healthy it returns
the running cluster's info with ``reused=True``. If a component fails to become ready in
time, everything started is stopped again and :class:`ClusterError` carries the tail of
that component's log.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from helmhive.api.kinds import GROUP
from helmhive.devcluster.build import Binaries
from helmhive.devcluster.flags import (
    Ports,
    StateLayout,
    apiserver_args,
    build_audit_policy,
    default_state_dir,
    etcd_args,
    kcm_args,
)
from helmhive.devcluster.kubeconfig import build_kubeconfig, dump_kubeconfig
from helmhive.devcluster.pki import ensure_pki
from helmhive.devcluster.procs import (
    LOOPBACK,
    ProcessRecord,
    client_tls,
    free_ports,
    is_alive,
    log_tail,
    probe,
    read_record,
    spawn,
    terminate,
)

__all__ = [
    "COMPONENTS",
    "ClusterError",
    "ClusterInfo",
    "ClusterStatus",
    "ComponentStatus",
    "default_state_dir",
    "load_info",
    "start",
    "status",
    "stop",
]

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager")


class ClusterError(RuntimeError):
    """The control plane could not be started; the message ends with the failing log's tail."""


@dataclass(frozen=True, kw_only=True)
class ClusterInfo:
    """A running local cluster, as recorded in ``cluster.json``."""

    state_dir: Path
    kubeconfig: Path
    server: str
    ca_file: Path
    ports: Ports
    kube_version: str
    etcd_version: str
    kubectl: Path
    started_at: str
    start_seconds: float
    component_seconds: dict[str, float] = field(default_factory=dict)
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("reused")
        for key in ("state_dir", "kubeconfig", "ca_file", "kubectl"):
            data[key] = str(data[key])
        return data


@dataclass(frozen=True, kw_only=True)
class ComponentStatus:
    """One component as ``status`` sees it."""

    name: str
    pid: int | None
    running: bool
    healthy: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class ClusterStatus:
    """All components of one state directory, and its recorded info if any."""

    state_dir: Path
    components: list[ComponentStatus]
    info: ClusterInfo | None

    @property
    def running(self) -> bool:
        return all(c.running for c in self.components)

    @property
    def healthy(self) -> bool:
        return all(c.healthy for c in self.components)

    @property
    def anything_running(self) -> bool:
        return any(c.running for c in self.components)


def load_info(state_dir: Path | None = None) -> ClusterInfo | None:
    """Return the info recorded by the last successful ``start`` in ``state_dir``, if any."""
    layout = StateLayout(state_dir or default_state_dir())
    try:
        data = json.loads(layout.info.read_text(encoding="utf-8"))
        return ClusterInfo(
            state_dir=Path(data["state_dir"]),
            kubeconfig=Path(data["kubeconfig"]),
            server=data["server"],
            ca_file=Path(data["ca_file"]),
            ports=Ports(**data["ports"]),
            kube_version=data["kube_version"],
            etcd_version=data["etcd_version"],
            kubectl=Path(data["kubectl"]),
            started_at=data["started_at"],
            start_seconds=float(data["start_seconds"]),
            component_seconds={k: float(v) for k, v in data.get("component_seconds", {}).items()},
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _probe_component(name: str, layout: StateLayout, ports: Ports) -> tuple[bool, str]:
    pki = layout.pki
    if name == "etcd":
        return probe("/readyz", port=ports.etcd_client)
    if name == "kube-apiserver":
        tls = client_tls(ca_file=pki.ca_cert, cert_file=pki.cert("admin"), key_file=pki.key("admin"))
        return probe("/readyz", port=ports.apiserver, tls=tls)
    return probe("/healthz", port=ports.kcm, tls=client_tls(ca_file=pki.ca_cert))


def status(state_dir: Path | None = None) -> ClusterStatus:
    """Report which recorded components run and whether each answers its health endpoint."""
    layout = StateLayout(state_dir or default_state_dir())
    info = load_info(layout.root)
    components: list[ComponentStatus] = []
    for name in COMPONENTS:
        record = read_record(layout.pids, name)
        if record is None:
            components.append(ComponentStatus(name=name, pid=None, running=False, healthy=False, detail="not started"))
            continue
        running = is_alive(record.pid, record.start_ticks)
        healthy, detail = False, "not running"
        if running and info is not None:
            healthy, detail = _probe_component(name, layout, info.ports)
        elif running:
            detail = "running, but cluster.json is missing"
        components.append(ComponentStatus(name=name, pid=record.pid, running=running, healthy=healthy, detail=detail))
    return ClusterStatus(state_dir=layout.root, components=components, info=info)


def stop(state_dir: Path | None = None) -> list[str]:
    """Stop the components this state directory started, newest first; return those that ran.

    ``cluster.json`` goes too, since it describes a running cluster; PKI and etcd data stay.
    """
    layout = StateLayout(state_dir or default_state_dir())
    stopped: list[str] = []
    for name in reversed(COMPONENTS):
        record = read_record(layout.pids, name)
        if record is None:
            continue
        if terminate(record):
            stopped.append(name)
        (layout.pids / f"{name}.json").unlink(missing_ok=True)
    layout.info.unlink(missing_ok=True)
    return stopped


def _write_kubeconfigs(layout: StateLayout, server: str) -> None:
    pki = layout.pki
    for path, user, pair in (
        (layout.admin_kubeconfig, "helmhive-admin", "admin"),
        (layout.kcm_kubeconfig, "system:kube-controller-manager", "kube-controller-manager"),
    ):
        config = build_kubeconfig(
            server=server,
            ca_file=pki.ca_cert,
            user=user,
            client_cert_file=pki.cert(pair),
            client_key_file=pki.key(pair),
        )
        path.write_text(dump_kubeconfig(config), encoding="utf-8")
        path.chmod(0o600)


def _wait_ready(
    record: ProcessRecord,
    check: Callable[[], tuple[bool, str]],
    *,
    deadline: float,
    what: str,
) -> None:
    detail = "never probed"
    while True:
        if not is_alive(record.pid, record.start_ticks):
            raise ClusterError(
                f"{record.name} exited before it was ready ({what}); log {record.log}:\n{log_tail(record.log)}"
            )
        ok, detail = check()
        if ok:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{record.name} was not ready ({what}) in time; last answer: {detail}; "
                f"log {record.log}:\n{log_tail(record.log)}"
            )
        time.sleep(0.2)


def _default_service_account_exists(layout: StateLayout, ports: Ports) -> tuple[bool, str]:
    """kcm's ServiceAccount and token controllers work once ``default/default`` exists."""
    pki = layout.pki
    tls = client_tls(ca_file=pki.ca_cert, cert_file=pki.cert("admin"), key_file=pki.key("admin"))
    return probe("/api/v1/namespaces/default/serviceaccounts/default", port=ports.apiserver, tls=tls)


def start(
    binaries: Binaries,
    state_dir: Path | None = None,
    *,
    timeout: float = 120.0,
    tie_to_parent: bool = False,
    profiling: bool = False,
) -> ClusterInfo:
    """Start the control plane in ``state_dir`` (or return the one already running there).

    ``timeout`` bounds the whole start. ``tie_to_parent`` ends the components when the
    calling process dies (for test sessions). ``profiling`` serves the API server's Go
    profiles (``/debug/pprof``, to cluster-admin only) for a benchmark that records where its
    CPU goes.
    """
    layout = StateLayout(state_dir or default_state_dir())
    current = status(layout.root)
    if current.running and current.healthy and current.info is not None:
        return dataclasses.replace(current.info, reused=True)
    if current.anything_running:
        stop(layout.root)
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.info.unlink(missing_ok=True)
    ensure_pki(layout.pki.directory)
    # JSON is YAML: the API server reads the policy either way.
    layout.audit_policy.write_text(json.dumps(build_audit_policy(GROUP), indent=2) + "\n", encoding="utf-8")
    etcd_client, etcd_peer, apiserver, kcm = free_ports(4)
    ports = Ports(etcd_client=etcd_client, etcd_peer=etcd_peer, apiserver=apiserver, kcm=kcm)
    server = f"https://{LOOPBACK}:{ports.apiserver}"
    _write_kubeconfigs(layout, server)

    started = time.monotonic()
    deadline = started + timeout
    seconds: dict[str, float] = {}
    plan: list[tuple[str, list[str], str]] = [
        ("etcd", etcd_args(binaries.etcd, layout, ports), "GET /readyz"),
        ("kube-apiserver", apiserver_args(binaries.kube_apiserver, layout, ports, profiling=profiling), "GET /readyz"),
        (
            "kube-controller-manager",
            kcm_args(binaries.kube_controller_manager, layout, ports),
            "GET /healthz",
        ),
    ]
    try:
        for name, argv, what in plan:
            record = spawn(name, argv, log_path=layout.log(name), pid_dir=layout.pids, tie_to_parent=tie_to_parent)
            check = functools.partial(_probe_component, name, layout, ports)
            _wait_ready(record, check, deadline=deadline, what=what)
            if name == "kube-controller-manager":
                _wait_ready(
                    record,
                    lambda: _default_service_account_exists(layout, ports),
                    deadline=deadline,
                    what="ServiceAccount default/default created",
                )
            seconds[name] = round(time.monotonic() - started, 2)
    except BaseException:
        stop(layout.root)
        raise

    info = ClusterInfo(
        state_dir=layout.root,
        kubeconfig=layout.admin_kubeconfig,
        server=server,
        ca_file=layout.pki.ca_cert,
        ports=ports,
        kube_version=binaries.kube_version,
        etcd_version=binaries.etcd_version,
        kubectl=binaries.kubectl,
        started_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        start_seconds=round(time.monotonic() - started, 2),
        component_seconds=seconds,
    )
    layout.info.write_text(json.dumps(info.to_json(), indent=2) + "\n", encoding="utf-8")
    return info

"""Pure command lines of the control-plane components, and the layout of a state directory.

Everything listens on loopback only, on ports chosen when the cluster starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from helmhive.devcluster.pki import PkiPaths
from helmhive.devcluster.procs import LOOPBACK

__all__ = [
    "SERVICE_ACCOUNT_ISSUER",
    "SERVICE_CIDR",
    "Ports",
    "StateLayout",
    "apiserver_args",
    "build_audit_policy",
    "default_state_dir",
    "etcd_args",
    "kcm_args",
]

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def default_state_dir() -> Path:
    """``$HELMHIVE_STATE_DIR``, else ``$XDG_STATE_HOME/helmhive/cluster/default``."""
    explicit = os.environ.get("HELMHIVE_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "helmhive" / "cluster" / "default"


@dataclass(frozen=True)
class StateLayout:
    """Where each file of one local cluster lives."""

    root: Path

    @property
    def pki(self) -> PkiPaths:
        return PkiPaths(self.root / "pki")

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def kcm_kubeconfig(self) -> Path:
        return self.root / "kube-controller-manager.kubeconfig"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        return self.logs / "kube-apiserver-audit.log"

    @property
    def info(self) -> Path:
        return self.root / "cluster.json"

    @property
    def build_log(self) -> Path:
        return self.root / "build.log"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"


@dataclass(frozen=True, kw_only=True)
class Ports:
    """The loopback ports one run of the cluster listens on."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    kcm: int


def etcd_args(etcd: Path, layout: StateLayout, ports: Ports) -> list[str]:
    """etcd as a single member; fsync is off because this is a throwaway dev store."""
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(etcd),
        "--name=helmhive",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=helmhive={peer}",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def build_audit_policy(group: str) -> dict[str, object]:
    """The API server's audit policy: who read ``group``'s resources, and nothing else.

    Reads are few (a client lists once and then watches), so the log stays small even under a
    benchmark's writes, and it answers which client listed what (the request metrics cannot:
    they carry no user). One event per request, at its end (a watch's when the watch ends).
    """
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [
            {"level": "Metadata", "verbs": ["get", "list", "watch"], "resources": [{"group": group}]},
            {"level": "None"},
        ],
    }


def apiserver_args(apiserver: Path, layout: StateLayout, ports: Ports, *, profiling: bool = False) -> list[str]:
    """kube-apiserver with client-certificate and ServiceAccount authentication and RBAC.

    ``profiling`` turns on ``/debug/pprof`` (off otherwise, as it is on a hardened cluster).
    """
    pki = layout.pki
    return [
        str(apiserver),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={layout.root / 'apiserver-certs'}",
        f"--tls-cert-file={pki.cert('apiserver')}",
        f"--tls-private-key-file={pki.key('apiserver')}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # Loopback may not appear in Endpoints, and no pod here dials the apiserver Service.
        "--endpoint-reconciler-type=none",
        # Admission webhooks (and aggregated APIs) that name a Service are called at one of its
        # EndpointSlices' addresses rather than at its ClusterIP: there is no kube-proxy here, so
        # a selector-less Service with a hand-made EndpointSlice reaches a process on this host.
        "--enable-aggregator-routing=true",
        f"--audit-policy-file={layout.audit_policy}",
        f"--audit-log-path={layout.audit_log}",
        "--audit-log-format=json",
        "--audit-log-maxsize=50",
        "--audit-log-maxbackup=1",
        f"--profiling={str(profiling).lower()}",
        "--v=1",
    ]


def kcm_args(kcm: Path, layout: StateLayout, ports: Ports) -> list[str]:
    """kube-controller-manager running every controller, each under its own ServiceAccount."""
    pki = layout.pki
    kubeconfig = str(layout.kcm_kubeconfig)
    return [
        str(kcm),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        # Trust our CA directly instead of reading the front-proxy settings the apiserver lacks.
        "--authentication-skip-lookup=true",
        f"--client-ca-file={pki.ca_cert}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.kcm}",
        f"--cert-dir={layout.root / 'kcm-certs'}",
        f"--tls-cert-file={pki.cert('kcm-serving')}",
        f"--tls-private-key-file={pki.key('kcm-serving')}",
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]

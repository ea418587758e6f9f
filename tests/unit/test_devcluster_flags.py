"""The local control plane's flags: what the API server serves is chosen, not defaulted."""

from __future__ import annotations

from pathlib import Path

from helmhive.devcluster.flags import Ports, StateLayout, apiserver_args

PORTS = Ports(etcd_client=2379, etcd_peer=2380, apiserver=6443, kcm=10257)


def flag(args: list[str], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]


def test_the_api_server_serves_no_profiles_unless_a_benchmark_asks(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    assert flag(apiserver_args(Path("kube-apiserver"), layout, PORTS), "profiling") == ["false"]
    asked = apiserver_args(Path("kube-apiserver"), layout, PORTS, profiling=True)
    assert flag(asked, "profiling") == ["true"]
    # Only that flag differs: authorization and the audit log stay as they are.
    assert [a for a in asked if not a.startswith("--profiling=")] == [
        a for a in apiserver_args(Path("kube-apiserver"), layout, PORTS) if not a.startswith("--profiling=")
    ]
    assert flag(asked, "authorization-mode") == ["RBAC"]

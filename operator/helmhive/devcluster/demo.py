"""``helmhive demo``: the whole product on the local control plane, from a cold machine.

Steps, each idempotent so the demo can be re-run:

1. build or reuse the control-plane binaries and start (or reuse) the local cluster;
2. install the CRDs (generated in memory from the models) and the install manifests
   (operator namespace, ServiceAccount, RBAC, envelope admission policy);
3. start the operator in the background as its own ServiceAccount (a TokenRequest token);
4. apply the embedded example manifests into a namespace and show what the operator made.

Everything goes through the matching ``kubectl`` that was built with the cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from helmhive.api.crdgen import build_crds
from helmhive.api.manifest_yaml import ManifestDumper, ManifestLoader
from helmhive.deploy.manifests import OperatorIdentity, build_install_manifests
from helmhive.devcluster.procs import free_ports, is_alive, read_record, spawn, terminate

__all__ = ["DemoError", "Kubectl", "ensure_installed", "ensure_operator", "example_documents", "stop_operator"]

OPERATOR_PROCESS = "helmhive-operator"


class DemoError(RuntimeError):
    """A demo step failed; the message says which and why."""


@dataclass(frozen=True, kw_only=True)
class Kubectl:
    binary: Path
    kubeconfig: Path

    def run(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        proc = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")
        return proc.stdout

    def wait_for(self, target: str, condition: str, *, namespace: str, timeout: int = 60) -> None:
        """``kubectl wait`` (which also waits for the object to exist), failing with its message."""
        self.run("wait", "-n", namespace, f"--for={condition}", f"--timeout={timeout}s", target, timeout=timeout + 30)

    def apply(self, docs: Iterable[dict[str, Any]], *, namespace: str | None = None) -> str:
        stream = yaml.dump_all(list(docs), sort_keys=False, Dumper=ManifestDumper)
        args = ["apply", "--server-side", "--force-conflicts", "--field-manager=helmhive-demo", "-f", "-"]
        if namespace:
            args[1:1] = ["-n", namespace]
        return self.run(*args, stdin=stream)


def example_documents() -> list[tuple[str, dict[str, Any]]]:
    """The example manifests shipped with Helmhive, as ``(file name, document)`` pairs."""
    here = Path(__file__).resolve()
    candidates = [here.parent.parent / "_examples", here.parents[3] / "examples"]
    directory = next((c for c in candidates if c.is_dir()), None)
    if directory is None:
        raise DemoError("no example manifests found (looked in " + ", ".join(map(str, candidates)) + ")")
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(directory.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        docs += [(path.name, d) for d in yaml.load_all(text, Loader=ManifestLoader) if d]  # as kubectl reads them
    return docs


def ensure_installed(kubectl: Kubectl, identity: OperatorIdentity) -> None:
    """Apply the CRDs, wait until they are established, then the install manifests."""
    kubectl.apply(build_crds().values())
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", "crd", "-l", "app.kubernetes.io/name=helmhive")
    kubectl.apply(build_install_manifests(identity))


def _operator_kubeconfig(kubectl: Kubectl, identity: OperatorIdentity, dest: Path) -> Path:
    token = kubectl.run("create", "token", identity.service_account, "-n", identity.namespace, "--duration=24h").strip()
    admin = yaml.safe_load(kubectl.kubeconfig.read_text(encoding="utf-8"))
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = dict(next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"]))
    ca = cluster.get("certificate-authority")
    if ca and not Path(ca).is_absolute():
        cluster["certificate-authority"] = str((kubectl.kubeconfig.parent / ca).resolve())
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": identity.service_account, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": identity.service_account}}],
        "current-context": "operator",
    }
    dest.write_text(yaml.dump(doc, sort_keys=False, Dumper=ManifestDumper), encoding="utf-8")
    dest.chmod(0o600)
    return dest


def ensure_operator(
    kubectl: Kubectl, identity: OperatorIdentity, state_dir: Path, *, wait: Callable[[float], None] = time.sleep
) -> tuple[int, bool]:
    """Start the operator in the background unless it already runs; return (pid, reused)."""
    pid_dir = state_dir / "pids"
    record = read_record(pid_dir, OPERATOR_PROCESS)
    if record is not None and is_alive(record.pid, record.start_ticks):
        return record.pid, True
    kubeconfig = _operator_kubeconfig(kubectl, identity, state_dir / "operator.kubeconfig")
    port, metrics_port = free_ports(2)
    argv = [
        sys.executable,
        "-m",
        "helmhive",
        "operator",
        "run",
        f"--kubeconfig={kubeconfig}",
        f"--liveness=http://127.0.0.1:{port}/healthz",
        f"--namespace={identity.namespace}",
        # Loopback and a free port: 9090 is Prometheus' own default on a laptop (the log names the URL).
        "--metrics-addr=127.0.0.1",
        f"--metrics-port={metrics_port}",
    ]
    record = spawn(OPERATOR_PROCESS, argv, log_path=state_dir / "logs" / "operator.log", pid_dir=pid_dir)
    for _ in range(120):
        out = kubectl.run("get", "envelopes", "-o", "name", check=False)
        if len(out.split()) >= 7:
            return record.pid, False
        if not is_alive(record.pid, record.start_ticks):
            raise DemoError(f"the operator exited; see {state_dir / 'logs' / 'operator.log'}")
        wait(0.5)
    raise DemoError(f"the operator did not publish the envelopes within 60 s; see {record.log}")


def stop_operator(state_dir: Path) -> bool:
    """Stop the demo's operator process, if this state directory started one."""
    record = read_record(state_dir / "pids", OPERATOR_PROCESS)
    return terminate(record) if record is not None else False

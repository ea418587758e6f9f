"""``helmhive dev``: developer tooling, starting with a real local control plane.

``helmhive dev cluster up`` builds (or reuses from the cache) etcd, kube-apiserver,
kube-controller-manager and kubectl from the Go module proxy, then starts the three
components on loopback in a state directory (``--state-dir``, ``$HELMHIVE_STATE_DIR`` or
``~/.local/state/helmhive/cluster/default``). ``down`` stops what ``up`` started there,
``status`` reports each component, and ``env`` prints shell exports for kubectl::

    helmhive dev cluster up
    eval "$(helmhive dev cluster env)"
    kubectl get namespaces
    helmhive dev cluster down
"""

from __future__ import annotations

import io
import json
import shlex
import shutil
from pathlib import Path
from typing import Annotated

import typer

from helmhive.cli import dev_kind
from helmhive.devcluster import cluster
from helmhive.devcluster.build import (
    DEFAULT_ETCD_VERSION,
    DEFAULT_KUBE_VERSION,
    BuildError,
    ensure_binaries,
)
from helmhive.devcluster.flags import StateLayout, default_state_dir
from helmhive.devcluster.procs import log_tail

app = typer.Typer(no_args_is_help=True, help="Developer tooling.")
cluster_app = typer.Typer(no_args_is_help=True, help="A real local Kubernetes control plane on loopback.")
app.add_typer(cluster_app, name="cluster")
app.add_typer(dev_kind.app, name="kind")

StateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Cluster state directory [default: $HELMHIVE_STATE_DIR or ~/.local/state/helmhive/cluster/default].",
        show_default=False,
    ),
]


def _err(message: str) -> None:
    typer.echo(message, err=True)


class _ProgressLog(io.TextIOWrapper):
    """The build log file; lines that announce a build are echoed to stderr too."""

    def __init__(self, path: Path) -> None:
        super().__init__(path.open("ab"), encoding="utf-8", line_buffering=True)

    def write(self, text: str, /) -> int:
        if text.startswith(("building ", "  … still ", "done: go build")):
            _err(f"helmhive: {text.rstrip()} (log: {self.name})")
        return super().write(text)


@cluster_app.command("up")
def up(
    state_dir: StateDirOption = None,
    kube_version: Annotated[str, typer.Option(help="Kubernetes release to build.")] = DEFAULT_KUBE_VERSION,
    etcd_version: Annotated[str, typer.Option(help="etcd release to build.")] = DEFAULT_ETCD_VERSION,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the components to be ready.")] = 120.0,
) -> None:
    """Build or reuse the binaries, then start the control plane (no-op if it already runs)."""
    layout = StateLayout(state_dir or default_state_dir())
    layout.root.mkdir(parents=True, exist_ok=True)
    # A cold build reports each component and, every 30 s, how long it has run (progress.step).
    try:
        with _ProgressLog(layout.build_log) as log:
            binaries = ensure_binaries(kube_version=kube_version, etcd_version=etcd_version, log=log)
    except BuildError as err:
        _err(f"helmhive: build failed: {err}\n{log_tail(layout.build_log)}")
        raise typer.Exit(1) from err
    _err(f"helmhive: binaries ready (etcd {binaries.etcd_version}, kubernetes {binaries.kube_version})")
    try:
        info = cluster.start(binaries, layout.root, timeout=timeout)
    except cluster.ClusterError as err:
        _err(f"helmhive: the control plane did not start: {err}")
        raise typer.Exit(1) from err
    if info.reused:
        _err(f"helmhive: already running at {info.server} (state {info.state_dir})")
    else:
        _err(f"helmhive: control plane ready at {info.server} in {info.start_seconds:.1f} s")
    typer.echo(f"KUBECONFIG={info.kubeconfig}")


@cluster_app.command("down")
def down(
    state_dir: StateDirOption = None,
    purge: Annotated[bool, typer.Option(help="Also delete the state directory (etcd data, PKI).")] = False,
) -> None:
    """Stop the components this state directory started."""
    root = state_dir or default_state_dir()
    stopped = cluster.stop(root)
    _err(f"helmhive: stopped {', '.join(stopped)}" if stopped else "helmhive: nothing was running")
    if purge and root.exists():
        shutil.rmtree(root)
        _err(f"helmhive: removed {root}")


@cluster_app.command("status")
def status_cmd(
    state_dir: StateDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show which components run and answer their health checks; exit 1 unless all are healthy."""
    report = cluster.status(state_dir or default_state_dir())
    if as_json:
        payload = {
            "state_dir": str(report.state_dir),
            "healthy": report.healthy,
            "components": [c.__dict__ for c in report.components],
            "cluster": report.info.to_json() if report.info else None,
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(f"state dir: {report.state_dir}")
        if report.info:
            typer.echo(f"server:    {report.info.server}  (kubernetes {report.info.kube_version})")
            typer.echo(f"kubeconfig: {report.info.kubeconfig}")
        for comp in report.components:
            state = "healthy" if comp.healthy else ("running" if comp.running else "stopped")
            pid = comp.pid if comp.pid is not None else "-"
            typer.echo(f"  {comp.name:<24} {state:<8} pid {pid!s:<8} {comp.detail[:80]}")
    if not report.healthy:
        raise typer.Exit(1)


@cluster_app.command("env")
def env(state_dir: StateDirOption = None) -> None:
    """Print shell exports for KUBECONFIG and the matching kubectl: eval "$(helmhive dev cluster env)"."""
    info = cluster.load_info(state_dir or default_state_dir())
    if info is None:
        _err("helmhive: no cluster recorded in this state directory; run `helmhive dev cluster up` first")
        raise typer.Exit(1)
    typer.echo(f"export KUBECONFIG={shlex.quote(str(info.kubeconfig))}")
    typer.echo(f'export PATH={shlex.quote(str(info.kubectl.parent))}:"$PATH"')


@app.command("run-pod")
def run_pod_cmd(
    name: Annotated[str, typer.Argument(help="A runner pod (Pending: the local cluster has no kubelet).")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    state_dir: StateDirOption = None,
) -> None:
    """Run a runner pod's container as a local process, with the pod's identity, env and volumes."""
    from helmhive.devcluster.localpod import LocalPodError, run_pod  # noqa: PLC0415 - only this command needs it

    layout = StateLayout(state_dir or default_state_dir())
    try:
        pod = run_pod(name=name, namespace=namespace, admin_kubeconfig=layout.admin_kubeconfig, state_dir=layout.root)
    except (LocalPodError, OSError) as err:
        _err(f"cannot run pod {namespace}/{name}: {err}")
        raise typer.Exit(1) from None
    state = "already running" if pod.reused else "started"
    typer.echo(f"{namespace}/{name}: {state} as pid {pod.record.pid}; log {pod.root / 'container.log'}")
    if pod.metrics_port:
        typer.echo(f"metrics: http://127.0.0.1:{pod.metrics_port}/metrics")


@app.command("stop-pod")
def stop_pod_cmd(
    name: Annotated[str, typer.Argument()],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    state_dir: StateDirOption = None,
) -> None:
    """Stop a pod started by run-pod (SIGTERM, then SIGKILL after 60 s)."""
    from helmhive.devcluster.localpod import stop_pod  # noqa: PLC0415

    layout = StateLayout(state_dir or default_state_dir())
    stopped = stop_pod(name=name, namespace=namespace, state_dir=layout.root)
    typer.echo(f"{namespace}/{name}: {'stopped' if stopped else 'was not running'}")

"""``helmhive demo``: bring up the local cluster with the operator, apply the examples, show them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from helmhive.deploy.manifests import OperatorIdentity
from helmhive.devcluster import cluster
from helmhive.devcluster.build import BuildError, ensure_binaries
from helmhive.devcluster.demo import DemoError, Kubectl, ensure_installed, ensure_operator, example_documents
from helmhive.devcluster.demo import stop_operator as stop_demo_operator
from helmhive.devcluster.flags import default_state_dir


def _say(text: str) -> None:
    typer.secho(f"==> {text}", fg=typer.colors.CYAN, err=True)


def run(
    namespace: Annotated[str, typer.Option(help="Namespace for the example workspace.")] = "helmhive-demo",
    state_dir: Annotated[
        Path | None, typer.Option(envvar="HELMHIVE_STATE_DIR", help="Local cluster state directory.")
    ] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the demo's operator and cluster, then exit.")] = False,
) -> None:
    """Run Helmhive end to end on a local control plane with the embedded examples."""
    state = state_dir or default_state_dir()
    if stop:
        stopped = stop_demo_operator(state)
        names = cluster.stop(state)
        typer.echo(f"stopped operator: {stopped}; stopped components: {', '.join(names) or 'none'}")
        return
    state.mkdir(parents=True, exist_ok=True)
    try:
        _say("building or reusing etcd, kube-apiserver, kube-controller-manager and kubectl")
        with (state / "build.log").open("a", encoding="utf-8") as log:
            binaries = ensure_binaries(log=log)
        _say(f"starting the local control plane in {state}")
        info = cluster.start(binaries, state)
        kubectl = Kubectl(binary=binaries.kubectl, kubeconfig=info.kubeconfig)
        identity = OperatorIdentity()
        _say("installing CRDs, RBAC and the envelope admission policy")
        ensure_installed(kubectl, identity)
        _say("starting the operator as its own ServiceAccount")
        pid, reused = ensure_operator(kubectl, identity, state)
        typer.echo(f"operator pid {pid} ({'already running' if reused else 'started'})", err=True)
        _say(f"applying the examples into namespace {namespace}")
        kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
        typer.echo(kubectl.apply([doc for _, doc in example_documents()], namespace=namespace), err=True)
    except (BuildError, cluster.ClusterError, DemoError) as err:
        typer.secho(f"demo failed: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    _say("kubectl get envelopes")
    typer.echo(kubectl.run("get", "envelopes"))
    _say(f"kubectl get helmhive -n {namespace}")
    typer.echo(kubectl.run("get", "helmhive", "-n", namespace))
    _say("try it yourself")
    typer.echo(f'eval "$(helmhive dev cluster env --state-dir {state})"\nkubectl get helmhive -n {namespace}')

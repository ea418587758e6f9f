"""``helmhive dev kind``: a two-node kind cluster built offline, with kube-router enforcing NetworkPolicy.

    helmhive dev kind build       # build or reuse the node image, tools and images; no cluster
    helmhive dev kind up          # build or reuse everything, create or reuse the cluster
    eval "$(helmhive dev kind env)"
    kubectl get nodes
    helmhive dev kind load        # docker build Helmhive's images and kind-load them
    helmhive dev kind down

Progress goes to stderr: each step, and a line at least every 30 s while one runs.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from helmhive.devcluster.build import BuildError
from helmhive.devcluster.kind import cluster as kind_cluster
from helmhive.devcluster.kind.engine import EngineError

app = typer.Typer(no_args_is_help=True, help="A kind cluster built offline: two nodes, kube-router, local images.")

NameOption = Annotated[str, typer.Option("--name", help="kind cluster name.")]


def _fail(err: Exception) -> None:
    typer.echo(f"helmhive: {err}", err=True)
    raise typer.Exit(1) from err


@app.command("up")
def kind_up(
    name: NameOption = kind_cluster.DEFAULT_NAME,
    workers: Annotated[int, typer.Option(help="Worker nodes beside the control plane.")] = 1,
    images: Annotated[bool, typer.Option(help="Also build and load Helmhive's operator and runner images.")] = True,
) -> None:
    """Build or reuse the node image and tools, then create (or reuse) the cluster."""
    try:
        cluster = kind_cluster.ensure_cluster(name, log=sys.stderr, workers=workers)
        if images:
            kind_cluster.load_helmhive(cluster, log=sys.stderr)
    except (BuildError, EngineError, kind_cluster.KindError) as err:
        _fail(err)
    state = "reused" if cluster.reused else "created"
    typer.echo(f"kind cluster {name} {state}: nodes {', '.join(cluster.nodes)}", err=True)
    for line in kind_cluster.build_env(cluster):
        typer.echo(line)


@app.command("build")
def kind_build() -> None:
    """Build or reuse everything a cluster is made from (node image, tools, Helmhive's images); create nothing."""
    try:
        kind_cluster.build_all(log=sys.stderr)
    except (BuildError, EngineError, kind_cluster.KindError) as err:
        _fail(err)


@app.command("env")
def kind_env(name: NameOption = kind_cluster.DEFAULT_NAME) -> None:
    """Print shell exports for KUBECONFIG and kubectl: eval "$(helmhive dev kind env)"."""
    try:
        cluster = kind_cluster.existing(name, log=sys.stderr)
    except (BuildError, kind_cluster.KindError) as err:
        _fail(err)
    for line in kind_cluster.build_env(cluster):
        typer.echo(line)


@app.command("load")
def kind_load(
    images: Annotated[
        list[str] | None, typer.Argument(help="Local images to load [default: build and load Helmhive's].")
    ] = None,
    name: NameOption = kind_cluster.DEFAULT_NAME,
) -> None:
    """Load local images into every node; with none named, docker build Helmhive's images and load them."""
    try:
        cluster = kind_cluster.existing(name, log=sys.stderr)
        if images:
            kind_cluster.load_images(name, list(images), kind=cluster.kind, log=sys.stderr)
        else:
            kind_cluster.load_helmhive(cluster, log=sys.stderr)
    except (BuildError, EngineError, kind_cluster.KindError) as err:
        _fail(err)


@app.command("down")
def kind_down(name: NameOption = kind_cluster.DEFAULT_NAME) -> None:
    """Delete the cluster (the cached images and binaries stay)."""
    try:
        deleted = kind_cluster.delete_cluster(name, log=sys.stderr)
    except (BuildError, kind_cluster.KindError) as err:
        _fail(err)
    typer.echo(f"kind cluster {name}: {'deleted' if deleted else 'there was none'}", err=True)

"""``helmhive dev rootfs``: build an image's filesystem from its Dockerfile without Docker, and run it.

::

    helmhive dev rootfs build images/operator/Dockerfile --target operator --output /tmp/img/operator
    helmhive dev rootfs run /tmp/img/operator -- --help

``build`` carries out the target's stages (:mod:`helmhive.devcluster.rootfs`: a cached
``debootstrap`` tree for the Debian base, ``RUN`` chrooted, ``COPY`` from the context or a
stage); ``run`` runs the result as its image user with the root tree read-only and a tmpfs on
``/tmp``. Both need root. See ``docs/development.md``, "Images".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from helmhive.devcluster.dockerfile import DockerfileError
from helmhive.devcluster.rootfs import Bind, RootfsError, build_image, run_image

app = typer.Typer(no_args_is_help=True, help="Build an image's filesystem from its Dockerfile without Docker; run it.")


@app.command("build")
def build_cmd(
    dockerfile: Annotated[Path, typer.Argument(help="The Dockerfile, e.g. images/operator/Dockerfile.")],
    target: Annotated[str, typer.Option(help="The stage to build.")],
    output: Annotated[Path, typer.Option(help="Where the tree (rootfs/) and config.json go.")],
    context: Annotated[Path, typer.Option(help="The build context.")] = Path("."),
    build_arg: Annotated[list[str] | None, typer.Option(help="NAME=VALUE, as docker build --build-arg.")] = None,
) -> None:
    """Carry out the target's stages of the Dockerfile into OUTPUT/rootfs."""
    args = dict(item.partition("=")[::2] for item in build_arg or [])
    try:
        build_image(dockerfile, context=context, target=target, output=output, log=sys.stderr, build_args=args)
    except (DockerfileError, RootfsError) as err:
        typer.echo(f"helmhive: {dockerfile}: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(str(output))


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_cmd(
    ctx: typer.Context,
    image: Annotated[Path, typer.Argument(help="A directory made by `helmhive dev rootfs build`.")],
    volume: Annotated[
        list[str] | None, typer.Option("--volume", "-v", help="HOST:PATH[:ro], a writable (or :ro) bind mount.")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE.")] = None,
) -> None:
    """Run the image's entrypoint (with the extra arguments, else its CMD), read-only root, as its user."""
    binds = []
    for item in volume or []:
        parts = item.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "ro"):
            typer.echo(f"helmhive: --volume {item!r}: expected HOST:PATH[:ro]", err=True)
            raise typer.Exit(2)
        binds.append(Bind(Path(parts[0]).resolve(), parts[1], read_only=len(parts) == 3))
    variables = dict(item.partition("=")[::2] for item in env or [])
    try:
        proc = run_image(image, ctx.args or None, env=variables, binds=binds)
    except (RootfsError, OSError) as err:
        typer.echo(f"helmhive: cannot run {image}: {err}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(proc.wait())

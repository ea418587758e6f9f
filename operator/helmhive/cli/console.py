"""``helmhive console``: serve the web console on 127.0.0.1 with the caller's own kubeconfig (docs/console.md).

Owns the command's options and its start: the client (the kubeconfig, the namespace and the timeout
as for every cluster command, :mod:`helmhive.cli.kubeapi`), the watches
(:class:`~helmhive.console.hub.Hub`) and the one listening socket, on the loopback address only.
It prints the URL, with the console's access token, and serves until interrupted.
"""

from __future__ import annotations

from typing import Annotated

import typer

from helmhive.cli.kubeapi import KubeconfigOption, NamespaceOption, context_namespace, load_api
from helmhive.console.hub import Hub, WatchTarget
from helmhive.console.pages import Pages
from helmhive.console.server import make_server

__all__ = ["run"]


def run(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (default: a free one).", min=0, max=65535)] = 0,
    namespace: NamespaceOption = None,
    kubeconfig: KubeconfigOption = None,
) -> None:
    """Serve the web console on 127.0.0.1, acting with your own kubeconfig credentials; print its URL."""
    api = load_api(kubeconfig)
    ns = namespace or context_namespace(kubeconfig)
    api.api_client.configuration.connection_pool_maxsize = 32
    hub = Hub(
        lister=api.list_scoped,
        watcher=lambda plural, where, version, seconds: api.watch_scoped(
            plural, where, resource_version=version, seconds=seconds
        ),
        targets=[
            WatchTarget("runnerpools", "runnerpools", None, fallback=ns),
            WatchTarget("runners", "runners", None, fallback=ns),
            WatchTarget("agentjobs", "agentjobs", ns),
            WatchTarget("changes", "changes", ns),
            WatchTarget("memoryrecords", "memoryrecords", ns),
            WatchTarget("profiles", "profiles", ns),
            WatchTarget("auditrecords", "auditrecords", ns),
            WatchTarget("events", None, ns),
        ],
    )
    try:
        server = make_server(port, pages=Pages(api, namespace=ns), hub=hub)
    except OSError as err:
        raise typer.Exit(_say_no_port(port, err)) from None
    hub.start()
    typer.echo(f"Helmhive console for namespace {ns}: {server.url}", err=False)
    typer.echo("(acting with your kubeconfig's credentials; Ctrl-C stops it)", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()
        server.server_close()


def _say_no_port(port: int, err: OSError) -> int:
    typer.secho(f"cannot listen on 127.0.0.1:{port}: {err.strerror or err}", fg=typer.colors.RED, err=True)
    return 1

"""``helmhive sessions list|reset``: see and reset session bindings, never their session ids.

``reset`` removes the native session id from the runner's sessions Secret, marks the
binding not stored (the next job on it starts a fresh chain) and counts the reset in its
status (``resets``). It writes no audit record itself: the operator records the ``SessionReset``
from what it sees, with the identity the API server authenticated for this request (see
``docs/audit.md``), as it does for a reset made with ``kubectl``.

What is read from a binding is shown as plain text with control characters escaped
(:func:`~helmhive.cli.render.printable`). Without ``-n``, the namespace is the kubeconfig
context's, as kubectl's is.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from helmhive.api.kubeerrors import KubeError
from helmhive.cli.kubeapi import (
    KubeconfigOption,
    NamespaceOption,
    OutputOption,
    PrintFormat,
    api_error,
    context_namespace,
    load_api,
)
from helmhive.cli.render import printable, safe_text
from helmhive.policy.sessions.continuity import sessions_secret_name

app = typer.Typer(no_args_is_help=True, help="List and reset session bindings.")
PLURAL = "sessionbindings"
_RETRIES = 5
_COLUMNS = (
    "name",
    "workspace",
    "profile",
    "provider",
    "runner",
    "scope",
    "service",
    "stored",
    "turns",
    "compactions",
    "lastUsedAt",
)


@app.command("list")
def list_bindings(
    namespace: NamespaceOption = None,
    kubeconfig: KubeconfigOption = None,
    output: OutputOption = PrintFormat.TABLE,
) -> None:
    """List the session bindings of a namespace."""
    api = load_api(kubeconfig)
    namespace = namespace or context_namespace(kubeconfig)
    try:
        items = api.list(PLURAL, namespace)
    except KubeError as err:
        raise api_error(err, f"listing session bindings in {namespace}") from None
    rows = [
        {
            "name": b["metadata"]["name"],
            **{k: b["spec"].get(k) for k in ("workspace", "profile", "provider", "runner", "scope", "service")},
            **{k: (b.get("status") or {}).get(k) for k in ("stored", "turns", "lastUsedAt", "resets", "compactions")},
        }
        for b in items
    ]
    if output is PrintFormat.JSON:
        typer.echo(json.dumps(rows, indent=2))
        return
    render_bindings(Console(), namespace=namespace, rows=rows)


def render_bindings(console: Console, *, namespace: str, rows: list[dict[str, Any]]) -> None:
    """Print the bindings' table; every value read from an object is shown as plain, escaped text."""
    table = Table(title=Text(printable(f"session bindings in {namespace}", one_line=True)))
    for column in _COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(*(safe_text(row.get(c)) for c in _COLUMNS))
    console.print(table)


@app.command()
def reset(
    name: Annotated[str, typer.Argument(help="The binding's name (sb-…).")],
    namespace: NamespaceOption = None,
    kubeconfig: KubeconfigOption = None,
) -> None:
    """Forget a binding's stored session, so its next job starts a fresh chain; the operator audits it."""
    api = load_api(kubeconfig)
    namespace = namespace or context_namespace(kubeconfig)
    for attempt in range(_RETRIES):
        try:
            binding = api.get(PLURAL, name, namespace)
        except KubeError as err:
            raise api_error(err, f"session binding {namespace}/{name}") from None
        status = binding.get("status") or {}
        secret = status.get("secretName") or sessions_secret_name(binding["spec"]["runner"])
        key = status.get("secretKey") or name
        try:
            api.remove_secret_key(secret, namespace, key)
        except KubeError as err:
            if err.status not in (404, 422):  # no Secret, or no such key: nothing stored to forget
                raise api_error(err, f"removing the stored session from Secret {secret}") from None
        # Counted from the binding as read: a reset made by someone else meanwhile is a 409, and
        # this one is counted again on top of it, so every reset has its own count (and record).
        patch = {
            "metadata": {"resourceVersion": binding["metadata"]["resourceVersion"]},
            "status": {
                "stored": False,
                "resets": int(status.get("resets", 0)) + 1,
                "lastResetAt": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        }
        try:
            api.patch_status(PLURAL, name, namespace, patch)
            break
        except KubeError as err:
            if err.status == 409 and attempt + 1 < _RETRIES:
                continue
            raise api_error(err, f"resetting {namespace}/{name}") from None
    typer.echo(
        printable(
            f"reset {namespace}/{name} (runner {binding['spec']['runner']}, profile {binding['spec']['profile']}): "
            "the next job on it starts a fresh session; the operator records the reset (SessionReset) in your name",
            one_line=True,
        )
    )

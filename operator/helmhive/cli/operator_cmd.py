"""``helmhive operator run``: the Kopf operator process."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="Run the Helmhive operator.")


@app.command()
def run(
    kubeconfig: Annotated[
        str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig; in-cluster if unset.")
    ] = None,
    liveness: Annotated[
        str | None, typer.Option(help="Liveness endpoint URL, e.g. http://0.0.0.0:8080/healthz.")
    ] = "http://127.0.0.1:8080/healthz",
    namespace: Annotated[str, typer.Option(envvar="HELMHIVE_NAMESPACE", help="Namespace the operator runs in.")] = (
        "helmhive-system"
    ),
    service_account: Annotated[
        str, typer.Option(envvar="HELMHIVE_SERVICE_ACCOUNT", help="The operator's own ServiceAccount name.")
    ] = "helmhive-operator",
    webhook_port: Annotated[int, typer.Option(envvar="HELMHIVE_WEBHOOK_PORT", help="Admission webhook port.")] = 9443,
    webhook_addr: Annotated[str, typer.Option(envvar="HELMHIVE_WEBHOOK_ADDR", help="Address to listen on.")] = (
        "0.0.0.0"
    ),
    webhook_host: Annotated[
        str, typer.Option(envvar="HELMHIVE_WEBHOOK_HOST", help="Host name the API server uses to reach the webhook.")
    ] = "127.0.0.1",
    webhooks: Annotated[bool, typer.Option(help="Serve the admission webhooks (refuse widening profiles).")] = True,
    metrics_port: Annotated[
        int,
        typer.Option(
            envvar="HELMHIVE_METRICS_PORT",
            min=0,
            max=65535,
            help="Port of the Prometheus /metrics endpoint; 0 disables it.",
        ),
    ] = 9090,
    metrics_addr: Annotated[
        str, typer.Option(envvar="HELMHIVE_METRICS_ADDR", help="Address the /metrics endpoint listens on.")
    ] = "0.0.0.0",
    revision_history: Annotated[int, typer.Option(help="Profile revisions kept (referenced ones always are).")] = 10,
    reference_wait_seconds: Annotated[
        float,
        typer.Option(
            envvar="HELMHIVE_REFERENCE_WAIT_SECONDS",
            min=0.0,
            help="How long after its creation a job or memory record waits for a Workspace or Profile "
            "that does not exist yet before it fails closed.",
        ),
    ] = 600.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the operator until interrupted (SIGINT/SIGTERM stop it gracefully)."""
    # Imported here so `helmhive validate` and friends never load Kopf.
    from helmhive.controller.app import run_operator  # noqa: PLC0415
    from helmhive.controller.runtime import OperatorConfig  # noqa: PLC0415

    run_operator(
        kubeconfig=kubeconfig,
        liveness=liveness,
        config=OperatorConfig(
            namespace=namespace,
            service_account=service_account,
            webhook_port=webhook_port,
            webhook_addr=webhook_addr,
            webhook_host=webhook_host,
            webhooks_enabled=webhooks,
            metrics_addr=metrics_addr,
            metrics_port=metrics_port,
            revision_history_limit=revision_history,
            reference_wait_seconds=reference_wait_seconds,
        ),
        verbose=verbose,
    )

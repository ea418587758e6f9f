"""``helmhive operator run``: the Kopf operator process."""

from __future__ import annotations

from pathlib import Path
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
    webhook_service_name: Annotated[
        str | None,
        typer.Option(
            envvar="HELMHIVE_WEBHOOK_SERVICE_NAME",
            help="Service mode: the webhook configurations name this Service (port 443) instead of a URL, "
            "and the self-managed certificate is valid for its DNS names (docs/webhook.md).",
        ),
    ] = None,
    webhook_service_namespace: Annotated[
        str | None,
        typer.Option(
            envvar="HELMHIVE_WEBHOOK_SERVICE_NAMESPACE",
            help="Namespace of --webhook-service-name (default: --namespace).",
        ),
    ] = None,
    webhook_cert_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="HELMHIVE_WEBHOOK_CERT_DIR",
            help="Serve this directory's tls.crt/tls.key (e.g. a cert-manager Secret) instead of a "
            "self-managed certificate; its ca.crt becomes the CA bundle.",
        ),
    ] = None,
    webhooks: Annotated[bool, typer.Option(help="Serve the admission webhooks (refuse widening profiles).")] = True,
    leader_election: Annotated[
        bool,
        typer.Option(
            envvar="HELMHIVE_LEADER_ELECTION",
            help="Act only while holding a coordination.k8s.io Lease (for several replicas; docs/ha.md). "
            "A standby serves only the webhooks.",
        ),
    ] = False,
    leader_election_namespace: Annotated[
        str | None,
        typer.Option(
            envvar="HELMHIVE_LEADER_ELECTION_NAMESPACE", help="Namespace of the Lease (default: --namespace)."
        ),
    ] = None,
    leader_election_lease_name: Annotated[
        str, typer.Option(envvar="HELMHIVE_LEADER_ELECTION_LEASE_NAME", help="Name of the Lease.")
    ] = "helmhive-operator",
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
    revision_history: Annotated[
        int,
        typer.Option(
            envvar="HELMHIVE_REVISION_HISTORY",
            min=1,
            help="Profile revisions kept (the current one and those unfinished jobs are bound to always are).",
        ),
    ] = 10,
    reference_wait_seconds: Annotated[
        float,
        typer.Option(
            envvar="HELMHIVE_REFERENCE_WAIT_SECONDS",
            min=0.0,
            help="How long after its creation a job or memory record waits for a Workspace or Profile "
            "that does not exist yet before it fails closed.",
        ),
    ] = 600.0,
    retry_window_seconds: Annotated[
        float,
        typer.Option(
            envvar="HELMHIVE_RETRY_WINDOW_SECONDS",
            min=0.0,
            help="A job its runner ended with a retryable failure (AgentCrashed, ...) is re-run "
            "automatically only if it failed at most this long ago; older failures are closed "
            "with RetryWindowPassed (docs/execution.md).",
        ),
    ] = 900.0,
    runner_cluster_cidrs: Annotated[
        str,
        typer.Option(
            envvar="HELMHIVE_RUNNER_CLUSTER_CIDRS",
            help="The cluster's pod networks, comma-separated (e.g. 10.244.0.0/16,fd00:10:244::/56): "
            "every RunnerPool's NetworkPolicy allows HTTPS (443, 6443) to any address except these. "
            "Empty: to any address (docs/runners.md).",
        ),
    ] = "",
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the operator until interrupted (SIGINT/SIGTERM stop it gracefully)."""
    # Imported here so `helmhive validate` and friends never load Kopf.
    from helmhive.controller.app import run_operator  # noqa: PLC0415
    from helmhive.controller.leader import LeaderConfig  # noqa: PLC0415
    from helmhive.controller.runtime import OperatorConfig  # noqa: PLC0415
    from helmhive.controller.webhook import WebhookSettingError, decide_webhook_config  # noqa: PLC0415
    from helmhive.policy.runners.pool import ClusterCidrError, parse_cluster_cidrs  # noqa: PLC0415

    try:
        cluster_cidrs = parse_cluster_cidrs(runner_cluster_cidrs)
    except ClusterCidrError as err:  # fail closed: no pool gets a policy the platform did not mean
        typer.echo(f"error: --runner-cluster-cidrs (HELMHIVE_RUNNER_CLUSTER_CIDRS): {err}", err=True)
        raise typer.Exit(2) from None
    try:
        webhook = decide_webhook_config(
            addr=webhook_addr,
            port=webhook_port,
            host=webhook_host,
            service_name=webhook_service_name,
            service_namespace=webhook_service_namespace,
            operator_namespace=namespace,
            cert_dir=webhook_cert_dir,
        )
    except WebhookSettingError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    run_operator(
        kubeconfig=kubeconfig,
        liveness=liveness,
        webhook=webhook if webhooks else None,
        leader=LeaderConfig(
            enabled=leader_election,
            namespace=leader_election_namespace or namespace,
            lease_name=leader_election_lease_name,
        ),
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
            retry_window_seconds=retry_window_seconds,
            runner_cluster_cidrs=cluster_cidrs,
        ),
        verbose=verbose,
    )

"""What the cluster-facing commands share: loading a client, naming the caller, reporting API errors.

A failure is printed as one red line (``<what>: <status> <API server message>``) and exits
non-zero; no command prints a stack trace for a user's mistake or a refused request.
"""

from __future__ import annotations

import json
from typing import Annotated, cast

import typer
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from helmhive.api.audit import AuditActor

__all__ = ["KubeconfigOption", "NamespaceOption", "api_error", "load_api", "whoami"]

KubeconfigOption = Annotated[str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig to use.")]
NamespaceOption = Annotated[str, typer.Option("--namespace", "-n", help="Namespace of the object.")]


def load_api(kubeconfig: str | None) -> client.ApiClient:
    """A client from the kubeconfig; exit 2 with a one-line reason when it cannot be loaded."""
    try:
        return cast(client.ApiClient, config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
    except Exception as err:
        typer.secho(f"cannot load kubeconfig: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def api_error(err: ApiException, what: str) -> typer.Exit:
    """Print the API server's own message for a refused call and return the Exit to raise."""
    try:
        message = json.loads(err.body or "{}").get("message") or err.reason
    except ValueError:
        message = err.reason
    typer.secho(f"{what}: {err.status} {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(1)


def whoami(api: client.ApiClient) -> AuditActor:
    """The caller as the API server identifies them (SelfSubjectReview); ``unknown`` if it cannot say."""
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review(
            client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
        )
        info = review.status.user_info if review.status is not None else None
        if info is None:
            return AuditActor(username="unknown")
        return AuditActor(
            username=info.username or "unknown", uid=info.uid or None, groups=list(info.groups or [])[:16]
        )
    except ApiException:
        return AuditActor(username="unknown")

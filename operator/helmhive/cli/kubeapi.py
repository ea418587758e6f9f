"""The CLI's door to the Kubernetes API: loading a client, the calls commands make, reporting errors.

In ``helmhive.cli`` only this module imports the ``kubernetes`` client (``explain-routing``
uses the operator's door, ``helmhive.controller.kube``). :class:`CliKube` offers the few
synchronous calls the cluster-facing commands make -- custom objects (get, list, merge patch
of the object or its status), a ConfigMap's data, removing one key of a Secret, and who the
caller is -- and raises only the error tree of :mod:`helmhive.api.kubeerrors`, as the
operator's and the runner's doors do.

A failure is printed as one red line (``<what>: <status> <API server message>``) and exits
non-zero; no command prints a stack trace for a user's mistake or a refused request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar, cast

import typer
from kubernetes import client, config

from helmhive.api.audit import AuditActor
from helmhive.api.kinds import GROUP, VERSION
from helmhive.api.kubeerrors import KubeError
from helmhive.kubeclient import NETWORK_ERRORS, translate_api_error

__all__ = ["CliKube", "KubeconfigOption", "NamespaceOption", "api_error", "load_api", "whoami"]

KubeconfigOption = Annotated[str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig to use.")]
NamespaceOption = Annotated[str, typer.Option("--namespace", "-n", help="Namespace of the object.")]
T = TypeVar("T")


class CliKube:
    """The CLI's API calls, synchronous. Every method may raise a :class:`~helmhive.api.kubeerrors.KubeError`."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    @staticmethod
    def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except NETWORK_ERRORS as exc:
            raise translate_api_error(exc) from exc

    # Custom objects (``plural`` of the helmhive.dev group) ---------------------------------
    def get(self, plural: str, name: str, namespace: str) -> dict[str, Any]:
        result = self._call(self._custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name)
        return cast(dict[str, Any], result)

    def list(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        result = self._call(self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural)
        return list(cast(dict[str, Any], result).get("items", []))

    def patch(self, plural: str, name: str, namespace: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the object; ``metadata.resourceVersion`` in ``patch`` makes it conditional."""
        return self._merge_patch(self._custom.patch_namespaced_custom_object, plural, name, namespace, patch)

    def patch_status(self, plural: str, name: str, namespace: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource; ``metadata.resourceVersion`` makes it conditional."""
        return self._merge_patch(self._custom.patch_namespaced_custom_object_status, plural, name, namespace, patch)

    def _merge_patch(
        self, method: Any, plural: str, name: str, namespace: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        result = self._call(
            method, GROUP, VERSION, namespace, plural, name, patch, _content_type="application/merge-patch+json"
        )
        return cast(dict[str, Any], result)

    # Core objects ----------------------------------------------------------------------
    def config_map_data(self, name: str, namespace: str) -> dict[str, str]:
        config_map = self._call(self._core.read_namespaced_config_map, name, namespace)
        return {str(k): str(v) for k, v in (config_map.data or {}).items()}

    def remove_secret_key(self, name: str, namespace: str, key: str) -> None:
        """Remove ``data[key]`` from a Secret (a JSON patch: NotFound without the Secret, Invalid without the key)."""
        self._call(
            self._core.patch_namespaced_secret,
            name,
            namespace,
            [{"op": "remove", "path": f"/data/{key}"}],
            _content_type="application/json-patch+json",
        )

    def whoami(self) -> AuditActor:
        """The caller as the API server identifies them (SelfSubjectReview); ``unknown`` if it cannot say."""
        try:
            review = self._call(
                client.AuthenticationV1Api(self.api_client).create_self_subject_review,
                client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"),
            )
        except KubeError:
            return AuditActor(username="unknown")
        info = review.status.user_info if review.status is not None else None
        if info is None:
            return AuditActor(username="unknown")
        return AuditActor(
            username=info.username or "unknown", uid=info.uid or None, groups=list(info.groups or [])[:16]
        )


def load_api(kubeconfig: str | None) -> CliKube:
    """The CLI's door, from the kubeconfig; exit 2 with a one-line reason when it cannot be loaded."""
    try:
        api_client = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except Exception as err:
        typer.secho(f"cannot load kubeconfig: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    return CliKube(api_client)


def api_error(err: KubeError, what: str) -> typer.Exit:
    """Print the API server's own message for a refused call and return the Exit to raise."""
    typer.secho(f"{what}: {err.status} {err.message}", fg=typer.colors.RED, err=True)
    return typer.Exit(1)


def whoami(api: CliKube) -> AuditActor:
    """The caller as the API server identifies them; see :meth:`CliKube.whoami`."""
    return api.whoami()

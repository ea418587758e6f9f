"""The CLI's door to the Kubernetes API: loading a client, the calls commands make, reporting errors.

In ``helmhive.cli`` only this module imports the ``kubernetes`` client. :class:`CliKube` offers the
few synchronous calls ``change``, ``sessions`` and ``suggestions`` make -- custom objects (get, list,
create, merge patch of the object or its status), a ConfigMap's data, removing one key of a Secret,
and who the caller is -- and raises only the error tree of :mod:`helmhive.api.kubeerrors`, as the operator's and the
runner's doors do. ``explain-routing`` makes its calls through the operator's door
(``helmhive.controller.kube.door``) on a client loaded here (:func:`load_api_client`).

The kubeconfig, the default namespace, the timeout, the bounded retries and the words for a
call that got no answer are :mod:`helmhive.cli.client_policy`'s (re-exported here for the
commands). A kubeconfig that cannot be loaded is reported in one line that quotes nothing from
the file (:func:`describe_kubeconfig_error`): a broken line may hold a token.

A failure is printed as one red line (``<what>: [<status>] <message>``; for 429 and 5xx
``<what>: the API server answered that it is busy: 429 <message>`` or the like) and exits
non-zero; no command prints a stack trace for a user's mistake, a refused request or a silent server. Text read
from objects is shown through :mod:`helmhive.cli.render`.
"""

from __future__ import annotations

import builtins
import enum
import os
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar, cast

import typer
import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from helmhive.api.audit import AuditActor
from helmhive.api.kinds import GROUP, VERSION
from helmhive.api.kubeerrors import KubeError, Unavailable
from helmhive.cli.client_policy import (
    DEFAULT_TIMEOUT_SECONDS,
    SERVICE_ACCOUNT_NAMESPACE,
    TIMEOUT_ENV,
    bounded_retries,
    context_namespace,
    decide_current_context,
    decide_namespace,
    decide_timeout,
    describe_no_answer,
    describe_unavailable,
    kubeconfig_files,
    kubeconfig_path,
    read_kubeconfigs,
    server_address,
)
from helmhive.cli.render import describe_yaml_error, fail
from helmhive.kubeclient import NETWORK_ERRORS, throttle_credential_refresh, translate_api_error

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "SERVICE_ACCOUNT_NAMESPACE",
    "TIMEOUT_ENV",
    "CliKube",
    "KubeconfigError",
    "KubeconfigOption",
    "NamespaceOption",
    "OutputOption",
    "PrintFormat",
    "api_error",
    "bounded_retries",
    "context_namespace",
    "decide_current_context",
    "decide_namespace",
    "decide_timeout",
    "describe_kubeconfig_error",
    "describe_no_answer",
    "describe_unavailable",
    "load_api",
    "load_api_client",
    "server_address",
    "whoami",
]


class PrintFormat(enum.StrEnum):
    """How a command prints its answer (``-o``): a table for people, JSON for scripts. Not an
    envelope's output contract (:class:`helmhive.api.envelope.OutputFormat`)."""

    TABLE = "table"
    JSON = "json"


KubeconfigOption = Annotated[str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig to use.")]
NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace of the object (default: the kubeconfig context's)."),
]
OutputOption = Annotated[PrintFormat, typer.Option("--output", "-o", metavar="table|json", help="table or json")]
T = TypeVar("T")


# The calls ------------------------------------------------------------------------------------
class CliKube:
    """The CLI's API calls, synchronous. Every method may raise a :class:`~helmhive.api.kubeerrors.KubeError`."""

    def __init__(self, api_client: Any, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.api_client = api_client
        self.timeout = timeout
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, _request_timeout=(self.timeout, self.timeout), **kwargs)
        except NETWORK_ERRORS as exc:
            if isinstance(exc, ApiException) and exc.status:
                raise translate_api_error(exc) from exc
            server = server_address(str(self.api_client.configuration.host))
            raise Unavailable(0, describe_no_answer(exc, server=server, timeout=self.timeout)) from exc

    # Custom objects (``plural`` of the helmhive.dev group) ---------------------------------
    def get(self, plural: str, name: str, namespace: str) -> dict[str, Any]:
        result = self._call(self._custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name)
        return cast(dict[str, Any], result)

    def list(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        result = self._call(self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural)
        return list(cast(dict[str, Any], result).get("items", []))

    def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        result = self._call(self._custom.create_namespaced_custom_object, GROUP, VERSION, namespace, plural, body)
        return cast(dict[str, Any], result)

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

    def list_scoped(self, plural: str | None, namespace: str | None) -> tuple[builtins.list[dict[str, Any]], str]:
        """List custom objects in ``namespace`` (None: every namespace); the items and the list's resourceVersion.

        ``plural`` None lists the core Events of ``namespace`` instead (as plain dicts).
        """
        if plural is None:
            assert namespace is not None
            events = self._call(self._core.list_namespaced_event, namespace)
            items = [cast(dict[str, Any], self.api_client.sanitize_for_serialization(e)) for e in events.items]
            return items, str(getattr(events.metadata, "resource_version", "") or "")
        if namespace is None:
            result = self._call(self._custom.list_cluster_custom_object, GROUP, VERSION, plural)
        else:
            result = self._call(self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural)
        body = cast(dict[str, Any], result)
        return list(body.get("items", [])), str((body.get("metadata") or {}).get("resourceVersion") or "")

    def watch_scoped(
        self, plural: str | None, namespace: str | None, *, resource_version: str, seconds: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Watch custom objects (``plural``; None: core Events in ``namespace``) from ``resource_version``.

        Yields ``(type, object)``; ends after ``seconds`` (the server closes the watch). A refused or
        lost watch raises :class:`~helmhive.api.kubeerrors.KubeError` as every other call does.
        """
        if plural is None:
            assert namespace is not None
            fn: Callable[..., Any] = self._core.list_namespaced_event
            args: tuple[Any, ...] = (namespace,)
        elif namespace is None:
            fn, args = self._custom.list_cluster_custom_object, (GROUP, VERSION, plural)
        else:
            fn, args = self._custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, plural)
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            fn,
            *args,
            resource_version=resource_version,
            timeout_seconds=seconds,
            _request_timeout=(self.timeout, seconds + self.timeout),
        )
        try:
            for event in stream:
                raw = event.get("raw_object")
                yield str(event.get("type")), raw if isinstance(raw, dict) else {}
        except NETWORK_ERRORS as exc:
            if isinstance(exc, ApiException) and exc.status:
                raise translate_api_error(exc) from exc
            server = server_address(str(self.api_client.configuration.host))
            raise Unavailable(0, describe_no_answer(exc, server=server, timeout=self.timeout)) from exc

    # Core objects ----------------------------------------------------------------------
    def events_about(self, namespace: str, kind: str, name: str) -> tuple[builtins.list[dict[str, Any]], str]:
        """The core Events about one object, as plain dicts (camelCase), and the list's resourceVersion."""
        result = self._call(
            self._core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.kind={kind},involvedObject.name={name}",
        )
        items = [cast(dict[str, Any], self.api_client.sanitize_for_serialization(e)) for e in result.items]
        return items, str(getattr(result.metadata, "resource_version", "") or "")

    def controller_revisions(self, namespace: str, label_selector: str) -> builtins.list[dict[str, Any]]:
        """The ControllerRevisions of ``namespace`` matching ``label_selector`` (profile revisions), as dicts."""
        result = self._call(
            client.AppsV1Api(self.api_client).list_namespaced_controller_revision,
            namespace,
            label_selector=label_selector,
        )
        return [cast(dict[str, Any], self.api_client.sanitize_for_serialization(r)) for r in result.items]

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


# Loading a client ------------------------------------------------------------------------------
class KubeconfigError(Exception):
    """No client could be loaded; the message is one line that quotes nothing from the file."""


def describe_kubeconfig_error(err: BaseException, *, path: str | None) -> str:
    """Why the kubeconfig at ``path`` (None: none, and the pod's identity failed) could not be loaded. Pure.

    A YAML error is named by its position and problem only: PyYAML's own message quotes the
    broken line, which may hold a token.
    """
    if isinstance(err, yaml.YAMLError):
        reason = describe_yaml_error(err)
    elif isinstance(err, UnicodeDecodeError):
        reason = f"not UTF-8 text (byte {err.start}: {err.reason})"
    elif isinstance(err, config.ConfigException):  # the loader's own words
        reason = str(err)
    elif isinstance(err, OSError):
        reason = str(err.strerror or err)
    else:  # a file of another shape: a list, a base64 field that is not base64, ...
        reason = f"not a valid kubeconfig: {err or type(err).__name__}"
    if path is None:
        return f"no --kubeconfig, $KUBECONFIG or ~/.kube/config, and not in a cluster ({reason})"
    return f"{path}: {reason}"


def load_api_client(kubeconfig: str | None, *, timeout: float | None = None) -> Any:
    """An ``ApiClient`` from the kubeconfig kubectl would use, else the pod's identity; else :class:`KubeconfigError`.

    An answer asking to be retried is retried, within ``timeout`` (:func:`bounded_retries`; None:
    ``$HELMHIVE_CLI_TIMEOUT_SECONDS``'s, else the default). The calls' own timeouts are the
    caller's. The credentials are read again at most once a second
    (:func:`~helmhive.kubeclient.throttle_credential_refresh`).
    """
    if timeout is None:
        try:
            timeout = decide_timeout(os.environ.get(TIMEOUT_ENV))
        except ValueError:  # the command reports it; the retries need only a bound
            timeout = DEFAULT_TIMEOUT_SECONDS
    path = kubeconfig_path(kubeconfig)
    if path is not None and not kubeconfig_files(path):
        raise KubeconfigError(f"{path}: no such file")
    configuration = client.Configuration()
    try:
        if path is None:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            context, _ = decide_current_context(read_kubeconfigs(path))
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration
            )
    except Exception as err:  # the loader raises ConfigException, binascii.Error, TypeError, ...: all mean the same
        raise KubeconfigError(describe_kubeconfig_error(err, path=path)) from None
    configuration.retries = bounded_retries(timeout)
    throttle_credential_refresh(configuration)
    return client.ApiClient(configuration)


def load_api(kubeconfig: str | None) -> CliKube:
    """The CLI's door (:func:`load_api_client`), each call bounded by :func:`decide_timeout`; exit 2 with a reason."""
    try:
        timeout = decide_timeout(os.environ.get(TIMEOUT_ENV))
    except ValueError as err:
        raise fail(str(err), 2) from None
    try:
        return CliKube(load_api_client(kubeconfig, timeout=timeout), timeout=timeout)
    except KubeconfigError as err:
        raise fail(f"cannot load kubeconfig: {err}", 2) from None


def api_error(err: KubeError, what: str) -> typer.Exit:
    """Print the API server's own message (or why there was none) for a failed call; return the Exit to raise."""
    if isinstance(err, Unavailable) and err.status:  # 429 or 5xx: it did answer, after the retries too
        return fail(f"{what}: {describe_unavailable(err.status, err.message)}", 1)
    status = f"{err.status} " if err.status else ""
    return fail(f"{what}: {status}{err.message}", 1)


def whoami(api: CliKube) -> AuditActor:
    """The caller as the API server identifies them; see :meth:`CliKube.whoami`."""
    return api.whoami()

"""The operator's door to the Kubernetes API (besides Kopf's own watch machinery).

In the operator (``helmhive.controller``) only this module imports the ``kubernetes`` client;
an import-linter contract in ``pyproject.toml`` enforces it. It offers small typed async
methods -- custom objects, ControllerRevisions, server-side apply of the kinds a pool owns,
Secrets, Services, Namespaces, warm job pods, Events and the leader-election Lease -- that run
the synchronous client in a thread (the default pool, or an executor of the caller's, so the
leader elector never queues behind routing), and raises only the error tree of
:mod:`helmhive.api.kubeerrors`, the runner's too (``helmhive.runner.kube``)::

    KubeError
     ├── NotFound      (404)
     ├── Conflict      (409: already exists, or a stale resourceVersion)
     ├── Forbidden     (401, 403)
     ├── Invalid       (400, 422: the API server refused the object; ``message`` says why)
     └── Unavailable   (429, 5xx, timeouts, connection errors: worth retrying)

Custom objects (every AgentJob read and write, the hot path), Events and the contact probe are
plain JSON requests on the client's own pool, inherited from
:class:`helmhive.controller.kube.jsonapi.JsonKube`; this module adds the calls that go through the
generated client (ControllerRevisions, server-side apply, Secrets, Namespaces).

Handlers receive a :class:`Kube` instance, so tests inject one bound to the real test
cluster and nothing reaches a network they did not choose. Every write is counted in
``helmhive_api_writes_total`` (:mod:`helmhive.controller.metrics`) by kind, verb and result.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, cast

from kubernetes import client

from helmhive.api.kinds import GROUP, VERSION, KindDef
from helmhive.api.kubeerrors import Conflict, Forbidden, Invalid, KubeError, NotFound, Unavailable
from helmhive.controller.kube.hooks import report_api_write
from helmhive.controller.kube.jsonapi import JsonKube
from helmhive.kubeclient import API_CONNECTIONS, NETWORK_ERRORS, load_api_client, translate_api_error

__all__ = [
    "API_CONNECTIONS",
    "FIELD_MANAGER",
    "Conflict",
    "Forbidden",
    "Invalid",
    "Kube",
    "KubeError",
    "NotFound",
    "Unavailable",
    "load_api_client",
]


FIELD_MANAGER = "helmhive-operator"
_APPLY = "application/apply-patch+yaml"
# (apiVersion, kind) -> (Kube attribute holding the typed API, the kind in the method names)
_BUILTIN_KINDS: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "ServiceAccount"): ("core", "service_account"),
    ("v1", "ConfigMap"): ("core", "config_map"),
    ("v1", "Secret"): ("core", "secret"),
    ("v1", "Service"): ("core", "service"),
    ("v1", "Pod"): ("core", "pod"),
    ("coordination.k8s.io/v1", "Lease"): ("coordination", "lease"),
    ("rbac.authorization.k8s.io/v1", "Role"): ("rbac", "role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rbac", "role_binding"),
    ("apps/v1", "StatefulSet"): ("apps", "stateful_set"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("networking", "network_policy"),
    ("policy/v1", "PodDisruptionBudget"): ("policy", "pod_disruption_budget"),
}


class Kube(JsonKube):
    """Async wrapper over the synchronous client, for custom objects and a few core kinds."""

    def __init__(
        self, api_client: Any, *, executor: Executor | None = None, request_timeout: tuple[float, float] | None = None
    ) -> None:
        """``executor`` runs the calls (default: asyncio's pool); ``request_timeout`` bounds each (connect, read)."""
        super().__init__(api_client, executor=executor, request_timeout=request_timeout)
        self.coordination = client.CoordinationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.rbac = client.RbacAuthorizationV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Run one client call in a thread; custom-object calls answer plain dicts."""
        if self.request_timeout is not None:
            kwargs.setdefault("_request_timeout", self.request_timeout)
        try:
            if self.executor is None:
                result = await asyncio.to_thread(fn, *args, **kwargs)
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))
            return cast(dict[str, Any], result)
        except NETWORK_ERRORS as exc:
            raise translate_api_error(exc) from exc

    async def _write(
        self, kind: str, verb: str, fn: Callable[..., Any], *args: Any, subresource: str = "", **kwargs: Any
    ) -> dict[str, Any]:
        """:meth:`_call` for a write, counted by kind, verb, subresource and result."""
        try:
            result = await self._call(fn, *args, **kwargs)
        except Exception as exc:
            report_api_write(kind=kind, verb=verb, subresource=subresource, error=exc)
            raise
        report_api_write(kind=kind, verb=verb, subresource=subresource)
        return result

    async def delete(self, kind: KindDef, name: str, namespace: str | None = None) -> None:
        try:
            if kind.namespaced:
                await self._write(
                    kind.kind,
                    "delete",
                    self.custom.delete_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    kind.plural,
                    name,
                )
            else:
                await self._write(
                    kind.kind, "delete", self.custom.delete_cluster_custom_object, GROUP, VERSION, kind.plural, name
                )
        except NotFound:
            return

    # ControllerRevisions (immutable profile snapshots) ----------------------------------
    async def list_revisions(self, namespace: str, label_selector: str) -> builtins.list[dict[str, Any]]:
        body = await self._call(self.apps.list_namespaced_controller_revision, namespace, label_selector=label_selector)
        items = self.api_client.sanitize_for_serialization(body).get("items", [])
        return list(items)

    async def create_revision(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        created = await self._write(
            "ControllerRevision", "create", self.apps.create_namespaced_controller_revision, namespace, body
        )
        return dict(self.api_client.sanitize_for_serialization(created))

    async def delete_revision(self, namespace: str, name: str) -> None:
        try:
            await self._write(
                "ControllerRevision", "delete", self.apps.delete_namespaced_controller_revision, name, namespace
            )
        except NotFound:
            return

    # Server-side apply (runner pools and runners) -----------------------------------
    def _builtin(self, api_version: str, kind: str, verb: str) -> Callable[..., Any]:
        """The typed client method ``<verb>_namespaced_<kind>`` for one of the kinds pools own."""
        api_attr, snake = _BUILTIN_KINDS[(api_version, kind)]
        fn: Callable[..., Any] = getattr(getattr(self, api_attr), f"{verb}_namespaced_{snake}")
        return fn

    async def apply(self, body: dict[str, Any], *, field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply a namespaced built-in object (forcing ownership of the fields in ``body``).

        An apply that changes nothing leaves the object, and its resourceVersion, as they were.
        """
        meta = body["metadata"]
        fn = self._builtin(body["apiVersion"], body["kind"], "patch")
        result = await self._write(
            body["kind"],
            "apply",
            fn,
            meta["name"],
            meta["namespace"],
            body,
            field_manager=field_manager,
            force=True,
            _content_type=_APPLY,
        )
        return dict(self.api_client.sanitize_for_serialization(result))

    def _wire(self, obj: Any) -> dict[str, Any]:
        """A typed client model as the plain dict the API server sent (camelCase keys)."""
        return dict(self.api_client.sanitize_for_serialization(obj))

    async def read_object(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any]:
        """Read a namespaced built-in object of one of the known kinds, as a plain dict."""
        return self._wire(await self._call(self._builtin(api_version, kind, "read"), name, namespace))

    async def create_object(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a namespaced built-in object of one of the known kinds; Conflict if it exists."""
        meta = body["metadata"]
        fn = self._builtin(body["apiVersion"], body["kind"], "create")
        return self._wire(await self._write(body["kind"], "create", fn, meta["namespace"], body))

    async def replace_object(self, body: dict[str, Any]) -> dict[str, Any]:
        """PUT a namespaced built-in object; ``metadata.resourceVersion`` makes it conditional (Conflict)."""
        meta = body["metadata"]
        fn = self._builtin(body["apiVersion"], body["kind"], "replace")
        return self._wire(await self._write(body["kind"], "update", fn, meta["name"], meta["namespace"], body))

    async def delete_object(self, api_version: str, kind: str, name: str, namespace: str) -> None:
        """Delete a namespaced built-in object; already gone counts as done."""
        try:
            await self._write(kind, "delete", self._builtin(api_version, kind, "delete"), name, namespace)
        except NotFound:
            return

    async def delete_pod(self, name: str, namespace: str, *, uid: str, resource_version: str) -> None:
        """Delete a pod only as it was read (Conflict if it changed since, e.g. a warm pod claimed); gone is done."""
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid, resource_version=resource_version)
        )
        try:
            await self._write("Pod", "delete", self.core.delete_namespaced_pod, name, namespace, body=options)
        except NotFound:
            return

    async def apply_custom(
        self,
        kind: KindDef,
        body: dict[str, Any],
        namespace: str,
        *,
        status: bool = False,
        field_manager: str = FIELD_MANAGER,
    ) -> dict[str, Any]:
        """Server-side apply a custom object, or (``status=True``) its status subresource."""
        fn = self.custom.patch_namespaced_custom_object_status if status else self.custom.patch_namespaced_custom_object
        name = body["metadata"]["name"]
        return await self._write(
            kind.kind,
            "apply",
            fn,
            GROUP,
            VERSION,
            namespace,
            kind.plural,
            name,
            body,
            field_manager=field_manager,
            force=True,
            _content_type=_APPLY,
            subresource="status" if status else "",
        )

    async def read_secret_data(self, name: str, namespace: str) -> dict[str, str]:
        """The Secret's ``data`` (base64 values). Callers hash it and drop it; never log or store it."""
        secret = await self._call(self.core.read_namespaced_secret, name, namespace)
        data = self.api_client.sanitize_for_serialization(secret).get("data") or {}
        return {str(k): str(v) for k, v in data.items()}

    # Namespaces -----------------------------------------------------------------------
    async def read_namespace(self, name: str) -> dict[str, Any]:
        """The Namespace ``name`` as a plain dict (routing reads its labels)."""
        result = await self._call(self.core.read_namespace, name)
        return dict(self.api_client.sanitize_for_serialization(result))

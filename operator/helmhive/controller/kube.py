"""The operator's door to the Kubernetes API (besides Kopf's own watch machinery).

In the operator (``helmhive.controller``) only this module imports the ``kubernetes`` client;
an import-linter contract in ``pyproject.toml`` enforces it. It offers small typed async
methods -- custom objects, ControllerRevisions, server-side apply of the kinds a pool owns,
Secrets, Services, Namespaces, Events and the leader-election Lease -- that run the
synchronous client in a thread (the default pool, or an executor of the caller's, so the
leader elector never queues behind routing), and raises only the error tree of
:mod:`helmhive.api.kubeerrors`, the runner's too (``helmhive.runner.kube``)::

    KubeError
     ├── NotFound      (404)
     ├── Conflict      (409: already exists, or a stale resourceVersion)
     ├── Forbidden     (401, 403)
     ├── Invalid       (400, 422: the API server refused the object; ``message`` says why)
     └── Unavailable   (429, 5xx, timeouts, connection errors: worth retrying)

Custom objects (every AgentJob read and write, the hot path) go through :meth:`Kube._json`: one
JSON request on the client's own connection pool, TLS and credentials, without the generated
API's argument validation, request building and response models, which cost more CPU than the
request itself (issue 9: ≈ 10 ms of operator CPU per routed job).

Handlers receive a :class:`Kube` instance, so tests inject one bound to the real test
cluster and nothing reaches a network they did not choose. Every write is counted in
``helmhive_api_writes_total`` (:mod:`helmhive.controller.metrics`) by kind, verb and result.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as dt
import functools
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, cast
from urllib.parse import quote, urlencode, urlsplit

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helmhive.api.kinds import GROUP, VERSION, KindDef
from helmhive.api.kubeerrors import Conflict, Forbidden, Invalid, KubeError, NotFound, Unavailable
from helmhive.controller.metrics import record_api_write
from helmhive.kubeclient import API_CONNECTIONS, NETWORK_ERRORS, load_api_client, translate_api_error
from helmhive.policy.timestamps import format_timestamp

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
AUTH_HEADERS_TTL_SECONDS = 1.0
"""How long :meth:`Kube.request` reuses the credential headers it read. The client's kubeconfig
hook reloads the whole kubeconfig on every read (≈ 45 µs per request); a token it refreshes
reaches the requests at most this much later."""
_JSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS
_APPLY = "application/apply-patch+yaml"
_MERGE_PATCH = "application/merge-patch+json"
# (apiVersion, kind) -> (Kube attribute holding the typed API, the kind in the method names)
_BUILTIN_KINDS: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "ServiceAccount"): ("core", "service_account"),
    ("v1", "ConfigMap"): ("core", "config_map"),
    ("v1", "Secret"): ("core", "secret"),
    ("v1", "Service"): ("core", "service"),
    ("coordination.k8s.io/v1", "Lease"): ("coordination", "lease"),
    ("rbac.authorization.k8s.io/v1", "Role"): ("rbac", "role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rbac", "role_binding"),
    ("apps/v1", "StatefulSet"): ("apps", "stateful_set"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("networking", "network_policy"),
    ("policy/v1", "PodDisruptionBudget"): ("policy", "pod_disruption_budget"),
}


class Kube:
    """Async wrapper over the synchronous client, for custom objects and a few core kinds."""

    def __init__(
        self,
        api_client: Any,
        *,
        executor: Executor | None = None,
        request_timeout: tuple[float, float] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``executor`` runs the calls (default: asyncio's pool); ``request_timeout`` bounds each (connect, read);
        ``monotonic`` is the clock of the credential headers' reuse (:data:`AUTH_HEADERS_TTL_SECONDS`)."""
        self.api_client = api_client
        self.executor = executor
        self.request_timeout = request_timeout
        self.monotonic = monotonic
        self._auth: tuple[float, dict[str, str]] | None = None  # (read at, headers); threads swap it whole
        self._pool: Any = None  # the API server's urllib3 connection pool, taken from the client's manager
        self._probe_thread: ThreadPoolExecutor | None = None  # the contact probe's own thread (probe_contact)
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
            record_api_write(kind=kind, verb=verb, subresource=subresource, error=exc)
            raise
        record_api_write(kind=kind, verb=verb, subresource=subresource)
        return result

    # Custom objects: one plain JSON request each ------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        preload_content: bool = True,
        timeout: urllib3.Timeout | None = None,
        retries: Any = None,
    ) -> Any:
        """One request on the client's pool with its credentials; urllib3's response (runs in a thread).

        ``preload_content=False`` leaves the body to be streamed (the AgentJob watch,
        :mod:`helmhive.controller.kube_watch`); the caller then releases or shuts the response.
        ``retries`` (urllib3's; None: the pool's) is False for a caller that retries itself.
        """
        api = self.api_client
        configuration = api.configuration
        headers = {**api.default_headers, "Accept": "application/json", **self.auth_headers()}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            # Plain JSON (orjson: a routed job's status is ≈ 4.5 kB); anything else (a datetime, a
            # client model) as the generated client would write it.
            data = orjson.dumps(body, default=api.sanitize_for_serialization, option=_JSON_OPTIONS)
        if timeout is None and self.request_timeout is not None:
            timeout = urllib3.Timeout(connect=self.request_timeout[0], read=self.request_timeout[1])
        manager = api.rest_client.pool_manager
        if configuration.proxy:
            return manager.request(
                method,
                configuration.host + path,
                body=data,
                headers=headers,
                timeout=timeout,
                preload_content=preload_content,
                retries=retries,
            )
        # The host's pool directly: the manager would rebuild its pool key (every TLS setting) per request.
        if self._pool is None:
            self._pool = manager.connection_from_url(configuration.host)
        prefix = urlsplit(configuration.host).path.rstrip("/")  # a server behind a path (a proxy's)
        return self._pool.urlopen(
            method,
            prefix + path,
            body=data,
            headers=headers,
            timeout=timeout,
            redirect=False,
            preload_content=preload_content,
            retries=retries,
        )

    def auth_headers(self) -> dict[str, str]:
        """The credential headers (a bearer token, refreshed by the client's hook), read again at most
        every :data:`AUTH_HEADERS_TTL_SECONDS`. Safe from any thread: the cache is swapped whole."""
        now = self.monotonic()
        cached = self._auth
        if cached is not None and 0 <= now - cached[0] < AUTH_HEADERS_TTL_SECONDS:
            return cached[1]
        headers = {
            str(auth["key"]): str(auth["value"])
            for auth in self.api_client.configuration.auth_settings().values()
            if auth.get("in") == "header" and auth.get("value")
        }
        self._auth = (now, headers)
        return headers

    def _json(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """:meth:`request`, the answer as parsed JSON (runs in a thread).

        A status outside 2xx raises the client's own ``ApiException``, so :meth:`_call` maps it
        onto the error tree like any other call.
        """
        response = self.request(method, path, body, content_type=content_type)
        if not 200 <= response.status <= 299:
            raise ApiException(
                status=response.status, reason=response.reason, body=response.data.decode("utf-8", "replace")
            )
        return cast(dict[str, Any], orjson.loads(response.data))  # every job's write answers here: orjson is faster

    async def _json_call(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> dict[str, Any]:
        try:
            if self.executor is None:
                return await asyncio.to_thread(self._json, method, path, body, content_type=content_type)
            loop = asyncio.get_running_loop()
            call = functools.partial(self._json, method, path, body, content_type=content_type)
            return await loop.run_in_executor(self.executor, call)
        except NETWORK_ERRORS as exc:
            raise translate_api_error(exc) from exc

    async def _json_write(
        self, kind: str, verb: str, method: str, path: str, body: Any, *, subresource: str = "", content_type: str = ""
    ) -> dict[str, Any]:
        """:meth:`_json_call` for a write, counted by kind, verb, subresource and result."""
        try:
            result = await self._json_call(method, path, body, content_type=content_type or "application/json")
        except Exception as exc:
            record_api_write(kind=kind, verb=verb, subresource=subresource, error=exc)
            raise
        record_api_write(kind=kind, verb=verb, subresource=subresource)
        return result

    @staticmethod
    def _path(kind: KindDef, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        path = f"/apis/{GROUP}/{VERSION}"
        if kind.namespaced and namespace is not None:
            path += f"/namespaces/{quote(namespace, safe='')}"
        path += f"/{kind.plural}"
        if name is not None:
            path += f"/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path

    async def get(self, kind: KindDef, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self._json_call("GET", self._path(kind, namespace, name))

    async def list(
        self, kind: KindDef, namespace: str | None = None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """List from the API server (a consistent read, not a cache)."""
        query = f"?{urlencode({'labelSelector': label_selector})}" if label_selector else ""
        body = await self._json_call("GET", self._path(kind, namespace) + query)
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    async def list_page(
        self,
        kind: KindDef,
        *,
        limit: int,
        continue_token: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> dict[str, Any]:
        """One page of a list, cluster-wide without ``namespace``: the answer (``items``, ``metadata.continue``)."""
        params: dict[str, Any] = {"limit": limit}
        if label_selector:
            params["labelSelector"] = label_selector
        if continue_token:
            params["continue"] = continue_token
        return await self._json_call("GET", f"{self._path(kind, namespace)}?{urlencode(params)}")

    async def list_pages(
        self, kind: KindDef, namespace: str | None = None, *, limit: int, label_selector: str | None = None
    ) -> AsyncIterator[builtins.list[dict[str, Any]]]:
        """A paginated LIST, one page of items at a time: a caller that keeps only what it needs holds one page.

        An unpaginated LIST of 10,000 AgentJobs is one 65 MB answer parsed into some 350 MiB at once.
        Raises ``KubeError`` on any failure, a ``continue`` token that expired (410) too.
        """
        token: str | None = None
        while True:
            page = await self.list_page(
                kind, limit=limit, continue_token=token, namespace=namespace, label_selector=label_selector
            )
            token = (page.get("metadata") or {}).get("continue") or None
            yield page.get("items") or []
            if token is None:
                return

    async def create(self, kind: KindDef, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return await self._json_write(kind.kind, "create", "POST", self._path(kind, namespace), body)

    async def replace(
        self, kind: KindDef, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """PUT the whole object; ``body.metadata.resourceVersion`` makes it conditional."""
        return await self._json_write(kind.kind, "update", "PUT", self._path(kind, namespace, name), body)

    async def replace_status(self, kind: KindDef, name: str, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        """PUT the status subresource of a namespaced object; conditional on ``metadata.resourceVersion``."""
        path = self._path(kind, namespace, name, "status")
        return await self._json_write(kind.kind, "update", "PUT", path, body, subresource="status")

    async def patch_status(
        self, kind: KindDef, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """JSON-merge-patch the status subresource."""
        path = self._path(kind, namespace, name, "status")
        return await self._json_write(
            kind.kind, "patch", "PATCH", path, patch, subresource="status", content_type=_MERGE_PATCH
        )

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

    async def probe_contact(self, *, label_selector: str, request_timeout: tuple[float, float]) -> None:
        """One consistent read (a LIST of at most one Lease, served by etcd, not the watch cache).

        On its own thread, so a burst queued on the shared pool never delays it, and without
        urllib3's retries: the probe's caller decides what a slow or failed read means.
        """
        if self._probe_thread is None:
            self._probe_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-probe")
        path = "/apis/coordination.k8s.io/v1/leases?" + urlencode({"labelSelector": label_selector, "limit": 1})
        timeout = urllib3.Timeout(connect=request_timeout[0], read=request_timeout[1])
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._probe_thread, functools.partial(self._probe, path, timeout))
        except NETWORK_ERRORS as exc:
            raise translate_api_error(exc) from exc

    def _probe(self, path: str, timeout: urllib3.Timeout) -> None:
        response = self.request("GET", path, timeout=timeout, retries=False)
        if not 200 <= response.status <= 299:
            raise ApiException(
                status=response.status, reason=response.reason, body=response.data.decode("utf-8", "replace")
            )

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

    # Events -------------------------------------------------------------------------
    async def post_event(
        self,
        *,
        involved: dict[str, Any],
        reason: str,
        message: str,
        event_type: str = "Normal",
        component: str = "helmhive-operator",
        count: int = 1,
        now: dt.datetime,
    ) -> str | None:
        """Create a core/v1 Event about ``involved`` and return its name; best-effort (None on an error)."""
        meta = involved.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        reference = {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        }
        stamp = format_timestamp(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'helmhive')}.", "namespace": namespace},
            "involvedObject": {k: v for k, v in reference.items() if v is not None},
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": component},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": count,
        }
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/events"
        try:  # plain JSON, not the generated client: its models cost ≈ 200 us of CPU per Event
            created = await self._json_write("Event", "create", "POST", path, body)
        except KubeError:
            return None
        name = (created.get("metadata") or {}).get("name")
        return str(name) if name else None

    async def patch_event_series(
        self, name: str, *, namespace: str, count: int, message: str, now: dt.datetime
    ) -> None:
        """Raise an Event's ``count`` and ``lastTimestamp`` (as client-go's correlator does); raises KubeError."""
        patch = {"count": count, "lastTimestamp": format_timestamp(now), "message": message[:1024]}
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/events/{quote(name, safe='')}"
        await self._json_write("Event", "patch", "PATCH", path, patch, content_type=_MERGE_PATCH)

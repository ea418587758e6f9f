"""The operator's plain JSON requests: custom objects (every AgentJob read and write), Events, the contact probe.

Owns :class:`JsonKube`, the part of the operator's door (:class:`helmhive.controller.kube.door.Kube`
extends it) that sends one JSON request with the kubernetes client's server, TLS settings and
credentials, without the generated API's argument validation, request building and response
models, which cost more CPU than the request itself (issue 9: ≈ 10 ms of operator CPU per
routed job). The requests and answers (:meth:`JsonKube.get`, ``create``, ``replace_status`` and
the rest) are sent on the event loop (:mod:`helmhive.controller.kube.http`), unless the door was
given an executor, or the client a proxy or a named ``assert_hostname``: then each runs in a
thread on the client's urllib3 pool, as :meth:`JsonKube.request` (which the AgentJob watch and
the contact probe use, each on a thread of its own) always does. It imports no ``kubernetes``
module: an answer outside 2xx becomes the error tree's error for its status
(:func:`helmhive.api.kubeerrors.build_kube_error`), and no answer at all becomes ``Unavailable``
(:func:`helmhive.kubeclient.translate_api_error`).
Every write is counted in ``helmhive_api_writes_total`` by kind, verb, subresource and result.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as dt
import functools
from collections.abc import AsyncIterator
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, cast
from urllib.parse import quote, urlencode, urlsplit

import orjson
import urllib3

from helmhive.api.kinds import GROUP, VERSION, KindDef
from helmhive.api.kubeerrors import KubeError, build_kube_error
from helmhive.controller.kube.hooks import report_api_write
from helmhive.controller.kube.http import LoopHttp, decide_loop_capable
from helmhive.kubeclient import NETWORK_ERRORS, translate_api_error
from helmhive.policy.audit.events import build_event, build_event_series_patch

__all__ = ["MERGE_PATCH", "JsonKube"]

_JSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS
MERGE_PATCH = "application/merge-patch+json"


class JsonKube:
    """Custom objects, Events and the contact probe as plain JSON requests, each run in a thread."""

    def __init__(
        self, api_client: Any, *, executor: Executor | None = None, request_timeout: tuple[float, float] | None = None
    ) -> None:
        """``executor`` runs the calls (default: asyncio's pool); ``request_timeout`` bounds each (connect, read)."""
        self.api_client = api_client
        self.executor = executor
        self.request_timeout = request_timeout
        self._pool: Any = None  # the API server's urllib3 connection pool, taken from the client's manager
        self._probe_thread: ThreadPoolExecutor | None = None  # the contact probe's own thread (probe_contact)
        # JSON calls go on the event loop unless an executor was asked for, or aiohttp cannot reach the
        # server as the client would (a proxy, a named assert_hostname: decide_loop_capable).
        self._http: LoopHttp | None = None
        if executor is None and decide_loop_capable(api_client.configuration):
            self._http = LoopHttp(api_client.configuration, headers=self.auth_headers, request_timeout=request_timeout)

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
        :mod:`helmhive.controller.kube.watch`); the caller then releases or shuts the response.
        ``retries`` (urllib3's; None: the pool's) is False for a caller that retries itself.
        """
        api = self.api_client
        configuration = api.configuration
        headers = {**self._plain_headers(), **self.auth_headers()}
        data = self._encode(body, headers, content_type)
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

    def _plain_headers(self) -> dict[str, str]:
        return {**self.api_client.default_headers, "Accept": "application/json"}

    def _encode(self, body: Any, headers: dict[str, str], content_type: str) -> bytes | None:
        if body is None:
            return None
        headers["Content-Type"] = content_type
        # Plain JSON (orjson: a routed job's status is ≈ 4.5 kB); anything else (a datetime, a
        # client model) as the generated client would write it.
        return orjson.dumps(body, default=self.api_client.sanitize_for_serialization, option=_JSON_OPTIONS)

    def auth_headers(self) -> dict[str, str]:
        """The credential headers (a bearer token, refreshed by the client's hook: at most once a second in a
        client from :func:`~helmhive.kubeclient.load_api_client`)."""
        return {
            str(auth["key"]): str(auth["value"])
            for auth in self.api_client.configuration.auth_settings().values()
            if auth.get("in") == "header" and auth.get("value")
        }

    def _json(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """:meth:`request`, the answer as parsed JSON (runs in a thread).

        A status outside 2xx raises the error tree's error for that status (a ``KubeError``).
        """
        response = self.request(method, path, body, content_type=content_type)
        return _decoded(response.status, response.data, response.reason)

    async def _json_call(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> dict[str, Any]:
        if self._http is not None:
            headers = self._plain_headers()  # the credentials are added by the loop's session
            data = self._encode(body, headers, content_type)
            return _decoded(*await self._http.send(method, path, data, headers=headers))
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
            report_api_write(kind=kind, verb=verb, subresource=subresource, error=exc)
            raise
        report_api_write(kind=kind, verb=verb, subresource=subresource)
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
            kind.kind, "patch", "PATCH", path, patch, subresource="status", content_type=MERGE_PATCH
        )

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
            raise build_kube_error(response.status, response.data, response.reason)

    async def close(self) -> None:
        """Close the event loop's HTTP session (the door still works afterwards: it opens a new one)."""
        if self._http is not None:
            await self._http.close()

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
        body = build_event(
            involved, reason=reason, message=message, now=now, component=component, event_type=event_type, count=count
        )
        namespace = body["metadata"]["namespace"]
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
        patch = build_event_series_patch(count=count, message=message, now=now)
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/events/{quote(name, safe='')}"
        await self._json_write("Event", "patch", "PATCH", path, patch, content_type=MERGE_PATCH)


def _decoded(status: int, data: bytes, reason: str | None) -> dict[str, Any]:
    """An answer's JSON; a status outside 2xx raises the error tree's error for it (a ``KubeError``)."""
    if not 200 <= status <= 299:
        raise build_kube_error(status, data, reason)
    return cast(dict[str, Any], orjson.loads(data))  # every job's write answers here: orjson is faster

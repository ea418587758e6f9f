"""The runner's one door to the Kubernetes API.

Only this module (in ``helmhive.runner``) imports the ``kubernetes`` client; it builds on the
shared door ``helmhive.kubeclient`` (the client, the error translation), and
``tests/unit/test_layering.py`` checks that no other runner module imports ``kubernetes``. It offers the few
calls a runner makes -- its own Runner (get, create, watch, server-side apply of
``status.report``), its own Lease (get, create, update, delete), Events, and for the jobs it
runs: a watch of the AgentJobs assigned to it (a field selector, never a list of everything),
their status, the MemoryRecords they name, SessionBindings, its sessions Secret, the
artifact ConfigMaps and its job pods (:class:`~helmhive.runner.kube_pods.PodCalls`, a base) --
as async methods that run the synchronous client in a thread, each bounded by a request timeout.
API and network errors are mapped onto the operator's tree too (:mod:`helmhive.api.kubeerrors`),
chained with ``from exc``::

    KubeError
     ├── NotFound      (404)
     ├── Conflict      (409: already exists, or a stale resourceVersion)
     ├── Forbidden     (401, 403: RBAC, admission, or an expired/unbound token)
     ├── Invalid       (400, 422: the API server refused the object; ``message`` says why)
     └── Unavailable   (429, 5xx, timeouts, connection errors: worth retrying)

Nothing here decides anything: callers (registration, heartbeat, main) do.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, TypeVar, cast

from kubernetes import client, watch

from helmhive.api.kinds import API_VERSION, GROUP, VERSION
from helmhive.api.kubeerrors import Conflict, Forbidden, Invalid, KubeError, NotFound, Unavailable
from helmhive.kubeclient import NETWORK_ERRORS, load_api_client, translate_api_error
from helmhive.policy.audit.events import build_event
from helmhive.runner.kube_pods import PodCalls
from helmhive.runner.logs import fields
from helmhive.runner.watch_thread import WatchThread

__all__ = [
    "FIELD_MANAGER",
    "RUNNERS",
    "WATCH_JOIN_S",
    "Conflict",
    "Forbidden",
    "Invalid",
    "KubeError",
    "NotFound",
    "RunnerKube",
    "Unavailable",
    "WatchThread",
    "load_api_client",
]

log = logging.getLogger("helmhive.runner")

FIELD_MANAGER = "helmhive-runner"
RUNNERS = "runners"
REQUEST_TIMEOUT = (5.0, 15.0)
"""(connect, read) seconds for every call but the watch."""
WATCH_ROUND_S = 300
"""The longest one watch request lasts (server-side); the next resumes where it ended, without a list."""
WATCH_JOIN_S = sum(REQUEST_TIMEOUT) + 5.0
"""How long :meth:`WatchThread.join` waits by default: a list in flight cannot be interrupted."""

T = TypeVar("T")


def _log_relist(watch_name: str, reason: str) -> None:
    """Each list after the first says why (a quiet runner never lists; a list per round was a poll)."""
    log.info("watch listing again", extra=fields(watch=watch_name, reason=reason))


def _answered_by(handle: WatchThread, list_objects: Callable[..., Any]) -> Callable[..., Any]:
    """``list_objects`` for a watch request that hands its response to ``handle`` before it is read."""

    @functools.wraps(list_objects)  # the watch reads the call's docstring (its return type)
    def watch_request(*args: Any, **kwargs: Any) -> Any:
        response = list_objects(*args, **kwargs)
        handle.answered(response)  # shut at once if a stop or a list was asked on the way
        return response

    return watch_request


class RunnerKube(PodCalls):
    """The runner's API calls, scoped to one namespace. Every method may raise a :class:`KubeError`."""

    def __init__(self, api_client: Any, *, namespace: str) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self._custom = client.CustomObjectsApi(api_client)
        self._leases = client.CoordinationV1Api(api_client)
        self._core = client.CoreV1Api(api_client)

    def close(self) -> None:
        self.api_client.close()

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except NETWORK_ERRORS as exc:
            raise translate_api_error(exc) from exc

    # Runner ----------------------------------------------------------------------------
    async def get_runner(self, name: str) -> dict[str, Any]:
        result = await self._call(
            self._custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, RUNNERS, name
        )
        return cast(dict[str, Any], result)

    async def create_runner(self, body: dict[str, Any]) -> dict[str, Any]:
        result = await self._call(
            self._custom.create_namespaced_custom_object, GROUP, VERSION, self.namespace, RUNNERS, body
        )
        return cast(dict[str, Any], result)

    async def apply_runner_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply ``status`` (only the fields given) as field manager ``helmhive-runner``."""
        body = {"apiVersion": API_VERSION, "kind": "Runner", "metadata": {"name": name}, "status": status}
        result = await self._call(
            self._custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            self.namespace,
            RUNNERS,
            name,
            body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        return cast(dict[str, Any], result)

    def watch_runner(
        self,
        name: str,
        *,
        on_object: Callable[[dict[str, Any] | None], None],
        on_error: Callable[[KubeError], None],
        stop: threading.Event,
        timeout_s: int = WATCH_ROUND_S,
        backoff_s: float = 2.0,
    ) -> WatchThread:
        """Watch Runner ``name`` in a daemon thread, as :meth:`watch_objects` does, until stopped.

        ``on_object`` gets the object on every change (``None`` once it is deleted), called from
        the thread. Errors are reported to ``on_error`` and retried after ``backoff_s``. Stop it
        with the returned handle's :meth:`WatchThread.join` (setting ``stop`` alone leaves a read
        blocked).
        """

        def on_event(kind: str, obj: dict[str, Any] | None) -> None:
            if kind == "LISTED":
                return
            on_object(None if kind == "DELETED" else obj)

        def on_list(items: list[dict[str, Any]]) -> None:
            on_object(items[0] if items else None)

        return self.watch_objects(
            RUNNERS,
            field_selector=f"metadata.name={name}",
            on_event=on_event,
            on_list=on_list,
            on_error=on_error,
            stop=stop,
            timeout_s=timeout_s,
            backoff_s=backoff_s,
            thread_name=f"watch-runner-{name}",
        )

    def watch_objects(
        self,
        plural: str,
        *,
        field_selector: str,
        on_event: Callable[[str, dict[str, Any]], None],
        on_list: Callable[[list[dict[str, Any]]], None],
        on_error: Callable[[KubeError], None],
        stop: threading.Event,
        timeout_s: int = WATCH_ROUND_S,
        backoff_s: float = 2.0,
        max_backoff_s: float = 60.0,
        thread_name: str = "watch",
    ) -> WatchThread:
        """Watch the ``plural`` objects matching ``field_selector`` in a daemon thread, until stopped.

        As client-go's reflector does: list once (``on_list`` gets every item), then watch from
        that version in rounds of at most ``timeout_s`` (a server-side limit), each resuming
        from the last version seen (events and bookmarks), so a quiet runner costs the API
        server no list. It lists again only when the version is too old (410), after an error
        (the API server may have been away: what it missed is read whole), or when asked
        (:meth:`WatchThread.relist`). ``on_event(type, object)`` gets ``ADDED``, ``MODIFIED``
        and ``DELETED``. Errors go to ``on_error`` and are retried with a doubling backoff. The
        returned handle stops the thread and waits for it (:meth:`WatchThread.join`).
        """
        return self._watch(
            self._custom.list_namespaced_custom_object,
            (GROUP, VERSION, self.namespace, plural),
            field_selector=field_selector,
            on_event=on_event,
            on_list=on_list,
            on_error=on_error,
            stop=stop,
            timeout_s=timeout_s,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            thread_name=thread_name,
        )

    def _watch(
        self,
        list_objects: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        field_selector: str,
        on_event: Callable[[str, dict[str, Any]], None],
        on_list: Callable[[list[dict[str, Any]]], None],
        on_error: Callable[[KubeError], None],
        stop: threading.Event,
        timeout_s: int,
        backoff_s: float,
        max_backoff_s: float,
        thread_name: str,
    ) -> WatchThread:
        """:meth:`watch_objects` of any list call (``list_objects(*args, ...)``: custom objects, pods)."""
        handle = WatchThread(name=thread_name, stop=stop, join_timeout=WATCH_JOIN_S)
        watch_request = _answered_by(handle, list_objects)

        def loop() -> None:
            delay = backoff_s
            version: str | None = None  # None: list first
            while not stop.is_set():
                try:
                    if handle.take_relist() and version is not None:
                        version = None
                        _log_relist(thread_name, "asked")
                    if version is None:
                        answer = list_objects(*args, field_selector=field_selector, _request_timeout=REQUEST_TIMEOUT)
                        listed: dict[str, Any] = self._plain(answer)  # a typed list (pods) in the wire's shape
                        delay = backoff_s
                        on_list(list(listed.get("items") or []))
                        version = (listed.get("metadata") or {}).get("resourceVersion")
                        if stop.is_set():
                            break
                    stream = watch.Watch()  # type: ignore[no-untyped-call]
                    handle.attach(stream)
                    if handle.relist_requested:  # asked for while listing: that list may predate the ask
                        continue
                    for event in stream.stream(  # type: ignore[no-untyped-call]
                        watch_request,
                        *args,
                        field_selector=field_selector,
                        resource_version=version,
                        allow_watch_bookmarks=True,
                        timeout_seconds=int(timeout_s),
                        _request_timeout=(REQUEST_TIMEOUT[0], float(timeout_s) + 10.0),
                    ):
                        if stop.is_set():
                            stream.stop()  # type: ignore[no-untyped-call]
                            break
                        kind, raw = event.get("type"), event.get("raw_object")
                        if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(raw, dict):
                            on_event(str(kind), raw)
                    version = stream.resource_version or version  # the next round resumes here
                    delay = backoff_s
                except Exception as exc:  # the thread must survive any client hiccup
                    if stop.is_set():
                        break  # shutting down: the client was closed under the watch, nothing to report
                    if handle.relist_requested:
                        continue  # a list was asked for (the socket was shut under the watch)
                    gone = getattr(exc, "status", None) == HTTPStatus.GONE
                    if version is not None:
                        _log_relist(thread_name, "version too old" if gone else "after an error")
                    version = None
                    if gone:
                        continue  # nothing is wrong: list again at once
                    on_error(translate_api_error(exc))  # anything but an answer is Unavailable
                    stop.wait(delay)
                    delay = min(delay * 2, max_backoff_s)
                finally:
                    handle.attach(None)

        # A daemon still, so a thread that will not end cannot hold the process up; the runner
        # joins it before it exits (main.RunnerProcess.run) and names any that is left.
        handle.thread = threading.Thread(target=loop, name=thread_name, daemon=True)
        handle.thread.start()
        return handle

    # Custom objects of the runner's namespace (AgentJobs, SessionBindings, MemoryRecords) -------
    async def get_object(self, plural: str, name: str) -> dict[str, Any]:
        result = await self._call(
            self._custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, name
        )
        return cast(dict[str, Any], result)

    async def create_object(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        result = await self._call(
            self._custom.create_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, body
        )
        return cast(dict[str, Any], result)

    async def merge_patch_status(self, plural: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of ``/status``; ``metadata.resourceVersion`` in ``patch`` makes it conditional."""
        result = await self._call(
            self._custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            self.namespace,
            plural,
            name,
            patch,
            _content_type="application/merge-patch+json",
        )
        return cast(dict[str, Any], result)

    # Secrets and ConfigMaps ----------------------------------------------------------------
    async def get_secret_data(self, name: str) -> dict[str, str]:
        """The Secret's ``data`` (base64 values, as stored)."""
        secret = await self._call(self._core.read_namespaced_secret, name, self.namespace)
        return {str(key): str(value) for key, value in (secret.data or {}).items()}

    async def merge_patch_secret(self, name: str, patch: dict[str, Any]) -> None:
        await self._call(
            self._core.patch_namespaced_secret,
            name,
            self.namespace,
            patch,
            _content_type="application/merge-patch+json",
        )

    async def create_config_map(self, body: dict[str, Any]) -> None:
        await self._call(self._core.create_namespaced_config_map, self.namespace, body)

    async def get_config_map_data(self, name: str) -> dict[str, str]:
        """A ConfigMap's ``data`` (a review job's patch, from the implementation job's artifacts)."""
        config_map = await self._call(self._core.read_namespaced_config_map, name, self.namespace)
        return {str(key): str(value) for key, value in (config_map.data or {}).items()}

    # Lease -----------------------------------------------------------------------------
    def _wire(self, obj: Any) -> dict[str, Any]:
        return cast(dict[str, Any], self.api_client.sanitize_for_serialization(obj))

    def _plain(self, obj: Any) -> dict[str, Any]:
        """A typed answer (a pod, a pod list) as the API serves it; a custom object's dict as it is."""
        return obj if isinstance(obj, dict) else self._wire(obj)

    async def get_lease(self, name: str) -> dict[str, Any]:
        return self._wire(await self._call(self._leases.read_namespaced_lease, name, self.namespace))

    async def create_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        lease = client.V1Lease.from_dict(body)
        return self._wire(await self._call(self._leases.create_namespaced_lease, self.namespace, lease))

    async def replace_lease(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT the Lease; ``metadata.resourceVersion`` in ``body`` makes it conditional (Conflict if stale)."""
        lease = client.V1Lease.from_dict(body)
        return self._wire(await self._call(self._leases.replace_namespaced_lease, name, self.namespace, lease))

    async def delete_lease(self, name: str) -> bool:
        """Delete the Lease; return False if it was already gone."""
        try:
            await self._call(self._leases.delete_namespaced_lease, name, self.namespace)
        except NotFound:
            return False
        return True

    # Events ----------------------------------------------------------------------------
    async def post_event(
        self,
        *,
        runner: dict[str, Any],
        reason: str,
        message: str,
        now: dt.datetime,
        event_type: str = "Normal",
        kind: str = "Runner",
    ) -> bool:
        """Create a core/v1 Event about ``runner`` (its own Runner, or a job of ``kind``); best effort."""
        meta = runner.get("metadata", {})
        involved = {
            "apiVersion": API_VERSION,
            "kind": kind,
            "metadata": {"name": meta.get("name"), "namespace": self.namespace, "uid": meta.get("uid")},
        }
        body = build_event(
            involved, reason=reason, message=message, now=now, component=FIELD_MANAGER, event_type=event_type
        )
        try:
            await self._call(self._core.create_namespaced_event, self.namespace, body)
        except KubeError:
            return False
        return True

"""The runner's calls about its job pods (``RunnerPool.spec.execution.mode: JobPod``), in its namespace.

:class:`PodCalls` is a base of :class:`helmhive.runner.kube.RunnerKube`, kept apart for its size:
it uses that class's client and translation (``_call``, ``_watch``), and imports no Kubernetes client
itself. List by label, get, create, claim with a JSON merge patch (a warm pod's claim carries its
``resourceVersion``: :class:`~helmhive.api.kubeerrors.Conflict` when another runner claimed it
first), delete, and wait on one pod through a watch (:meth:`PodCalls.wait_pod`), never by polling.
Nothing here decides anything: :mod:`helmhive.runner.jobs.podclaim` does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from helmhive.api.kubeerrors import Forbidden, Invalid, KubeError, NotFound
from helmhive.runner.watch_thread import WatchThread

__all__ = ["WAIT_ROUND_S", "PodCalls"]

T = TypeVar("T")
WAIT_ROUND_S = 300
"""The longest one watch request of :meth:`PodCalls.wait_pod` lasts; the next resumes from there."""
MERGE_PATCH = "application/merge-patch+json"


class PodCalls:
    """Job pods: every method may raise a :class:`~helmhive.api.kubeerrors.KubeError`."""

    namespace: str
    _core: Any

    if TYPE_CHECKING:

        async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...
        def _wire(self, obj: Any) -> dict[str, Any]: ...
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
        ) -> WatchThread: ...

    async def list_pods(self, *, label_selector: str) -> list[dict[str, Any]]:
        listed = await self._call(self._core.list_namespaced_pod, self.namespace, label_selector=label_selector)
        return [self._wire(pod) for pod in listed.items]

    async def get_pod(self, name: str) -> dict[str, Any]:
        return self._wire(await self._call(self._core.read_namespaced_pod, name, self.namespace))

    async def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._wire(await self._call(self._core.create_namespaced_pod, self.namespace, body))

    async def merge_patch_pod(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the pod; ``metadata.resourceVersion`` in ``patch`` makes it conditional
        (Conflict if the pod changed since it was read: a warm pod's claim)."""
        result = await self._call(
            self._core.patch_namespaced_pod, name, self.namespace, patch, _content_type=MERGE_PATCH
        )
        return self._wire(result)

    async def delete_pod(self, name: str, *, grace_seconds: int | None = None) -> bool:
        """Delete the pod; False if it was already gone."""
        try:
            await self._call(self._core.delete_namespaced_pod, name, self.namespace, grace_period_seconds=grace_seconds)
        except NotFound:
            return False
        return True

    async def wait_pod(
        self, name: str, decide: Callable[[dict[str, Any] | None], T | None], *, timeout_s: int = WAIT_ROUND_S
    ) -> T:
        """Watch pod ``name`` until ``decide`` returns something for it: its state as the API serves it,
        or None once it is gone. No polling: a list, then a watch from there (as ``RunnerKube.watch_objects``).

        An error the watch would only repeat (Forbidden, Invalid) is raised; anything else is retried.
        The watch's thread has ended when this returns, also when the caller is cancelled.
        """
        loop = asyncio.get_running_loop()
        found: asyncio.Future[T] = loop.create_future()

        def offer(pod: dict[str, Any] | None) -> None:
            if found.done():
                return
            try:
                verdict = decide(pod)
            except Exception as exc:  # the caller's rule failed: its error is the wait's
                found.set_exception(exc)
                return
            if verdict is not None:
                found.set_result(verdict)

        def fail(exc: KubeError) -> None:
            if isinstance(exc, Forbidden | Invalid) and not found.done():
                found.set_exception(exc)

        def on_event(kind: str, pod: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(offer, None if kind == "DELETED" else pod)

        def on_list(items: list[dict[str, Any]]) -> None:
            loop.call_soon_threadsafe(offer, items[0] if items else None)

        def on_error(exc: KubeError) -> None:
            loop.call_soon_threadsafe(fail, exc)

        handle = self._watch(
            self._core.list_namespaced_pod,
            (self.namespace,),
            field_selector=f"metadata.name={name}",
            on_event=on_event,
            on_list=on_list,
            on_error=on_error,
            stop=threading.Event(),
            timeout_s=timeout_s,
            backoff_s=1.0,
            max_backoff_s=15.0,
            thread_name=f"watch-pod-{name}",
        )
        try:
            return await found
        finally:
            await asyncio.to_thread(handle.join)

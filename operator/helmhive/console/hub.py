"""The console's live updates: one Kubernetes watch per kind, fanned out to every open page.

A :class:`Hub` runs one thread per watched kind (RunnerPools, Runners, AgentJobs, Changes, and
the namespace's Events), each listing then watching with the user's own credentials. Every event
is told to the subscribers (each open page's Server-Sent Events stream) as a short notice —
the kind that changed, never the object — and the page then asks again for its own body. So a
page is refreshed by watch events only: no polling per object.

A watch that fails (a lost API server, a refused watch) is retried with a growing pause of at
most :data:`MAX_PAUSE` seconds; the pages are told ``lost`` with the reason (once per cause, not
at every retry), and once a list succeeds again ``resync``, so they recover on their own. A watch
that ends (the server closes it after :data:`WATCH_SECONDS`) is listed again and followed by a
``resync`` too, since what changed in between is not known.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from helmhive.api.kubeerrors import Forbidden, KubeError

__all__ = ["MAX_PAUSE", "Hub", "Notice", "WatchTarget"]

MAX_PAUSE = 5.0
WATCH_SECONDS = 240


@dataclass(frozen=True)
class Notice:
    """What a page is told: ``changed`` (a kind changed), ``lost`` (a watch failed) or ``resync``."""

    event: str
    kind: str
    detail: str = ""
    name: str = ""
    """For ``changed``: the object's name (an Event's: the name of the object it is about)."""

    def concerns(self, wanted: dict[str, str | None]) -> bool:
        """Whether a page that watches ``wanted`` (kind to one name, or None for all) is told this."""
        if self.event != "changed":
            return True  # a loss or a resync concerns every page
        if self.kind not in wanted:
            return False
        name = wanted[self.kind]
        return name is None or name == self.name


@dataclass(frozen=True)
class WatchTarget:
    """A kind to watch: a helmhive.dev plural (None: core Events) in ``namespace`` (None: every namespace)."""

    kind: str
    plural: str | None
    namespace: str | None
    fallback: str | None = None
    """The namespace to watch instead when every namespace may not be watched."""


Lister = Callable[[str | None, str | None], tuple[list[dict[str, Any]], str]]
Watcher = Callable[[str | None, str | None, str, int], Iterator[tuple[str, dict[str, Any]]]]


class Hub:
    """Watches and subscribers; thread-safe."""

    def __init__(self, *, lister: Lister, watcher: Watcher, targets: list[WatchTarget]) -> None:
        self._lister, self._watcher, self._targets = lister, watcher, targets
        self._subscribers: set[queue.Queue[Notice]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.lost: dict[str, str] = {}

    def start(self) -> None:
        for target in self._targets:
            threading.Thread(target=self._run, args=(target,), name=f"watch-{target.kind}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[queue.Queue[Notice]]:
        inbox: queue.Queue[Notice] = queue.Queue(maxsize=256)
        with self._lock:
            self._subscribers.add(inbox)
        try:
            yield inbox
        finally:
            with self._lock:
                self._subscribers.discard(inbox)

    def _tell(self, notice: Notice) -> None:
        with self._lock:
            inboxes = list(self._subscribers)
        for inbox in inboxes:
            with contextlib.suppress(queue.Full):  # a page that reads nothing is told nothing more
                inbox.put_nowait(notice)

    def _run(self, target: WatchTarget) -> None:
        pause = 0.5
        namespace = target.namespace
        listed = False
        while not self._stop.is_set():
            try:
                try:
                    _, version = self._lister(target.plural, namespace)
                except Forbidden:
                    if namespace is None and target.fallback:
                        namespace = target.fallback
                        continue
                    raise
                if self.lost.pop(target.kind, None) is not None or listed:
                    # After a loss, or after a watch that ended: what changed in between is not known.
                    self._tell(Notice("resync", target.kind))
                listed = True
                pause = 0.5
                for kind, obj in self._watcher(target.plural, namespace, version, WATCH_SECONDS):
                    if self._stop.is_set():
                        return
                    if kind == "ERROR":  # 410 Gone and the like: list again
                        break
                    about = obj.get("involvedObject") if target.plural is None else obj.get("metadata")
                    self._tell(Notice("changed", target.kind, name=str((about or {}).get("name") or "")))
            except Exception as err:  # a KubeError, or whatever else a broken stream raised: retry
                if isinstance(err, KubeError):
                    reason = f"{err.status} {err.message}".strip() if err.status else err.message
                else:
                    reason = f"the watch broke ({type(err).__name__})"
                if self.lost.get(target.kind) != reason:  # told once per cause, not at every retry
                    self.lost[target.kind] = reason
                    self._tell(Notice("lost", target.kind, reason))
                self._stop.wait(pause)
                pause = min(MAX_PAUSE, pause * 2)

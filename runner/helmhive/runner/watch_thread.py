"""A watch running in its own thread: how it is stopped, asked to list again, and joined.

:class:`WatchThread` is the handle :meth:`helmhive.runner.kube.RunnerKube.watch_objects`
returns; the loop that lists and watches lives there, beside the API calls. This module
imports no Kubernetes client: it holds the watch's response only to shut the socket under it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

__all__ = ["WatchThread"]

_INTERRUPT_EVERY_S = 0.1


def _shut(response: Any) -> None:
    """Shut the socket under a watch response, so a read blocked on it returns at once.

    A shutdown, not a close: closing from another thread can wait on the TLS socket's lock,
    which the blocked read holds. Done here rather than left to
    :meth:`kubernetes.watch.Watch.stop`, which does it only in recent versions of the client
    and only once its generator has stored the response.
    """
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class WatchThread:
    """A watch running in its own thread, which :meth:`stop` interrupts and :meth:`join` waits for.

    The thread must end before the process does: a thread still reading from the API server
    over TLS while the interpreter finalizes and OpenSSL cleans up at ``exit()`` can crash the
    process (SIGSEGV or SIGABRT, after the runner logged a clean stop; docs/runners.md,
    "Stopping"). A watch blocks in a read for up to its round, so :meth:`stop` and
    :meth:`relist` shut its socket instead of waiting for the next event.

    An ask can come at any moment, also while the watch request is on its way and there is no
    socket to shut yet: the thread hands each answered request to :meth:`answered`, which shuts
    it at once if a stop or a list was asked for meanwhile. The two meet under one lock, so
    either the ask sees the response or the response sees the ask.
    """

    def __init__(self, *, name: str, stop: threading.Event, join_timeout: float) -> None:
        self.name = name
        self.stop_event = stop
        self.join_timeout = join_timeout
        self._lock = threading.Lock()
        self._stream: Any = None
        self._response: Any = None
        self.thread: threading.Thread | None = None
        self.relist_requested = False

    def attach(self, stream: Any) -> None:
        """The watch (a :class:`kubernetes.watch.Watch`) the thread reads now, or None (called from it)."""
        with self._lock:
            self._stream = stream
            self._response = None  # a new request has no answer yet

    def answered(self, response: Any) -> bool:
        """The watch request was answered with ``response`` (called from the thread, before reading it).

        Returns True, with its socket already shut, when a stop or a list was asked for since
        the thread last looked: the watch then ends at its first read.
        """
        with self._lock:
            self._response = response
            asked = self.relist_requested or self.stop_event.is_set()
        if asked:
            _shut(response)
        return asked

    def _interrupt(self) -> None:
        with self._lock:
            stream, response = self._stream, self._response
        if response is not None:
            _shut(response)
        if stream is not None:
            stream.stop()

    def stop(self) -> None:
        """Ask the thread to end, interrupting a watch it is blocked in (safe from any thread)."""
        self.stop_event.set()
        self._interrupt()

    def relist(self) -> None:
        """Ask for a fresh list at once: the current watch ends and the next round lists (any thread)."""
        with self._lock:
            self.relist_requested = True
        self._interrupt()

    def take_relist(self) -> bool:
        """Whether a list was asked for since the last call (called from the thread)."""
        with self._lock:
            asked, self.relist_requested = self.relist_requested, False
        return asked

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Stop the thread and wait up to ``timeout`` seconds (its ``join_timeout`` by default); True once it has ended.

        The interruption is repeated while waiting: a watch that starts between two calls (its
        ``stream()`` clears an earlier stop) is interrupted by the next one.
        """
        deadline = time.monotonic() + (self.join_timeout if timeout is None else timeout)
        while self.alive():
            self.stop()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            assert self.thread is not None
            self.thread.join(min(_INTERRUPT_EVERY_S, left))
        return True

"""WatchThread: a stop or a list asked at any moment reaches the watch, also on its way to the server.

The response is a stand-in with urllib3's shape (``connection.sock``) over a real socket pair:
what is checked is that the socket under the watch is shut, so a read blocked on it returns.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.watch import Watch

from helmhive.runner.watch_thread import WatchThread


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    theirs.settimeout(5)
    yield ours, theirs
    ours.close()
    theirs.close()


def response(sock: socket.socket) -> Any:
    return SimpleNamespace(connection=SimpleNamespace(sock=sock))


def shut(theirs: socket.socket) -> bool:
    """Whether the other end sees the socket shut (end of stream), not just idle."""
    try:
        return theirs.recv(1) == b""
    except TimeoutError:
        return False


def handle() -> WatchThread:
    return WatchThread(name="watch-test", stop=threading.Event(), join_timeout=5)


def test_a_list_asked_while_the_request_was_on_its_way_shuts_the_response_as_it_comes(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    watch = handle()
    watch.attach(Watch())  # the thread started a request ...
    watch.relist()  # ... and the ask came before its answer: nothing to interrupt yet
    assert watch.answered(response(pair[0])) is True
    assert shut(pair[1])
    assert watch.take_relist() is True and watch.take_relist() is False


def test_a_list_asked_while_the_watch_reads_shuts_its_socket(pair: tuple[socket.socket, socket.socket]) -> None:
    watch = handle()
    watch.attach(Watch())
    assert watch.answered(response(pair[0])) is False  # nothing asked: the watch reads on
    pair[1].settimeout(0.2)
    assert not shut(pair[1])
    pair[1].settimeout(5)
    watch.relist()
    assert shut(pair[1])


def test_a_stop_asked_on_the_way_or_while_reading_shuts_the_response(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    early = handle()
    early.stop()
    assert early.answered(response(pair[0])) is True
    assert shut(pair[1])
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.settimeout(5)
        late = handle()
        assert late.answered(response(ours)) is False
        late.stop()
        assert shut(theirs)


def test_a_new_request_forgets_the_last_response(pair: tuple[socket.socket, socket.socket]) -> None:
    watch = handle()
    watch.answered(response(pair[0]))
    watch.attach(None)  # the request ended; the next one has no answer yet
    watch.relist()
    pair[1].settimeout(0.2)
    assert not shut(pair[1])  # the old response's socket is not touched again

"""What the operator's door tells others about its calls: a hook that whoever counts writes registers with.

Owns: :func:`on_api_write` (register a recorder) and :func:`report_api_write` (what the door
calls after each write, with its error if it raised). The door must not import the metrics:
they read the router, which writes through the door, and that made one import circle of the
door, the metrics, the router and the queue step. :mod:`helmhive.controller.metrics` registers
its counter here when it is imported, so every program that loads the metrics counts writes.

Must not: import anything of the controller; a recorder that raises is the recorder's bug and
propagates (the metrics' recorder only increments a counter).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["WriteRecorder", "on_api_write", "report_api_write"]


class WriteRecorder(Protocol):
    def __call__(self, *, kind: str, verb: str, subresource: str = "", error: BaseException | None = None) -> None:
        """One write through the door; ``error`` is what it raised, if anything."""


_recorders: list[WriteRecorder] = []


def on_api_write(recorder: WriteRecorder) -> None:
    """Call ``recorder`` after every write through the door from now on (once, however often registered)."""
    if recorder not in _recorders:
        _recorders.append(recorder)


def report_api_write(*, kind: str, verb: str, subresource: str = "", error: BaseException | None = None) -> None:
    """Tell every registered recorder of one write; the door calls this, never the metrics directly."""
    for recorder in _recorders:
        recorder(kind=kind, verb=verb, subresource=subresource, error=error)

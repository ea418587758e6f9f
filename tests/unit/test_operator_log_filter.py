"""The operator drops Kopf's per-event success lines, and nothing else, unless --verbose."""

from __future__ import annotations

import logging

import pytest

from helmhive.controller.app import _drop_routine_kopf_lines


def _record(msg: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, msg, None, None)


@pytest.mark.parametrize(
    "msg",
    [
        "Handler 'register.<locals>.job_event' succeeded.",
        "Creation is processed: 1 succeeded; 0 failed.",
        "Updating is processed: 2 succeeded; 0 failed.",
        "Deletion is processed: 1 succeeded; 0 failed.",
        "Resuming is processed: 1 succeeded; 0 failed.",
    ],
)
def test_routine_success_lines_are_dropped(msg: str) -> None:
    assert _drop_routine_kopf_lines(_record(msg)) is False


@pytest.mark.parametrize(
    ("msg", "level"),
    [
        ("profile team/review is at revision 3", logging.INFO),
        ("Handler 'register.<locals>.memory_deleted' failed with an exception and will try again", logging.ERROR),
        ("Handler 'x' succeeded.", logging.WARNING),  # only INFO routine lines go
        ("Updating is processed: 0 succeeded; 1 failed.", logging.WARNING),
        ("runner team/claude-0 is Ready", logging.INFO),
    ],
)
def test_everything_else_is_kept(msg: str, level: int) -> None:
    assert _drop_routine_kopf_lines(_record(msg, level)) is True

"""Structured logs for the runner: one JSON object per line on stderr, secrets redacted.

Each line has ``timestamp``, ``severity``, ``logger`` and ``message``, plus the fields passed as
``extra={"fields": {...}}``. The formatter replaces every registered secret value (the
credential) with ``[REDACTED]`` in the finished line -- a last line of defence; nothing in the
runner logs a credential or a native session ID on purpose.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from helmhive.runner.adapters.decisions import redact

__all__ = ["JsonFormatter", "configure_logging", "fields"]

MAX_LINE = 8000


def fields(**values: Any) -> dict[str, Any]:
    """``log.info("...", extra=fields(runner=name))``."""
    return {"fields": values}


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._secrets: list[str] = []

    def add_secrets(self, values: Iterable[str]) -> None:
        for value in values:
            if value:  # the raw value, and the form it takes inside a JSON string
                self._secrets.extend({value, json.dumps(value, ensure_ascii=False)[1:-1]})

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "timestamp": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "severity": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            document.update({k: v for k, v in extra.items() if k not in document})
        if record.exc_info and record.exc_info[0] is not None:
            document["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        line = json.dumps(document, default=str, ensure_ascii=False)[:MAX_LINE]
        return redact(line, self._secrets)


def configure_logging(*, stream: TextIO | None = None, level: int = logging.INFO) -> JsonFormatter:
    """Send every log record to ``stream`` (stderr) as JSON; return the formatter to register secrets."""
    formatter = JsonFormatter()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("kubernetes", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return formatter

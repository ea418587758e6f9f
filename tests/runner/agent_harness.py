"""Helpers for driving the reference agent in tests: where it is, and its method log."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helmhive.runner.adapters import AcpAdapter

REFERENCE_AGENT = Path(sys.executable).with_name("helmhive-reference-agent")

AdapterFactory = Callable[..., AcpAdapter]


class MethodLog:
    """The reference agent's log of the requests it received (``methods.jsonl``)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "methods.jsonl"

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def methods(self) -> list[str]:
        return [entry["method"] for entry in self.entries()]

    def count(self, method: str) -> int:
        return self.methods().count(method)

    def pids(self) -> list[int]:
        return [entry["pid"] for entry in self.entries() if entry["method"] == "initialize"]

    def config_calls(self) -> list[tuple[str, str]]:
        return [
            (entry["configId"], entry["value"])
            for entry in self.entries()
            if entry["method"] == "session/set_config_option"
        ]

"""The console in a real browser: ``helmhive console`` as a process, and Debian's chromium driven by Playwright.

:func:`console_process` starts ``helmhive console`` with a kubeconfig (the admin's, or a
ServiceAccount's) and hands over the URL it printed; :func:`chromium` launches Debian's
``/usr/bin/chromium`` headless (browsers cannot be downloaded here; ``.ci/run`` installs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, sync_playwright

__all__ = ["chromium", "console_process", "screenshot"]


@contextlib.contextmanager
def console_process(kubeconfig: Path, namespace: str, log: Path, *, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``helmhive console`` on a free port; yield the login URL it printed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "helmhive", "console", "--kubeconfig", str(kubeconfig), "-n", namespace],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            assert "http://127.0.0.1:" in line, f"no URL printed: {line!r}; log {log}"
            yield line[line.index("http://") :].strip()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it)"
    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> None:
    """Keep a screenshot for docs/console.md when ``$HELMHIVE_CONSOLE_SCREENSHOTS`` names a directory."""
    where = os.environ.get("HELMHIVE_CONSOLE_SCREENSHOTS")
    if where:
        page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=True)

"""The console in a real browser: ``helmhive console`` as a process, and Debian's chromium driven by Playwright.

:func:`console_process` starts ``helmhive console`` with a kubeconfig (the admin's, or a
ServiceAccount's) and hands over the URL it printed; :func:`chromium` launches Debian's
``/usr/bin/chromium`` headless (browsers cannot be downloaded here; ``make test`` installs it).
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

__all__ = ["chromium", "console_process", "listening", "screenshot"]


@contextlib.contextmanager
def console_process(
    kubeconfig: Path, namespace: str, log: Path, *, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> Iterator[str]:
    """Run ``helmhive console`` (on a free port unless ``args`` say); yield the login URL it printed.

    Before handing the URL over, checks that the process listens on that one loopback port only.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "helmhive", "console", "--kubeconfig", str(kubeconfig), "-n", namespace, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            assert "http://127.0.0.1:" in line, f"no URL printed: {line!r}; log {log}"
            url = line[line.index("http://") :].strip()
            port = int(url.split(":")[2].split("/")[0])
            assert listening(proc.pid) == [("127.0.0.1", port)]
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def listening(pid: int) -> list[tuple[str, int]]:
    """The (address, port) pairs process ``pid`` listens on over TCP (IPv4 and IPv6), from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                shown = ".".join(str(b) for b in reversed(bytes.fromhex(address))) if table == "tcp" else address
                found.append((shown, int(port, 16)))
    return sorted(found)


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is not installed (apt-get install -y chromium; `make test` does it)"
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

"""Real agents from npm, installed once into a cache outside the repository.

Packages go to ``~/.cache/helmhive/npm/<package with / as +>@<version>`` (``$HELMHIVE_NPM_CACHE``
overrides the root) and are reused while their stamp file exists. If npm is missing or the
install fails, the test FAILS with npm's output: these tests never skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helmhive.devcluster.cachelock import cache_entry_lock

CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.332", "claude")
CLAUDE_AGENT_ACP = ("@zed-industries/claude-agent-acp", "0.23.1", "claude-agent-acp")
GEMINI_CLI = ("@google/gemini-cli", "0.61.0", "gemini")
CODEX = ("@openai/codex", "0.171.0", "codex")
CODEX_ACP = ("@zed-industries/codex-acp", "0.16.0", "codex-acp")
PINNED = (CLAUDE_CODE, CLAUDE_AGENT_ACP, GEMINI_CLI, CODEX, CODEX_ACP)
"""Every agent of images/runner/agents/package.json, at the versions its lock pins."""
INSTALL_TIMEOUT_S = 480


def npm_root() -> Path:
    return Path(os.environ.get("HELMHIVE_NPM_CACHE") or Path.home() / ".cache" / "helmhive" / "npm")


def npm_bin(package: str, version: str, binary: str) -> Path:
    """The installed ``binary`` of ``package@version``, installing it first if the cache lacks it."""
    directory = npm_root() / f"{package.replace('/', '+')}@{version}"
    executable = directory / "node_modules" / ".bin" / binary
    stamp = directory / ".helmhive-installed"
    if stamp.exists() and executable.exists():
        return executable
    with cache_entry_lock(directory, what=f"{package}@{version}"):
        if not (stamp.exists() and executable.exists()):  # else installed by another process meanwhile
            _npm_install(package, version, directory, executable)
    return executable


def _npm_install(package: str, version: str, directory: Path, executable: Path) -> None:
    stamp = directory / ".helmhive-installed"
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(f"npm is not on PATH; it is needed to install {package}@{version}", pytrace=False)
    directory.mkdir(parents=True, exist_ok=True)
    command = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(directory), f"{package}@{version}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"npm install {package}@{version} timed out after {INSTALL_TIMEOUT_S}s: {exc}", pytrace=False)
    if done.returncode != 0 or not executable.exists():
        pytest.fail(
            f"npm install {package}@{version} failed (exit {done.returncode}):\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}",
            pytrace=False,
        )
    stamp.write_text(f"{package}@{version}\n", encoding="utf-8")

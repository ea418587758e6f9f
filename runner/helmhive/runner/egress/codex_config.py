"""Codex's configuration file in an agent's home: where Codex finds the runner's egress proxy.

Codex 0.171 (and codex-acp 0.16, which runs it) reads neither ``OPENAI_BASE_URL`` nor
``OPENAI_API_KEY``: its base URL is the configuration key ``openai_base_url`` in
``$CODEX_HOME/config.toml``, and its key comes from ACP ``authenticate``
(:mod:`helmhive.runner.adapters.acp_auth`) or ``CODEX_API_KEY``. So for an ``openai`` runner
with ``credentialIsolation: Proxy`` the runner sets ``CODEX_HOME`` to ``<agent home>/.codex`` (the
probe's home, or the job's own: never shared between jobs) and writes the proxy's URL there
before the agent starts. Other keys in the file are kept (Codex writes its own there); an earlier
top-level ``openai_base_url`` is replaced, since a session binding's home outlives the job whose
listener it named.

:func:`build_codex_config` is pure; :func:`ensure_codex_config` writes the file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

__all__ = ["CODEX_CONFIG", "build_codex_config", "ensure_codex_config"]

CODEX_CONFIG = "config.toml"
_BASE_URL_KEY = re.compile(r"^\s*openai_base_url\s*=")
_TABLE = re.compile(r"^\s*\[")


def build_codex_config(existing: str, base_url: str) -> str:
    """``existing`` with its top-level ``openai_base_url`` set to ``base_url`` (TOML, pure)."""
    lines = existing.splitlines()
    first_table = next((i for i, line in enumerate(lines) if _TABLE.match(line)), len(lines))
    top = [line for line in lines[:first_table] if not _BASE_URL_KEY.match(line)]
    # A JSON string is a valid TOML basic string for a URL (quotes and backslashes escaped alike).
    ours = f"openai_base_url = {json.dumps(base_url)}  # the Helmhive runner's egress proxy"
    return "\n".join([ours, *top, *lines[first_table:]]) + "\n"


def ensure_codex_config(codex_home: Path, base_url: str) -> Path:
    """Write ``openai_base_url`` into ``codex_home/config.toml`` (created 0700/0600 if missing)."""
    codex_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = codex_home / CODEX_CONFIG
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    temporary = path.with_name(f".{CODEX_CONFIG}.helmhive")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(build_codex_config(existing, base_url))
    temporary.replace(path)
    return path

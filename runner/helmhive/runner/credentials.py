"""The credential a runner holds: its private copy, wiping it, and the revoked-generation marker.

A runner gets its provider login one of two ways:

- a **file** (``HELMHIVE_CREDENTIAL_FILE``, a mounted Secret key, read-only): the runner copies
  it into ``<state>/credential/credential`` (mode 0600); with ``credentialIsolation: Proxy`` (the
  default) only the runner's egress proxy (:mod:`helmhive.runner.egress.proxy`) uses the content, with
  ``InSandbox`` the agent gets it in one environment variable; the mount itself cannot be
  changed by the runner;
- a **directory** (``HELMHIVE_CREDENTIAL_DIR``, a subscription login volume): the agent keeps its
  login state there.

On revocation :meth:`CredentialHolder.wipe` deletes the copy, or everything inside the login
directory (the directory itself is a mount point and stays), and the generation revoked is
remembered in ``<state>/revoked-generation`` so a restarted process with the same state refuses
too. The credential's value never leaves this module except as a :class:`pydantic.SecretStr`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

__all__ = ["CredentialHolder", "CredentialKind", "WipeResult", "read_revoked_generation", "write_revoked_generation"]

MAX_CREDENTIAL_BYTES = 64 * 1024
MARKER = "revoked-generation"


class CredentialKind:
    FILE = "file"
    DIRECTORY = "directory"


@dataclass(frozen=True, slots=True)
class WipeResult:
    kind: str
    removed_entries: int


class CredentialHolder:
    """One runner's credential. ``prepare`` copies a file credential; ``wipe`` removes what it holds."""

    def __init__(self, *, file: Path | None, directory: Path | None, state_dir: Path) -> None:
        if (file is None) == (directory is None):
            raise ValueError("exactly one of file or directory")
        self._file = file
        self._directory = directory
        self._copy = state_dir / "credential" / "credential"
        self._value: SecretStr | None = None
        self.proxy_port: int | None = None
        """The runner's egress proxy (``credentialIsolation: Proxy``), set once it listens: agents get
        its address and a placeholder, never :attr:`value`."""

    @property
    def kind(self) -> str:
        return CredentialKind.FILE if self._file is not None else CredentialKind.DIRECTORY

    @property
    def directory(self) -> Path | None:
        return self._directory

    @property
    def copy_path(self) -> Path | None:
        return self._copy if self._file is not None else None

    def prepare(self) -> None:
        """Copy a file credential into the state dir (0600); a missing or empty source leaves none."""
        if self._file is None:
            return
        try:
            data = self._file.read_bytes()[:MAX_CREDENTIAL_BYTES]
        except OSError:
            data = b""
        self._copy.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        value = data.decode("utf-8", errors="replace").strip()
        self._value = SecretStr(value) if value else None

    @property
    def value(self) -> SecretStr | None:
        """The file credential's content (from the copy), for the agent's environment."""
        return self._value

    def present(self) -> bool:
        """Whether there is anything to log in with: a non-empty copy, or a non-empty login directory."""
        if self._file is not None:
            return self._value is not None and self._copy.exists()
        assert self._directory is not None
        try:
            return self._directory.is_dir() and any(self._directory.iterdir())
        except OSError:
            return False

    def secret_values(self) -> list[str]:
        """Values to redact wherever text leaves the runner."""
        return [self._value.get_secret_value()] if self._value is not None else []

    def wipe(self) -> WipeResult:
        """Delete the copy, or the login directory's contents. Idempotent."""
        removed = 0
        self._value = None
        if self._file is not None:
            with contextlib.suppress(FileNotFoundError):
                self._copy.unlink()
                removed += 1
            return WipeResult(CredentialKind.FILE, removed)
        assert self._directory is not None
        with contextlib.suppress(FileNotFoundError):
            for entry in list(self._directory.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        entry.unlink()
                removed += 1
        return WipeResult(CredentialKind.DIRECTORY, removed)


def read_revoked_generation(state_dir: Path) -> int | None:
    try:
        return int((state_dir / MARKER).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def write_revoked_generation(state_dir: Path, generation: int) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / MARKER).write_text(f"{generation}\n", encoding="utf-8")

"""The runner's job journal: what it started and what it finished, kept on disk until the API has it.

One small JSON file per job in ``<state dir>/journal/<job uid>.json``, written atomically
(a temporary file in the same directory, ``fsync``, ``rename``, ``fsync`` of the directory),
so a runner killed at any moment leaves the previous entry or the new one, never half of one:

* ``running``: written right after the job's ``Running`` status was accepted by the API server;
* ``finished``: written when the job's verdict and bounded result are known, *before* the
  final status is written; removed once the API server accepted that status (or the job is
  gone, or no longer this runner's at this attempt).

An entry holds the job's name, uid, ``status.attempts`` when it started, and for ``finished``
the verdict (succeeded, reason, message) and the bounded ``status.result`` exactly as the final
status carries it -- nothing the job's status would not show anyway. The native session id is
not in it (the runner's sessions Secret keeps that, :mod:`helmhive.runner.sessions.bindings`), and
neither is any credential.

:func:`decide_recovery` (pure) says what a journal entry means for a job this process did not
run (the runner restarted, or its own final write gave up): write the kept result, report the
run ``Interrupted`` (it was running and its turn is gone; the runner does not resume turns yet),
or, without an entry, ``RunnerLost`` as before. The write is always conditional on the job
still being assigned to this runner at the same attempt and not finished
(:mod:`helmhive.runner.program.cluster_jobs` does it).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helmhive.api.reasons import Reason
from helmhive.runner.jobs.status import JobEnding

__all__ = ["JobJournal", "JournalEntry", "JournalPhase", "Recovery", "decide_recovery"]

_MAX_ENTRY_BYTES = 256 * 1024


class JournalPhase(enum.StrEnum):
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, kw_only=True)
class JournalEntry:
    uid: str
    name: str
    attempt: int
    phase: JournalPhase
    verdict: JobEnding | None = None
    result: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"uid": self.uid, "name": self.name, "attempt": self.attempt, "phase": self.phase.value}
        if self.verdict is not None:
            out["verdict"] = {
                "succeeded": self.verdict.succeeded,
                "reason": self.verdict.reason,
                "message": self.verdict.message,
            }
        if self.result is not None:
            out["result"] = dict(self.result)
        return out

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> JournalEntry:
        """Parse an entry; ValueError if it is not one (a damaged file is dropped, never trusted)."""
        try:
            phase = JournalPhase(raw["phase"])
            verdict_raw = raw.get("verdict")
            verdict = (
                JobEnding(
                    succeeded=bool(verdict_raw["succeeded"]),
                    reason=str(verdict_raw["reason"]),
                    message=str(verdict_raw["message"]),
                )
                if isinstance(verdict_raw, Mapping)
                else None
            )
            result = raw.get("result")
            entry = cls(
                uid=str(raw["uid"]),
                name=str(raw["name"]),
                attempt=int(raw["attempt"]),
                phase=phase,
                verdict=verdict,
                result=dict(result) if isinstance(result, Mapping) else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a journal entry: {exc}") from exc
        if not entry.uid or not entry.name or (phase is JournalPhase.FINISHED and entry.verdict is None):
            raise ValueError("not a journal entry: uid, name or verdict missing")
        return entry


class JobJournal:
    """The journal directory of one runner (see the module docstring). Plain blocking file I/O: entries are small."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "journal"

    def _path(self, uid: str) -> Path:
        safe = "".join(c for c in uid if c.isalnum() or c == "-")[:64]
        if not safe:
            raise ValueError("a job uid is needed")
        return self.directory / f"{safe}.json"

    def write(self, entry: JournalEntry) -> None:
        """Replace the job's entry atomically and durably."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = json.dumps(entry.to_wire(), ensure_ascii=False, sort_keys=True).encode("utf-8")
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self._path(entry.uid))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._sync_directory()

    def read(self, uid: str) -> JournalEntry | None:
        """The job's entry, or None if there is none (or it is damaged: it is then removed)."""
        path = self._path(uid)
        try:
            if path.stat().st_size > _MAX_ENTRY_BYTES:
                raise ValueError("too large")
            return JournalEntry.from_wire(json.loads(path.read_bytes()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            self.remove(uid)
            return None

    def remove(self, uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(uid).unlink()
            self._sync_directory()

    def entries(self) -> list[JournalEntry]:
        """Every readable entry (damaged ones are removed); leftover temporary files are removed too."""
        if not self.directory.is_dir():
            return []
        found: list[JournalEntry] = []
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith(".tmp-"):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if path.suffix == ".json":
                entry = self.read(path.stem)
                if entry is not None:
                    found.append(entry)
        return found

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True, kw_only=True)
class Recovery:
    """What to write for a job this process did not finish: the verdict and result, and why."""

    verdict: JobEnding
    result: Mapping[str, Any]
    replayed: bool
    """True: the journal's kept result (the job did finish); False: the run was lost."""


def decide_recovery(entry: JournalEntry | None) -> Recovery:
    """A job Running on this runner but not running in this process: what its journal entry says to write."""
    if entry is not None and entry.phase is JournalPhase.FINISHED and entry.verdict is not None:
        return Recovery(verdict=entry.verdict, result=dict(entry.result or {}), replayed=True)
    if entry is not None:
        message = (
            "the runner restarted while the job was running here; its turn was interrupted "
            "(the runner does not resume turns)"
        )
        return Recovery(
            verdict=JobEnding(succeeded=False, reason=Reason.INTERRUPTED, message=message), result={}, replayed=False
        )
    message = "the runner restarted while the job was running here; its turn was lost"
    return Recovery(
        verdict=JobEnding(succeeded=False, reason=Reason.RUNNER_LOST, message=message), result={}, replayed=False
    )

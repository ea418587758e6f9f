"""The runner's side of session continuity: its sessions Secret and its SessionBindings' status.

Native provider session ids live in one place only: the Secret ``helmhive-sessions-<runner>``
(created empty by the operator with the runner's pod; see ``docs/execution.md``), one key per
binding, named after the binding. This module reads and writes that Secret and the status of
the bindings the runner uses (``stored``, ``turns``, ``lastUsedAt``, ``lastJob``,
``secretName``, ``secretKey``); it creates a SessionBinding the first time a key is used.

Ids travel as :class:`pydantic.SecretStr` and are never logged, put in an Event, or written
anywhere but the Secret.

It also keeps each binding's HOME on disk (``<state>/homes/<binding>/home``, the HOME of every job
of the binding, where an agent keeps its settings and session files) to the binding's life:

* :func:`ensure_session_home`, before each job of a binding, empties the HOME when the binding is
  not the one it was made for: it was **reset** since (``status.resets`` moved) or deleted and
  created again (another ``metadata.uid``). ``<state>/homes/<binding>/binding.json``, beside the
  HOME and never granted to a job, records which binding (uid, resets) the HOME belongs to.
* :func:`sweep_session_homes`, once when the runner starts and before it runs a job, removes the
  homes of bindings that no longer exist (deleted while the runner was down or running).

So a reset binding's HOME is gone when its next job starts, a deleted one's at the next start of
the runner at the latest; the decision is :func:`decide_home_stale` (pure).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from helmhive.api.kinds import API_VERSION
from helmhive.api.session import SessionBindingSpec
from helmhive.policy.sessions.continuity import sessions_secret_name
from helmhive.policy.timestamps import format_timestamp
from helmhive.runner.kube import Conflict, Forbidden, KubeError, NotFound, RunnerKube
from helmhive.runner.sandbox.workdir import homes_dir

__all__ = [
    "BINDINGS",
    "HOME_OWNER_FILE",
    "SessionStore",
    "binding_identity",
    "decide_home_stale",
    "ensure_session_home",
    "sweep_session_homes",
]

BINDINGS = "sessionbindings"
HOME_OWNER_FILE = "binding.json"
"""Beside a binding's ``home/``: ``{"uid": ..., "resets": n}`` of the binding it was made for."""
_RETRIES = 5


def binding_identity(binding: Mapping[str, Any]) -> dict[str, Any]:
    """What a HOME is kept for: the binding object's uid and its reset count."""
    meta = binding.get("metadata") or {}
    status = binding.get("status") or {}
    return {"uid": str(meta.get("uid") or ""), "resets": int(status.get("resets") or 0)}


def decide_home_stale(*, owner: Mapping[str, Any] | None, exists: bool, current: Mapping[str, Any]) -> bool:
    """Whether a binding's HOME must be emptied before the binding's next job (pure).

    Stale: it exists but no record says whose it is, or it was made for another object of that
    name (deleted and created again) or before a reset."""
    if not exists:
        return False
    if owner is None:
        return True
    return owner.get("uid") != current.get("uid") or owner.get("resets") != current.get("resets")


def _read_owner(directory: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads((directory / HOME_OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _remove(directory: Path) -> None:
    for current, dirs, _files in os.walk(directory):  # an agent may have left read-only directories
        for name in dirs:
            path = Path(current, name)
            if not path.is_symlink():
                path.chmod(0o700)
    shutil.rmtree(directory, ignore_errors=True)


def ensure_session_home(*, state_dir: Path, binding: str, identity: Mapping[str, Any]) -> bool:
    """Make ``<state>/homes/<binding>/home`` the HOME of the binding ``identity`` describes.

    Returns True if an earlier HOME was removed (the binding was reset or re-created since)."""
    directory = homes_dir(state_dir) / binding
    stale = decide_home_stale(owner=_read_owner(directory), exists=directory.exists(), current=identity)
    if stale:
        _remove(directory)
    (directory / "home").mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    owner = directory / HOME_OWNER_FILE
    if _read_owner(directory) != dict(identity):
        partial = directory / f".{HOME_OWNER_FILE}.tmp"
        partial.write_text(json.dumps(dict(identity), sort_keys=True), encoding="utf-8")
        partial.replace(owner)
    return stale


async def sweep_session_homes(*, store: SessionStore, state_dir: Path) -> list[str]:
    """Remove the homes of bindings that no longer exist; return their names.

    A binding that cannot be read (an API error other than NotFound) keeps its HOME."""
    root = homes_dir(state_dir)
    names = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    removed = []
    for name in names:
        try:
            found = await store.existing(name)
        except KubeError:
            continue
        if found is None:
            await asyncio.to_thread(_remove, root / name)
            removed.append(name)
    return removed


class SessionStore:
    """Reads and writes the native session ids of one runner, and its bindings' status."""

    def __init__(self, *, kube: RunnerKube, runner: str) -> None:
        self.kube = kube
        self.runner = runner
        self.secret_name = sessions_secret_name(runner)

    async def existing(self, name: str) -> dict[str, Any] | None:
        """Binding ``name``, or None if there is none."""
        try:
            return await self.kube.get_object(BINDINGS, name)
        except NotFound:
            return None

    async def ensure_binding(self, name: str, spec: SessionBindingSpec) -> dict[str, Any]:
        """Binding ``name`` with key ``spec``: read it, or create it (this runner owns that write)."""
        found = await self.existing(name)
        if found is not None:
            return found
        body = {
            "apiVersion": API_VERSION,
            "kind": "SessionBinding",
            "metadata": {
                "name": name,
                "labels": {"helmhive.dev/runner": self.runner[:63], "app.kubernetes.io/managed-by": "helmhive"},
            },
            "spec": spec.to_wire(),
        }
        try:
            return await self.kube.create_object(BINDINGS, body)
        except Conflict:
            return await self.kube.get_object(BINDINGS, name)

    async def load(self, binding: str) -> SecretStr | None:
        """The stored native session id of ``binding``; None if none is stored (or no Secret exists)."""
        try:
            data = await self.kube.get_secret_data(self.secret_name)
        except NotFound:
            return None
        raw = data.get(binding)
        if not raw:
            return None
        try:
            return SecretStr(base64.b64decode(raw, validate=True).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError):
            return None

    async def store(
        self,
        *,
        binding: str,
        session_id: SecretStr,
        turns: int,
        new_chain: bool,
        job: str,
        now: dt.datetime,
        compaction: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Keep ``session_id`` for ``binding`` and count ``turns`` more (from 0 for a new chain).

        With ``compaction`` (``status.lastCompaction`` in wire form), also count one compaction:
        the session stored replaces the compacted one (the same id after a compact command, a
        fresh one after an archive, which drops the old id from the Secret by overwriting it).

        Returns None when stored, else why not (the Secret is missing or not writable): the
        job's answer stands, but the next job on the binding starts a new chain.
        """
        encoded = base64.b64encode(session_id.get_secret_value().encode("utf-8")).decode("ascii")
        try:
            await self.kube.merge_patch_secret(self.secret_name, {"data": {binding: encoded}})
        except NotFound:
            return f"the sessions Secret {self.secret_name} does not exist (the operator creates it with the pod)"
        except Forbidden as exc:
            return f"writing the sessions Secret {self.secret_name} was refused: {exc.message[:200]}"

        def status(current: Mapping[str, Any]) -> dict[str, Any]:
            before = 0 if new_chain else int(current.get("turns") or 0)
            return {
                "stored": True,
                "turns": before + turns,
                "lastUsedAt": format_timestamp(now),
                "lastJob": job,
                "secretName": self.secret_name,
                "secretKey": binding,
            } | (
                {"compactions": int(current.get("compactions") or 0) + 1, "lastCompaction": dict(compaction)}
                if compaction is not None
                else {}
            )

        try:
            await self._patch_status(binding, status)
        except KubeError as exc:
            return f"the session was stored, but binding {binding}'s status was not updated: {exc.message[:600]}"
        return None

    async def _patch_status(self, name: str, build: Any) -> None:
        for _ in range(_RETRIES):
            obj = await self.kube.get_object(BINDINGS, name)
            patch = {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "status": build(obj.get("status") or {}),
            }
            try:
                await self.kube.merge_patch_status(BINDINGS, name, patch)
                return
            except Conflict:
                continue
        raise KubeError(409, f"session binding {name} kept changing; its status was not updated")

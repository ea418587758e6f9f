"""The runner's side of session continuity: its sessions Secret and its SessionBindings' status.

Native provider session ids live in one place only: the Secret ``helmhive-sessions-<runner>``
(created empty by the operator with the runner's pod; see ``docs/execution.md``), one key per
binding, named after the binding. This module reads and writes that Secret and the status of
the bindings the runner uses (``stored``, ``turns``, ``lastUsedAt``, ``lastJob``,
``secretName``, ``secretKey``); it creates a SessionBinding the first time a key is used.

Ids travel as :class:`pydantic.SecretStr` and are never logged, put in an Event, or written
anywhere but the Secret.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

from helmhive.api.kinds import API_VERSION
from helmhive.api.session import SessionBindingSpec
from helmhive.policy.sessions import sessions_secret_name
from helmhive.runner.jobstatus import iso
from helmhive.runner.kube import Conflict, Forbidden, KubeError, NotFound, RunnerKube

__all__ = ["BINDINGS", "SessionStore"]

BINDINGS = "sessionbindings"
_RETRIES = 5


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
    ) -> str | None:
        """Keep ``session_id`` for ``binding`` and count ``turns`` more (from 0 for a new chain).

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
                "lastUsedAt": iso(now),
                "lastJob": job,
                "secretName": self.secret_name,
                "secretKey": binding,
            }

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

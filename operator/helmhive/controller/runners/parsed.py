"""A Runner as the pool loop derives it: :class:`ParsedRunner`, parsed once per watch event. No I/O.

Kept apart from :mod:`helmhive.controller.runners.derived` (which writes status) so that the
qualification steps (:mod:`helmhive.controller.runners.qualification`) can name it without
importing the module that calls them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from helmhive.api.kinds import API_VERSION
from helmhive.api.runner import RunnerSpec, RunnerStatus

__all__ = ["ParsedRunner", "parse_runner_body"]


@dataclass(frozen=True, kw_only=True)
class ParsedRunner:
    """A Runner as the derivation needs it, parsed once when its watch event arrives."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    generation: int | None
    spec: RunnerSpec
    status: RunnerStatus
    owner_uids: frozenset[str]
    control_state_set_by: str | None

    @property
    def ref(self) -> dict[str, Any]:
        """Enough of the object for audit records and Events."""
        return {
            "apiVersion": API_VERSION,
            "kind": "Runner",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }


def _control_state_manager(managed_fields: Iterable[Mapping[str, Any]]) -> str | None:
    """The field manager that last set ``spec.controlState`` (the administrator's tool), if any."""
    best: tuple[str, str] | None = None
    for entry in managed_fields:
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:controlState" in spec:
            candidate = (str(entry.get("time") or ""), str(entry.get("manager") or "unknown"))
            best = candidate if best is None or candidate[0] >= best[0] else best
    return best[1] if best else None


def parse_runner_body(body: Mapping[str, Any]) -> ParsedRunner | None:
    """Parse a Runner body; None if its spec is unusable. An unparsable report counts as no report."""
    meta = body.get("metadata") or {}
    try:
        spec = RunnerSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None
    raw_status = dict(body.get("status") or {})
    try:
        status = RunnerStatus.model_validate(raw_status)
    except ValidationError:
        raw_status.pop("report", None)
        status = RunnerStatus.model_validate(raw_status)
    return ParsedRunner(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        generation=meta.get("generation"),
        spec=spec,
        status=status,
        owner_uids=frozenset(str(o.get("uid")) for o in meta.get("ownerReferences") or ()),
        control_state_set_by=_control_state_manager(meta.get("managedFields") or ()),
    )

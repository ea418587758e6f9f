"""What a step writes: :class:`Step`, :class:`Writer`, the writer tables and :class:`StatusPatch`. Pure.

:data:`STATUS_WRITERS` is, as data, the table of status fields and their writers in the
docstring of :mod:`helmhive.policy.agentjob.life` (which re-exports this module; a unit test keeps
the two equal). :func:`written_fields` says which of those fields a patch changes;
:func:`apply_merge_patch` is what the API server does with the patch, and
:meth:`StatusPatch.replacement` the whole status it makes of it, for a conditional PUT.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.kinds import API_VERSION
from helmhive.policy.agentjob.state import AgentJob
from helmhive.policy.kstatus import with_kstatus

__all__ = [
    "DERIVED_FIELDS",
    "STATUS_WRITERS",
    "STEP_WRITERS",
    "StatusPatch",
    "Step",
    "Writer",
    "apply_merge_patch",
    "build_step_patch",
    "written_fields",
]


class Writer(enum.StrEnum):
    """Who writes a status field: the operator or the job's runner."""

    OPERATOR = "operator"
    RUNNER = "runner"


class Step(enum.StrEnum):
    """A step of a job's life; each writes one :class:`StatusPatch`."""

    BIND = "bind"
    WAIT = "wait"
    FAIL = "fail"
    ROUTE = "route"
    START = "start"
    FINISH = "finish"
    LOST = "lost"
    REQUEUE = "requeue"
    CLOSE = "close"


STEP_WRITERS: Mapping[Step, Writer] = {
    Step.BIND: Writer.OPERATOR,
    Step.WAIT: Writer.OPERATOR,
    Step.FAIL: Writer.OPERATOR,
    Step.ROUTE: Writer.OPERATOR,
    Step.START: Writer.RUNNER,
    Step.FINISH: Writer.RUNNER,
    Step.LOST: Writer.OPERATOR,
    Step.REQUEUE: Writer.OPERATOR,
    Step.CLOSE: Writer.OPERATOR,
}

_O, _R = Writer.OPERATOR, Writer.RUNNER
STATUS_WRITERS: Mapping[str, Mapping[Writer, frozenset[Step]]] = {
    "profile": {_O: frozenset({Step.BIND, Step.ROUTE})},
    "routing": {_O: frozenset({Step.ROUTE, Step.REQUEUE})},
    "assignment": {_O: frozenset({Step.ROUTE, Step.REQUEUE})},
    "attempts": {_O: frozenset({Step.REQUEUE})},
    "session": {_R: frozenset({Step.START}), _O: frozenset({Step.REQUEUE})},
    "result": {_R: frozenset({Step.START, Step.FINISH}), _O: frozenset({Step.LOST, Step.REQUEUE})},
    "conditions[Routed]": {_O: frozenset({Step.BIND, Step.WAIT, Step.FAIL, Step.ROUTE, Step.REQUEUE})},
    "conditions[Ready]": {
        _O: frozenset({Step.BIND, Step.WAIT, Step.FAIL, Step.ROUTE, Step.LOST, Step.REQUEUE, Step.CLOSE}),
        _R: frozenset({Step.START, Step.FINISH}),
    },
    "conditions[Running]": {_R: frozenset({Step.START, Step.FINISH}), _O: frozenset({Step.LOST, Step.REQUEUE})},
    "conditions[Succeeded]": {_R: frozenset({Step.FINISH}), _O: frozenset({Step.LOST, Step.REQUEUE, Step.CLOSE})},
}
"""Every status field a step writes, by writer, with its steps (:mod:`helmhive.policy.agentjob.life`'s table)."""

DERIVED_FIELDS = frozenset({"observedGeneration", "conditions[Reconciling]", "conditions[Stalled]"})
"""Fields no row of the table lists: :func:`build_step_patch` derives them in every step's write."""


@dataclass(frozen=True, kw_only=True)
class StatusPatch:
    """A JSON merge patch of ``status`` written by one step (``None`` deletes a field)."""

    step: Step
    status: dict[str, Any]

    @property
    def writer(self) -> Writer:
        return STEP_WRITERS[self.step]

    def conditional(self, resource_version: str) -> dict[str, Any]:
        """The body to merge-patch onto the status subresource, conditional on ``resource_version``."""
        return {"metadata": {"resourceVersion": resource_version}, "status": self.status}

    def replacement(self, job: AgentJob) -> dict[str, Any]:
        """The body to PUT on ``job``'s status subresource: its status as read with this patch merged.

        Conditional on ``job.resource_version``, so the status merged into is exactly the stored
        one, and the result is what the API server would make of the merge patch. The API server
        keeps everything but ``status`` from the stored object (labels, finalizers, ``spec`` and
        their ``managedFields``), so the metadata holds only the name and the precondition. For
        a large status a PUT costs the API server less than a merge patch: it does not encode the
        stored object and merge into it (docs/performance.md).
        """
        return {
            "apiVersion": API_VERSION,
            "kind": "AgentJob",
            "metadata": {"name": job.name, "namespace": job.namespace, "resourceVersion": job.resource_version},
            "status": apply_merge_patch(job.raw_status, self.status),
        }


def build_step_patch(step: Step, job: AgentJob, status: Mapping[str, Any], *, now: dt.datetime) -> StatusPatch:
    """The patch of ``step`` writing ``status``, with the ``Reconciling``/``Stalled`` conditions and
    ``observedGeneration`` the job will have once it is written (:mod:`helmhive.policy.kstatus`).

    Only what differs from the stored status is added, so a step that leaves the job's progress
    where it was writes no more than before.
    """
    merged = apply_merge_patch(job.raw_status, status)
    derived = with_kstatus("AgentJob", merged, generation=job.generation, now=now)
    out = dict(status)
    for key in ("conditions", "observedGeneration"):
        if derived.get(key) != merged.get(key):
            out[key] = derived.get(key)
    return StatusPatch(step=step, status=out)


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the API server does with ``application/merge-patch+json``)."""
    if not isinstance(patch, Mapping):
        return patch
    merged: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = apply_merge_patch(merged.get(key), value)
    return merged


def written_fields(job: AgentJob, patch: StatusPatch) -> set[str]:
    """The fields of :data:`STATUS_WRITERS` that ``patch`` changes on ``job`` (a condition by its type)."""
    fields = {k for k in patch.status if k != "conditions"}
    if "conditions" in patch.status:
        before = {c.get("type"): c for c in job.conditions}
        after = {c.get("type"): c for c in patch.status["conditions"] or ()}
        fields |= {f"conditions[{t}]" for t in before.keys() | after.keys() if before.get(t) != after.get(t)}
    return fields

"""What the job-pod decisions read of a Pod: a typed, bounded view parsed from the pod as the API serves it. Pure.

Owns :class:`PodView` (:meth:`PodView.parse` takes the pod's dict, camelCase, and ignores
every field it does not name) and the questions asked of it (warm, claimed, which container is
where). Names keep the API server's own bounds; free text (messages) is clipped, never refused, so
a pod the API server stored always parses. Nothing here decides anything: that is
:mod:`.warmset` and :mod:`.outcome`.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel

from helmhive.api.jobpod import LABEL_JOB, LABEL_POOL, LABEL_RUNNER, LABEL_WARM

__all__ = [
    "ContainerState",
    "ContainerStatusView",
    "ContainerTerminated",
    "ContainerWaiting",
    "OwnerView",
    "PodConditionView",
    "PodMeta",
    "PodStatusView",
    "PodView",
]

MESSAGE_LIMIT = 1024
LIST_LIMIT = 32


def _clip(limit: int) -> BeforeValidator:
    return BeforeValidator(lambda v: v[:limit] if isinstance(v, str | list | tuple) else v)


Text = Annotated[str, _clip(MESSAGE_LIMIT), StringConstraints(max_length=MESSAGE_LIMIT)]
"""A message: clipped to 1024 characters."""
Word = Annotated[str, _clip(128), StringConstraints(max_length=128)]
"""A reason, a phase, a condition type or status (CamelCase words): clipped to 128 characters."""
ObjectName = Annotated[str, StringConstraints(max_length=253)]
LabelText = Annotated[str, StringConstraints(max_length=317)]


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class ContainerWaiting(_View):
    reason: Word = ""
    message: Text = ""


class ContainerTerminated(_View):
    reason: Word = ""
    message: Text = ""
    exit_code: int = 0


class ContainerState(_View):
    waiting: ContainerWaiting | None = None
    terminated: ContainerTerminated | None = None


class ContainerStatusView(_View):
    """One entry of ``status.containerStatuses``: the container's current state."""

    name: ObjectName
    state: ContainerState = ContainerState()


class PodConditionView(_View):
    type: Word
    status: Word = ""
    reason: Word = ""
    message: Text = ""


class OwnerView(_View):
    api_version: Annotated[str, StringConstraints(max_length=317)] = ""
    kind: Word = ""
    name: ObjectName = ""
    uid: Word = ""
    controller: bool = False


class PodMeta(_View):
    name: ObjectName = ""
    namespace: ObjectName = ""
    uid: Word = ""
    resource_version: Word = ""
    labels: dict[LabelText, LabelText] = {}
    owner_references: Annotated[tuple[OwnerView, ...], _clip(LIST_LIMIT)] = ()
    deletion_timestamp: dt.datetime | None = None


class PodStatusView(_View):
    phase: Word = ""
    reason: Word = ""
    message: Text = ""
    start_time: dt.datetime | None = None
    conditions: Annotated[tuple[PodConditionView, ...], _clip(LIST_LIMIT)] = ()
    container_statuses: Annotated[tuple[ContainerStatusView, ...], _clip(LIST_LIMIT)] = ()


class PodView(_View):
    """A job pod as the decisions read it: its identity, Helmhive's labels, its owner and its status."""

    metadata: PodMeta = PodMeta()
    status: PodStatusView = PodStatusView()

    @classmethod
    def parse(cls, pod: Any) -> PodView:
        """The view of ``pod`` (a dict as the API serves it). Raises pydantic's ValidationError for a non-pod."""
        return cls.model_validate(pod)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def pool(self) -> str | None:
        return self.metadata.labels.get(LABEL_POOL)

    @property
    def job(self) -> str | None:
        """The ``helmhive.dev/job`` label: the AgentJob's name (at most 63 characters of it)."""
        return self.metadata.labels.get(LABEL_JOB)

    @property
    def runner(self) -> str | None:
        return self.metadata.labels.get(LABEL_RUNNER)

    @property
    def controller(self) -> OwnerView | None:
        return next((o for o in self.metadata.owner_references if o.controller), None)

    @property
    def claimed(self) -> bool:
        """Whether the pod belongs to a job: a job label, or an AgentJob controls it."""
        owner = self.controller
        return self.job is not None or (owner is not None and owner.kind == "AgentJob")

    @property
    def warm(self) -> bool:
        """Whether the pod is one of the pool's warm set: labelled warm and claimed by no job."""
        return self.metadata.labels.get(LABEL_WARM) == "true" and not self.claimed

    @property
    def deleting(self) -> bool:
        return self.metadata.deletion_timestamp is not None

    @property
    def ended(self) -> bool:
        """Whether the pod's containers have all ended for good (``restartPolicy: Never``)."""
        return self.status.phase in ("Succeeded", "Failed")

    def container(self, name: str) -> ContainerStatusView | None:
        return next((c for c in self.status.container_statuses if c.name == name), None)

    def condition(self, kind: str) -> PodConditionView | None:
        return next((c for c in self.status.conditions if c.type == kind), None)

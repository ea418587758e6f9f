"""Runner qualification: the probes a RunnerPool names, and what the operator records of each runner's rounds.

A pool's ``spec.qualification`` lists probe envelopes (``connection-test``,
``implementation-probe``, ``review-probe``). The operator runs them, one at a time and in order,
as AgentJobs routed to the one runner they qualify: on every new registration, after every
credential rotation, and every ``everySeconds``. The Runner's ``status.qualification`` is the
operator's record of the current round (``docs/runners.md#qualification``); the decisions are
:mod:`helmhive.policy.runners.qualification`.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated

from pydantic import Field, model_validator

from helmhive.api.common import ApiModel, JobKind, Name

__all__ = [
    "QUALIFICATION_LABEL",
    "QUALIFICATION_POOL_LABEL",
    "QUALIFICATION_PROBE_LABEL",
    "QUALIFICATION_ROUND_ANNOTATION",
    "QUALIFICATION_RULES",
    "ProbeKind",
    "ProbeOutcome",
    "ProbeRecord",
    "QualificationSpec",
    "QualificationState",
    "RunnerQualification",
]

QUALIFICATION_LABEL = "helmhive.dev/qualification"
"""On a qualification AgentJob: the name of the runner it qualifies (only the operator may set it)."""
QUALIFICATION_POOL_LABEL = "helmhive.dev/qualification-pool"
"""On a qualification AgentJob and the pool's qualification Workspace and Profiles: the pool's name."""
QUALIFICATION_PROBE_LABEL = "helmhive.dev/qualification-probe"
"""On a qualification AgentJob: its probe (the envelope's job kind)."""
QUALIFICATION_ROUND_ANNOTATION = "helmhive.dev/qualification-round"
"""On a qualification AgentJob: the round it belongs to."""


class ProbeKind(enum.StrEnum):
    """The envelopes a pool may qualify its runners with: the probe class."""

    CONNECTION_TEST = JobKind.CONNECTION_TEST.value
    IMPLEMENTATION_PROBE = JobKind.IMPLEMENTATION_PROBE.value
    REVIEW_PROBE = JobKind.REVIEW_PROBE.value


class QualificationSpec(ApiModel):
    """Which probes qualify the pool's runners, and how often."""

    probes: Annotated[
        list[ProbeKind],
        Field(
            min_length=1,
            max_length=3,
            json_schema_extra={"x-kubernetes-list-type": "set"},
            description=(
                "The probes each runner must pass, run one at a time in this order: on every new registration, "
                "after every credential rotation, and every everySeconds. A runner is not schedulable until its "
                "first round passes (QualificationPending), nor after a round failed (QualificationFailed)."
            ),
        ),
    ]
    every_seconds: Annotated[
        int | None,
        Field(
            ge=300,
            le=604800,
            description=(
                "Run the probes again this long after the last round ended. Unset: only on registration and "
                "credential rotation. A qualified runner stays schedulable while its next round waits for a free "
                "slot; a probe never takes a slot a user job is waiting for."
            ),
        ),
    ] = None
    stale_after_seconds: Annotated[
        int | None,
        Field(
            ge=300,
            le=1209600,
            description=(
                "How old the last passed round may be before the runner is unschedulable (QualificationStale). "
                "Default: twice everySeconds; never stale without everySeconds."
            ),
        ),
    ] = None
    timeout_seconds: Annotated[
        int, Field(ge=30, le=3600, description="Each probe job's timeout (its spec.timeoutSeconds). Default 300.")
    ] = 300

    @model_validator(mode="after")
    def _stale_bound(self) -> QualificationSpec:
        """The CEL rule of :data:`QUALIFICATION_RULES`, for ``helmhive validate`` and the operator."""
        stale, every = self.stale_after_seconds, self.every_seconds
        if stale is not None and (every is None or stale < every):
            raise ValueError(_STALE_MESSAGE)
        return self

    def stale_after(self) -> dt.timedelta | None:
        """How old a passed round may be; None: never stale."""
        if self.stale_after_seconds is not None:
            return dt.timedelta(seconds=self.stale_after_seconds)
        if self.every_seconds is not None:
            return dt.timedelta(seconds=2 * self.every_seconds)
        return None


_STALE_MESSAGE = "staleAfterSeconds needs everySeconds, and may not be less than it"
QUALIFICATION_RULES = [
    {
        "rule": (
            "!has(self.staleAfterSeconds) || (has(self.everySeconds) && self.staleAfterSeconds >= self.everySeconds)"
        ),
        "message": _STALE_MESSAGE,
        "fieldPath": ".staleAfterSeconds",
        "reason": "FieldValueInvalid",
    }
]
"""CEL rules of ``spec.qualification``, checked the same way by the model's validator."""


class QualificationState(enum.StrEnum):
    QUALIFYING = "Qualifying"
    """A round is under way (or waits to start)."""
    QUALIFIED = "Qualified"
    """The last round passed."""
    FAILED = "Failed"
    """The last round failed; it is tried again after a backoff, or at a new registration or credential."""


class ProbeOutcome(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ProbeRecord(ApiModel):
    """One probe of the current round."""

    kind: ProbeKind
    job: Name | None = None
    outcome: ProbeOutcome = ProbeOutcome.PENDING
    reason: Annotated[str, Field(max_length=256)] = ""
    """The job's fixed reason (its Succeeded condition's, or its routing's while it waits)."""
    finished_at: dt.datetime | None = None


class RunnerQualification(ApiModel):
    """The operator's record of one runner's qualification (``Runner.status.qualification``)."""

    state: QualificationState
    round: Annotated[int, Field(ge=1)]
    """Counts the rounds of this Runner object; a probe job's name carries it."""
    registered_at: dt.datetime | None = None
    """The registration the round qualifies (``report.registeredAt``); a new one starts a round."""
    credential_generation: Annotated[int, Field(ge=0)] = 0
    """The pool's credential generation the round qualifies; a rotation starts a round."""
    started_at: dt.datetime
    finished_at: dt.datetime | None = None
    qualified_at: dt.datetime | None = None
    """When the last passed round for this registration and credential ended."""
    failures: Annotated[int, Field(ge=0, le=1000)] = 0
    """Failed rounds in a row (the backoff before the next grows with it)."""
    last_failure: Annotated[str, Field(max_length=512)] = ""
    """Why the last failed round failed; kept while later rounds for the same registration and credential retry."""
    probes: Annotated[list[ProbeRecord], Field(max_length=3)] = []

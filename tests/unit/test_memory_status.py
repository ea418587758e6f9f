"""A memory record's ``Active`` condition with its Workspace: waiting for it, scope, expiry, next transition."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from helmhive.api.memory import MemoryRecordSpec, WorkspaceSpec
from helmhive.api.reasons import Reason
from helmhive.policy.memory.selection import MemoryActivity
from helmhive.policy.memory.status import decide_memory_status

CREATED = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
WAIT = dt.timedelta(minutes=10)
PAYMENTS = WorkspaceSpec.model_validate(
    {"repository": {"url": "https://git.example.com/payments.git"}, "services": [{"name": "api"}, {"name": "ledger"}]}
)


def record(*, service: str | None = None, expires_in: dt.timedelta | None = None) -> MemoryRecordSpec:
    wire: dict[str, Any] = {
        "workspace": "payments",
        "scope": {"type": "service", "service": service} if service else {"type": "workspace"},
        "kind": "constraint",
        "text": "Amounts are integer cents.",
        "source": {"type": "adr", "url": "https://example.com/adr/4"},
        "sensitivity": "internal",
    }
    if expires_in is not None:
        wire["expiresAt"] = (CREATED + expires_in).strftime("%Y-%m-%dT%H:%M:%SZ")
    return MemoryRecordSpec.model_validate(wire)


def decide(
    spec: MemoryRecordSpec,
    *,
    workspace: WorkspaceSpec | None = PAYMENTS,
    exists: bool = True,
    after: dt.timedelta = dt.timedelta(0),
) -> MemoryActivity:
    return decide_memory_status(
        record=spec,
        namespace="team",
        workspace=workspace,
        workspace_exists=exists,
        created_at=CREATED,
        now=CREATED + after,
        wait_limit=WAIT,
    )


def test_in_effect_when_the_workspace_exists() -> None:
    activity = decide(record(service="ledger"))
    assert (activity.active, activity.reason, activity.next_transition) == (True, Reason.IN_EFFECT, None)


def test_in_effect_until_expiry_which_is_the_next_transition() -> None:
    activity = decide(record(expires_in=dt.timedelta(hours=1)))
    assert (activity.active, activity.reason) == (True, Reason.IN_EFFECT)
    assert activity.next_transition == CREATED + dt.timedelta(hours=1)


def test_waits_for_a_workspace_that_does_not_exist_yet_until_the_deadline() -> None:
    activity = decide(record(), workspace=None, exists=False, after=dt.timedelta(minutes=3))
    assert (activity.active, activity.reason) == (False, Reason.WAITING_FOR_WORKSPACE)
    assert "workspace payments does not exist in team" in activity.message
    assert activity.next_transition == CREATED + WAIT


def test_the_earlier_of_expiry_and_deadline_is_the_next_transition() -> None:
    soon = decide(record(expires_in=dt.timedelta(minutes=2)), workspace=None, exists=False)
    assert soon.reason == Reason.WAITING_FOR_WORKSPACE
    assert soon.next_transition == CREATED + dt.timedelta(minutes=2)
    late = decide(record(expires_in=dt.timedelta(hours=2)), workspace=None, exists=False)
    assert late.next_transition == CREATED + WAIT


def test_workspace_not_found_after_the_deadline_with_expiry_still_ahead() -> None:
    activity = decide(record(expires_in=dt.timedelta(hours=2)), workspace=None, exists=False, after=WAIT)
    assert (activity.active, activity.reason) == (False, Reason.WORKSPACE_NOT_FOUND)
    assert activity.next_transition == CREATED + dt.timedelta(hours=2)
    never = decide(record(), workspace=None, exists=False, after=WAIT + dt.timedelta(days=1))
    assert (never.reason, never.next_transition) == (Reason.WORKSPACE_NOT_FOUND, None)


def test_expiry_wins_over_a_missing_workspace() -> None:
    activity = decide(record(expires_in=dt.timedelta(minutes=1)), workspace=None, exists=False, after=WAIT)
    assert (activity.active, activity.reason, activity.next_transition) == (False, Reason.EXPIRED, None)


def test_an_unreadable_workspace_is_not_found_at_once() -> None:
    activity = decide(record(), workspace=None, exists=True)
    assert (activity.active, activity.reason) == (False, Reason.WORKSPACE_NOT_FOUND)
    assert "invalid spec" in activity.message


@pytest.mark.parametrize("after", [dt.timedelta(0), WAIT * 3])
def test_a_service_the_workspace_does_not_have_is_refused_whenever(after: dt.timedelta) -> None:
    activity = decide(record(service="billing", expires_in=dt.timedelta(days=1)), after=after)
    assert (activity.active, activity.reason) == (False, Reason.SERVICE_NOT_IN_WORKSPACE)
    assert activity.next_transition == CREATED + dt.timedelta(days=1)


def test_a_late_workspace_turns_the_same_record_in_effect() -> None:
    spec = record(service="api")
    assert decide(spec, workspace=None, exists=False).reason == Reason.WAITING_FOR_WORKSPACE
    assert decide(spec, after=dt.timedelta(minutes=1)).reason == Reason.IN_EFFECT
    # Memory is never final: a Workspace that appears after the deadline still brings it into effect.
    assert decide(spec, workspace=None, exists=False, after=WAIT).reason == Reason.WORKSPACE_NOT_FOUND
    assert decide(spec, after=WAIT * 2).reason == Reason.IN_EFFECT

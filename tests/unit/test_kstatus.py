"""kstatus's view of each kind (``helmhive.policy.kstatus``), asked of kstatus itself.

Each case is a status as the operator (or a runner) writes it, before the derived conditions;
:func:`with_kstatus` adds them as every writer does, and the real kstatus library
(``sigs.k8s.io/cli-utils/pkg/kstatus/status``, the Go program in ``tests/harness/kstatus``) says
what Flux would see: InProgress, Current or Failed.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from harness.kstatus_tool import Kstatus, kstatus_binary
from helmhive.api.reasons import Reason
from helmhive.policy.kstatus import (
    DECIDERS,
    Progress,
    ProgressVerdict,
    build_kstatus_conditions,
    with_kstatus,
)

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(minutes=5)
EARLIER = "2026-12-06T11:00:00Z"


@pytest.fixture(scope="module")
def kstatus(tmp_path_factory: pytest.TempPathFactory) -> Kstatus:
    return kstatus_binary(tmp_path_factory)


def c(ctype: str, status: str, reason: str, message: str = "m") -> dict[str, Any]:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-12-06T11:00:00Z",
    }


def obj(kind: str, status: dict[str, Any] | None, *, generation: int = 1) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "team", "generation": generation},
    }
    if status is not None:
        body["status"] = status
    return body


def st(*conditions: str, **fields: Any) -> dict[str, Any]:
    """A status of ``Type=Status:Reason`` (or ``...|message``) conditions and other fields."""
    made = []
    for text in conditions:
        head, _, message = text.partition("|")
        ctype, _, rest = head.partition("=")
        status, _, reason = rest.partition(":")
        made.append(c(ctype, status, reason, message or "m"))
    return {"conditions": made, **fields} if made else dict(fields)


P, R, F, S = Progress.PROGRESSING, Progress.READY, Progress.FAILED, Progress.SUSPENDED
POOL_OK = ("Ready=True:Reconciled", "CredentialAvailable=True:CredentialFound")

# kind, case, the status as written (before the derived conditions), the Progress, what kstatus says
CASES: list[tuple[str, str, dict[str, Any], Progress, str]] = [
    ("AgentJob", "bound, not routed yet", {"profile": {"name": "p"}}, P, "InProgress"),
    (
        "AgentJob",
        "waiting for its profile",
        st("Routed=False:WaitingForProfile", "Ready=False:WaitingForProfile"),
        P,
        "InProgress",
    ),
    (
        "AgentJob",
        "waiting for capacity",
        st("Routed=False:WaitingForCapacity", "Ready=Unknown:WaitingForCapacity"),
        P,
        "InProgress",
    ),
    ("AgentJob", "assigned", st("Routed=True:Assigned", "Ready=Unknown:Assigned"), P, "InProgress"),
    ("AgentJob", "running", st("Running=True:Started", "Ready=Unknown:Started"), P, "InProgress"),
    ("AgentJob", "succeeded", st("Succeeded=True:Completed", "Ready=True:Completed"), R, "Current"),
    (
        "AgentJob",
        "failed closed at routing",
        st("Routed=False:NoEligibleRunner", "Ready=False:NoEligibleRunner"),
        F,
        "Failed",
    ),
    (
        "AgentJob",
        "failed closed at queue time",
        st("Routed=False:ProfileNotFound", "Ready=False:ProfileNotFound"),
        F,
        "Failed",
    ),
    ("AgentJob", "over its memory limit", st("Ready=False:ResourceLimitExceeded:memory"), F, "Failed"),
    ("AgentJob", "runner lost, re-run not decided", st("Ready=False:RunnerLost"), P, "InProgress"),
    (
        "AgentJob",
        "runner lost, not re-run",
        st("Ready=False:RunnerLost|gone; not re-run: it may have written"),
        F,
        "Failed",
    ),
    ("AgentJob", "re-queued", st("Routed=Unknown:RunnerLost"), P, "InProgress"),
    ("Change", "not started", {}, P, "InProgress"),
    ("Change", "a stage running", st("Planned=Unknown:StageRunning", "Ready=False:StageRunning"), P, "InProgress"),
    ("Change", "waiting for its workspace", st("Ready=False:WaitingForWorkspace"), P, "InProgress"),
    # No Reconciling for a plan awaiting a person; kstatus reads Ready=False as InProgress all the same.
    ("Change", "awaiting approval", st("Ready=False:AwaitingApproval"), S, "InProgress"),
    ("Change", "approved", st("Ready=True:ReviewApproved"), R, "Current"),
    ("Change", "checks failed", st("Ready=False:ChecksFailed"), F, "Failed"),
    ("Change", "invalid spec", st("Ready=False:InvalidSpec"), F, "Failed"),
    ("RunnerPool", "not reconciled yet", {}, P, "InProgress"),
    ("RunnerPool", "objects not applied yet", st("Ready=Unknown:Pending"), P, "InProgress"),
    ("RunnerPool", "runner pods starting", st(*POOL_OK, desiredReplicas=2, readyReplicas=1), P, "InProgress"),
    ("RunnerPool", "all runners Online", st(*POOL_OK, desiredReplicas=2, readyReplicas=2), R, "Current"),
    ("RunnerPool", "invalid spec", st("Ready=False:InvalidSpec"), F, "Failed"),
    ("RunnerPool", "objects refused", st("Ready=False:ApplyFailed"), F, "Failed"),
    (
        "RunnerPool",
        "credential not there yet",
        st("Ready=True:Reconciled", "CredentialAvailable=False:CredentialMissing"),
        P,
        "InProgress",
    ),
    ("RunnerPool", "warm pods starting", st(*POOL_OK, "WarmPodsReady=False:WarmPodsStarting"), P, "InProgress"),
    ("RunnerPool", "a warm pod failing", st(*POOL_OK, "WarmPodsReady=False:WarmPodFailing"), F, "Failed"),
    ("Runner", "registering", st("Schedulable=False:NeverReported"), P, "InProgress"),
    ("Runner", "no condition yet", {}, P, "InProgress"),
    ("Runner", "catching up with a rotated credential", st("Schedulable=False:CredentialRotated"), P, "InProgress"),
    ("Runner", "schedulable", st("Schedulable=True:Schedulable"), R, "Current"),
    ("Runner", "drained", st("Schedulable=False:Draining"), S, "Current"),
    ("Runner", "heartbeat stale", st("Schedulable=False:HeartbeatStale"), F, "Failed"),
    ("Runner", "login failed", st("Schedulable=False:Unauthenticated"), F, "Failed"),
    ("Runner", "revoked", st("Schedulable=False:Revoked"), F, "Failed"),
    ("Profile", "valid", st("Valid=True:Valid"), R, "Current"),
    ("Profile", "widens its envelope", st("Valid=False:ToolOutsideEnvelope"), F, "Failed"),
    ("MemoryRecord", "in effect", st("Active=True:InEffect"), R, "Current"),
    ("MemoryRecord", "waiting for its workspace", st("Active=False:WaitingForWorkspace"), P, "InProgress"),
    ("MemoryRecord", "expired", st("Active=False:Expired"), S, "Current"),
    ("MemoryRecord", "no such service", st("Active=False:ServiceNotInWorkspace"), F, "Failed"),
]
_IDS = [f"{kind}-{case}" for kind, case, *_ in CASES]


@pytest.mark.parametrize(("kind", "case", "status", "progress", "_seen"), CASES, ids=_IDS)
def test_each_kinds_state_reads_as_its_progress(
    kind: str, case: str, status: dict[str, Any], progress: Progress, _seen: str
) -> None:
    assert DECIDERS[kind](status).progress is progress, case


def test_every_kind_has_cases_for_progressing_ready_and_failed() -> None:
    for kind in DECIDERS:
        shown = {p for k, _, _, p, _ in CASES if k == kind}
        assert {Progress.READY, Progress.FAILED} <= shown, kind
        assert kind == "Profile" or Progress.PROGRESSING in shown, kind  # a profile is checked at once


def test_kstatus_tells_progressing_ready_and_failed_apart_for_every_case(kstatus: Kstatus) -> None:
    objects = [obj(kind, with_kstatus(kind, status, generation=1, now=NOW)) for kind, _, status, _, _ in CASES]
    seen = kstatus.compute(objects)
    assert [(i, r.status) for i, r in zip(_IDS, seen, strict=True)] == [
        (i, case[4]) for i, case in zip(_IDS, CASES, strict=True)
    ]
    # A Failed object carries the reason it failed for, which Flux prints.
    for (kind, case, status, progress, _), result in zip(CASES, seen, strict=True):
        if progress is Progress.FAILED:
            (stalled,) = result.conditions
            assert stalled["type"] == "Stalled" and stalled["reason"] == DECIDERS[kind](status).reason, case


def test_without_the_derived_conditions_kstatus_could_not_tell_a_failure_from_progress(kstatus: Kstatus) -> None:
    """What this module fixes: the same statuses without Reconciling/Stalled read InProgress or Current."""
    failed = [obj(k, s) for k, _, s, p, _ in CASES if p is Progress.FAILED]
    assert {r.status for r in kstatus.compute(failed)} <= {"InProgress", "Current"}


def test_a_generation_not_yet_observed_is_in_progress_whatever_the_conditions(kstatus: Kstatus) -> None:
    done = with_kstatus("Change", {"conditions": [c("Ready", "True", "ReviewApproved")]}, generation=1, now=NOW)
    assert kstatus.status(obj("Change", done, generation=1)) == "Current"
    assert kstatus.status(obj("Change", done, generation=2)) == "InProgress"


def test_an_object_the_operator_has_not_written_yet_reads_current(kstatus: Kstatus) -> None:
    """kstatus's own rule for a status-less custom resource, which docs/install.md names as a caveat."""
    assert kstatus.status(obj("AgentJob", None)) == "Current"


def test_the_conditions_are_rewritten_only_when_the_progress_changes() -> None:
    running = {"conditions": [c("Ready", "Unknown", "Started")]}
    first = with_kstatus("AgentJob", running, generation=1, now=NOW)
    again = build_kstatus_conditions(first["conditions"], verdict=DECIDERS["AgentJob"](first), generation=1, now=LATER)
    assert not again.changed and again.conditions == first["conditions"]
    kept = [cond for cond in first["conditions"] if cond["type"] != "Ready"]
    ended = {**first, "conditions": [*kept, c("Ready", "False", "AgentFailed")]}
    failed = with_kstatus("AgentJob", ended, generation=1, now=LATER)
    types = {cond["type"]: cond for cond in failed["conditions"]}
    assert "Reconciling" not in types, "the other condition is removed, not set False"
    assert types["Stalled"]["status"] == "True" and types["Stalled"]["lastTransitionTime"] == "2026-12-06T12:05:00Z"
    assert types["Stalled"]["observedGeneration"] == 1 and failed["observedGeneration"] == 1
    succeeded = with_kstatus("AgentJob", {"conditions": [c("Ready", "True", "Completed")]}, generation=1, now=LATER)
    assert {cond["type"] for cond in succeeded["conditions"]} == {"Ready"}


def test_a_verdict_always_has_a_named_reason() -> None:
    for kind, case, status, _, _ in CASES:
        verdict = DECIDERS[kind](status)
        assert isinstance(verdict, ProgressVerdict) and verdict.reason, case
        assert verdict.reason.split(":", 1)[0] in {r.value for r in Reason}, (case, verdict.reason)
